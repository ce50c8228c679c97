// The dpdk transport's frame format: Ethernet II + IPv4 (no options) + UDP + a 32-byte cofab
// frame header + payload. Internal to fabric/transport/dpdk (docs/DPDK.md has the byte layout).
//
// Messages (the 64-byte wire::Header plus payload) form a byte stream per connection that is cut
// into Data frames; Ack, Syn, SynAck, Fin and Rst frames carry the reliability protocol. Every
// frame carries a CRC32C over its cofab header and payload (the "payload checksum" that is always
// on) and a valid IPv4 header checksum; the UDP checksum is 0 (allowed for IPv4), because the
// CRC32C already covers what matters and is cheaper with SSE4.2.
//
// Pure functions on caller-owned bytes (no DPDK calls), so they are unit-tested without EAL.
// Multi-byte cofab fields are little-endian; Ethernet/IP/UDP fields are network order.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/status.h"
#include "fabric/wire/crc32c.h"

namespace cofab::transport::dpdk {

static_assert(std::endian::native == std::endian::little, "cofab dpdk frames assume x86/arm LE");

inline constexpr size_t kEthHeaderSize = 14;
inline constexpr size_t kIpv4HeaderSize = 20;
inline constexpr size_t kUdpHeaderSize = 8;
inline constexpr size_t kFrameHeaderSize = 32;
// Bytes in front of a frame's payload.
inline constexpr size_t kFrameOverhead =
    kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize + kFrameHeaderSize;
inline constexpr uint32_t kFrameMagic = 0x4B444643;  // "CFDK"
// 2: Syn and SynAck payloads start with the set-up address block (kSetUpAddressBytes).
inline constexpr uint8_t kFrameVersion = 2;
// Selective-ack bitmap carried by Ack frames (only while frames are held past a hole; an Ack
// without payload says nothing arrived past `ack`): bit i says seq ack+1+i has arrived. Also the
// reassembly window (conn.h): 1024 frames (1.4 MiB at MTU 1500) keep the sender going while a
// hole at 10% loss is repaired; 256 stalled it behind every hole (docs/DPDK.md).
inline constexpr size_t kSackBits = 1024;
inline constexpr size_t kSackBytes = kSackBits / 8;

enum class FrameKind : uint8_t {
  kData = 1,    // sequenced: message stream bytes
  kAck = 2,     // cumulative + selective ack and window; also the keepalive
  kSyn = 3,     // connect: payload = the connecting side's id
  kSynAck = 4,  // accept: payload = the accepting side's id
  kFin = 5,     // sequenced: the sender closed after everything before it
  kRst = 6,     // the connection (dstConn) does not exist or was torn down
};

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t version = kFrameVersion;
  FrameKind kind = FrameKind::kData;
  uint16_t length = 0;  // payload bytes after this header
  uint32_t dstConn = 0;
  uint32_t srcConn = 0;
  uint32_t seq = 0;
  uint32_t ack = 0;
  uint32_t window = 0;  // the receiver accepts seq < window (serial arithmetic)
  uint32_t crc = 0;     // CRC32C of this header (crc = 0) and the payload
};
static_assert(sizeof(FrameHeader) == kFrameHeaderSize);

using MacAddress = std::array<uint8_t, 6>;
// a == b in two loads per side: GCC calls memcmp for std::array<uint8_t, 6>'s operator==, once
// per received frame on the poller.
inline bool sameMac(const MacAddress& a, const MacAddress& b) {
  uint32_t a4;
  uint32_t b4;
  uint16_t a2;
  uint16_t b2;
  std::memcpy(&a4, a.data(), 4);
  std::memcpy(&b4, b.data(), 4);
  std::memcpy(&a2, a.data() + 4, 2);
  std::memcpy(&b2, b.data() + 4, 2);
  return ((a4 ^ b4) | static_cast<uint32_t>(a2 ^ b2)) == 0;
}

// One end of a path: what a listener's address names and what Syn frames carry back.
struct NetAddress {
  MacAddress mac{};
  uint32_t ip = 0;  // host order
  uint16_t port = 0;
  // "02:cf:ab:00:00:01/10.207.0.1:47001"
  std::string toString() const;
  friend bool operator==(const NetAddress&, const NetAddress&) = default;
};
// Parses toString()'s form; InvalidArgument saying the expected form otherwise.
StatusOr<NetAddress> parseNetAddress(std::string_view text);
std::string macToString(const MacAddress& mac);

// Why a received frame was not accepted. Counted per context, never logged per frame.
enum class RxVerdict : uint8_t {
  kOk,
  kForeign,      // not IPv4/UDP, or not addressed to this context's IP
  kBadLength,    // lengths in the IP/UDP/cofab headers disagree with the frame
  kBadChecksum,  // IPv4 header checksum or frame CRC32C wrong
  kBadHeader,    // cofab magic but another frame version, or an unknown kind
};

struct ParsedFrame {
  FrameHeader header;
  const uint8_t* payload = nullptr;
  NetAddress src;        // the sender's MAC, IP and UDP port
  uint16_t dstPort = 0;  // UDP destination port
  // CRC32C of the cofab header with its crc field 0: with header.crc (header then payload,
  // checked), it gives the payload's own CRC without reading it again (payloadCrcOf()).
  uint32_t headerCrc = 0;
  // False for a Data frame whose CRC parseFrame() left to its caller (checkFrameCrc or
  // checkFrameCrcCopy): nothing in `header` may be acted on before that check.
  bool crcChecked = true;
  // Where the payload was copied while its CRC was checked (checkFrameCrcCopy into the
  // receive it belongs to, dpdk::Conn::placeTarget), else null.
  uint8_t* placedAt = nullptr;
};

// Writes the Ethernet/IPv4/UDP/cofab headers for a frame of `header.length` payload bytes into
// `frame` (kFrameOverhead bytes) and returns where the payload goes. sealFrame() must run after
// the payload is in place.
uint8_t* writeFrameHeaders(uint8_t* frame, const NetAddress& src, const NetAddress& dst,
                           const FrameHeader& header);
// Computes the frame CRC32C over the cofab header and payload.
void sealFrame(uint8_t* frame);
// For a sender that checksums the payload while writing it (wire::crc32cCopy) instead of
// sealFrame(): the CRC32C of the cofab header in front of `payload` (crc field still 0) to
// extend over the payload, and where the result goes. Same bytes as sealFrame() in the end.
uint32_t frameCrcStart(const uint8_t* payload);
void setFrameCrc(uint8_t* payload, uint32_t crc);

// The headers of one connection's full-size Data frames, written once by writeFrameHeaders():
// such frames differ only in seq and the CRC, so a sender copies the 74 bytes and patches seq
// instead of rebuilding Ethernet/IPv4/UDP (and the IPv4 checksum) for every frame.
struct FrameTemplate {
  std::array<uint8_t, kFrameOverhead> bytes{};
  uint16_t length = 0;  // payload bytes the lengths and IPv4 checksum were written for; 0: unset
};
FrameTemplate makeFrameTemplate(const NetAddress& src, const NetAddress& dst,
                                const FrameHeader& header);
// Writes `t` with sequence number `seq` into `frame`; returns where the payload goes. The same
// bytes as writeFrameHeaders() with t's header and that seq; sealFrame() still follows.
uint8_t* stampFrame(uint8_t* frame, const FrameTemplate& t, uint32_t seq);
// frameCrcStart() of a frame stampFrame(frame, t, seq) wrote, from `t` and `seq` alone.
uint32_t frameCrcStart(const FrameTemplate& t, uint32_t seq);
inline size_t frameSize(const FrameHeader& h) { return kFrameOverhead + h.length; }

// Set-up frames (Syn, SynAck) start their payload with the addresses their headers carry: the
// sender's MAC, IPv4 address and UDP port and the destination UDP port, big-endian. The frame
// CRC covers them; nothing covers the Ethernet header and the UDP ports (UDP checksum 0), from
// which set-up takes the peer's address, so a bit flipped there would give a connection
// addressed to nobody. A set-up frame whose block and headers differ is dropped (kBadHeader).
inline constexpr size_t kSetUpAddressBytes = 14;
// Writes the block for a frame from `src` to UDP port `dstPort`; returns the byte after it.
uint8_t* writeSetUpAddresses(uint8_t* payload, const NetAddress& src, uint16_t dstPort);
// True when `f` (CRC checked) carries at least the block and it matches f's own headers.
bool setUpAddressesMatch(const ParsedFrame& f);

// Checks everything in `frame` against `localIp` (0: accept any destination IP). Data frames
// with `deferCrcFrom` payload bytes or more are returned kOk with everything but the frame CRC
// checked (out->crcChecked false): the caller checks it, if it can while copying the payload to
// where it belongs (the receiver's one pass over those bytes instead of two).
RxVerdict parseFrame(const uint8_t* frame, size_t size, uint32_t localIp, ParsedFrame* out,
                     size_t deferCrcFrom = SIZE_MAX);
// The frame CRC of a frame parseFrame() left unchecked; the second form also copies the payload
// to `dst` (header.length bytes) from the same loads, whether or not it matches.
inline bool checkFrameCrc(const ParsedFrame& f) {
  return wire::crc32c(f.headerCrc, f.payload, f.header.length) == f.header.crc;
}
inline bool checkFrameCrcCopy(const ParsedFrame& f, uint8_t* dst) {
  return wire::crc32cCopy(f.headerCrc, dst, f.payload, f.header.length) == f.header.crc;
}

// crc32c(0, payload) of a checked frame from its frame CRC and header CRC, without reading the
// payload: frameCrc = shift(headerCrc over length zero bytes) ^ crc32c(0, payload). For one
// fixed length (a full frame's): wire::crc32cCombine keeps a table per length.
inline uint32_t payloadCrcOf(uint32_t frameCrc, uint32_t headerCrc, size_t length) {
  return frameCrc ^ wire::crc32cCombine(headerCrc, 0, length);
}

}  // namespace cofab::transport::dpdk

#include "fabric/transport/dpdk/frame.h"

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "fabric/wire/crc32c.h"

namespace cofab::transport::dpdk {
namespace {

constexpr uint16_t kEtherTypeIpv4 = 0x0800;
constexpr uint8_t kIpProtoUdp = 17;
constexpr uint8_t kIpTtl = 64;

void put16be(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put32be(uint8_t* p, uint32_t v) {
  put16be(p, static_cast<uint16_t>(v >> 16));
  put16be(p + 2, static_cast<uint16_t>(v));
}
uint16_t get16be(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t get32be(const uint8_t* p) {
  return (static_cast<uint32_t>(get16be(p)) << 16) | get16be(p + 2);
}

// RFC 791 header checksum: ones' complement of the ones' complement sum of the 16-bit words.
// Summed as five native 32-bit words and folded (RFC 1071: the sum may be taken in wider words
// and in either byte order, then folded and swapped): five loads instead of ten on every frame.
uint16_t ipv4Checksum(const uint8_t* ip) {
  static_assert(kIpv4HeaderSize == 20);
  uint64_t sum = 0;
  for (size_t i = 0; i < kIpv4HeaderSize; i += 4) {
    uint32_t w;
    std::memcpy(&w, ip + i, 4);
    sum += w;
  }
  sum = (sum & 0xFFFFFFFF) + (sum >> 32);
  sum = (sum & 0xFFFF) + (sum >> 16);
  sum = (sum & 0xFFFF) + (sum >> 16);
  sum = (sum & 0xFFFF) + (sum >> 16);
  const auto native = static_cast<uint16_t>(~sum);
  // The sum of little-endian words is the big-endian sum byte-swapped.
  return static_cast<uint16_t>((native >> 8) | (native << 8));
}

// The header as four little-endian words: seq is the low half of word 2, crc the high half of
// word 3 (the masks below rely on it).
static_assert(offsetof(FrameHeader, seq) == 16 && offsetof(FrameHeader, crc) == 28);
constexpr uint64_t kLowHalf = 0xFFFFFFFFull;

// CRC32C of the cofab header at `fh` with its crc field taken as 0, from its words (no copy of
// the header with the field cleared: see crc32cOfWords).
uint32_t headerCrc(const uint8_t* fh) {
  uint64_t w[4];
  std::memcpy(w, fh, sizeof(w));
  return wire::crc32cOfWords(w[0], w[1], w[2], w[3] & kLowHalf);
}

uint32_t frameCrc(const uint8_t* fh, size_t payloadLen) {
  return wire::crc32c(headerCrc(fh), fh + kFrameHeaderSize, payloadLen);
}

}  // namespace

std::string macToString(const MacAddress& mac) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
                mac[4], mac[5]);
  return buf;
}

std::string NetAddress::toString() const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s/%u.%u.%u.%u:%u", macToString(mac).c_str(), ip >> 24,
                (ip >> 16) & 0xFF, (ip >> 8) & 0xFF, ip & 0xFF, port);
  return buf;
}

StatusOr<NetAddress> parseNetAddress(std::string_view text) {
  const Status bad = InvalidArgument("'" + std::string(text) +
                                     "' is not a dpdk address (expected "
                                     "'<mac>/<ipv4>:<udp port>', e.g. "
                                     "'02:cf:ab:00:00:01/10.207.0.1:47001')");
  const std::string s(text);
  unsigned m[6];
  unsigned a, b, c, d, port;
  char tail;
  if (std::sscanf(s.c_str(), "%2x:%2x:%2x:%2x:%2x:%2x/%u.%u.%u.%u:%u%c", &m[0], &m[1], &m[2], &m[3],
                  &m[4], &m[5], &a, &b, &c, &d, &port, &tail) != 11) {
    return bad;
  }
  if (a > 255 || b > 255 || c > 255 || d > 255 || port == 0 || port > 65535) return bad;
  NetAddress out;
  for (int i = 0; i < 6; ++i) out.mac[i] = static_cast<uint8_t>(m[i]);
  out.ip = (a << 24) | (b << 16) | (c << 8) | d;
  out.port = static_cast<uint16_t>(port);
  return out;
}

uint8_t* writeSetUpAddresses(uint8_t* p, const NetAddress& src, uint16_t dstPort) {
  std::memcpy(p, src.mac.data(), 6);
  put32be(p + 6, src.ip);
  put16be(p + 10, src.port);
  put16be(p + 12, dstPort);
  return p + kSetUpAddressBytes;
}

bool setUpAddressesMatch(const ParsedFrame& f) {
  if (f.header.length < kSetUpAddressBytes) return false;
  const uint8_t* p = f.payload;
  return std::memcmp(p, f.src.mac.data(), 6) == 0 && get32be(p + 6) == f.src.ip &&
         get16be(p + 10) == f.src.port && get16be(p + 12) == f.dstPort;
}

uint8_t* writeFrameHeaders(uint8_t* f, const NetAddress& src, const NetAddress& dst,
                           const FrameHeader& header) {
  std::memcpy(f, dst.mac.data(), 6);
  std::memcpy(f + 6, src.mac.data(), 6);
  put16be(f + 12, kEtherTypeIpv4);
  uint8_t* ip = f + kEthHeaderSize;
  const size_t udpLen = kUdpHeaderSize + kFrameHeaderSize + header.length;
  ip[0] = 0x45;  // version 4, 5 words
  ip[1] = 0;
  put16be(ip + 2, static_cast<uint16_t>(kIpv4HeaderSize + udpLen));
  put16be(ip + 4, 0);       // id: frames are never fragmented
  put16be(ip + 6, 0x4000);  // DF
  ip[8] = kIpTtl;
  ip[9] = kIpProtoUdp;
  put16be(ip + 10, 0);
  put32be(ip + 12, src.ip);
  put32be(ip + 16, dst.ip);
  put16be(ip + 10, ipv4Checksum(ip));
  uint8_t* udp = ip + kIpv4HeaderSize;
  put16be(udp, src.port);
  put16be(udp + 2, dst.port);
  put16be(udp + 4, static_cast<uint16_t>(udpLen));
  put16be(udp + 6, 0);
  uint8_t* fh = udp + kUdpHeaderSize;
  std::memcpy(fh, &header, sizeof(header));
  return fh + kFrameHeaderSize;
}

FrameTemplate makeFrameTemplate(const NetAddress& src, const NetAddress& dst,
                                const FrameHeader& header) {
  FrameTemplate t;
  FrameHeader h = header;
  h.seq = 0;
  h.crc = 0;
  writeFrameHeaders(t.bytes.data(), src, dst, h);
  t.length = header.length;
  return t;
}

uint8_t* stampFrame(uint8_t* frame, const FrameTemplate& t, uint32_t seq) {
  std::memcpy(frame, t.bytes.data(), kFrameOverhead);
  uint8_t* fh = frame + kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize;
  std::memcpy(fh + offsetof(FrameHeader, seq), &seq, sizeof(seq));
  return frame + kFrameOverhead;
}

uint32_t frameCrcStart(const uint8_t* payload) { return headerCrc(payload - kFrameHeaderSize); }

uint32_t frameCrcStart(const FrameTemplate& t, uint32_t seq) {
  // From the template (written once, long ago) and seq in a register: the stamped frame's
  // header is not read back right after stampFrame() wrote it.
  uint64_t w[4];
  std::memcpy(w, t.bytes.data() + kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize, sizeof(w));
  return wire::crc32cOfWords(w[0], w[1], (w[2] & ~kLowHalf) | seq, w[3] & kLowHalf);
}

void setFrameCrc(uint8_t* payload, uint32_t crc) {
  std::memcpy(payload - kFrameHeaderSize + offsetof(FrameHeader, crc), &crc, sizeof(crc));
}

void sealFrame(uint8_t* frame) {
  uint8_t* fh = frame + kEthHeaderSize + kIpv4HeaderSize + kUdpHeaderSize;
  FrameHeader h;
  std::memcpy(&h, fh, sizeof(h));
  h.crc = frameCrc(fh, h.length);
  std::memcpy(fh + offsetof(FrameHeader, crc), &h.crc, sizeof(h.crc));
}

RxVerdict parseFrame(const uint8_t* f, size_t size, uint32_t localIp, ParsedFrame* out,
                     size_t deferCrcFrom) {
  if (size < kEthHeaderSize) return RxVerdict::kBadLength;
  if (get16be(f + 12) != kEtherTypeIpv4) return RxVerdict::kForeign;
  if (size < kEthHeaderSize + kIpv4HeaderSize) return RxVerdict::kBadLength;
  const uint8_t* ip = f + kEthHeaderSize;
  if (ip[0] != 0x45) return RxVerdict::kForeign;  // not IPv4, or options we never send
  if (ip[9] != kIpProtoUdp) return RxVerdict::kForeign;
  const uint32_t dstIp = get32be(ip + 16);
  if (localIp != 0 && dstIp != localIp) return RxVerdict::kForeign;
  const size_t ipLen = get16be(ip + 2);
  // The Ethernet minimum frame (60 bytes) may pad short packets, so only "too short" is bad.
  if (ipLen < kIpv4HeaderSize + kUdpHeaderSize || kEthHeaderSize + ipLen > size) {
    return RxVerdict::kBadLength;
  }
  if (ipv4Checksum(ip) != 0) return RxVerdict::kBadChecksum;
  const uint8_t* udp = ip + kIpv4HeaderSize;
  const size_t udpLen = get16be(udp + 4);
  if (udpLen != ipLen - kIpv4HeaderSize) return RxVerdict::kBadLength;
  if (udpLen < kUdpHeaderSize + kFrameHeaderSize) return RxVerdict::kForeign;
  const uint8_t* fh = udp + kUdpHeaderSize;
  FrameHeader h;
  std::memcpy(&h, fh, sizeof(h));
  if (h.magic != kFrameMagic) return RxVerdict::kForeign;
  if (h.version != kFrameVersion) return RxVerdict::kBadHeader;  // another cofab's frames
  if (udpLen != kUdpHeaderSize + kFrameHeaderSize + h.length) return RxVerdict::kBadLength;
  if (h.kind < FrameKind::kData || h.kind > FrameKind::kRst) return RxVerdict::kBadHeader;
  out->headerCrc = headerCrc(fh);
  out->header = h;
  out->payload = fh + kFrameHeaderSize;
  out->placedAt = nullptr;
  out->crcChecked = !(h.kind == FrameKind::kData && h.length >= deferCrcFrom);
  if (out->crcChecked && !checkFrameCrc(*out)) return RxVerdict::kBadChecksum;
  std::memcpy(out->src.mac.data(), f + 6, 6);
  out->src.ip = get32be(ip + 12);
  out->src.port = get16be(udp);
  out->dstPort = get16be(udp + 2);
  return RxVerdict::kOk;
}

}  // namespace cofab::transport::dpdk

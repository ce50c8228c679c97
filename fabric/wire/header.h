// The cofab message header: the fixed 64-byte prefix of every message that any transport
// (tcp, loopback, dpdk, rdma) or the aggregator puts on the wire. Byte layout: docs/WIRE.md.
//
// A message is this header followed by `payloadLength` payload bytes. encodeHeader() fills the
// magic, version and header CRC32C; decodeHeader() trusts nothing it reads: every field is
// checked and a bad one is a Status naming the field and the value seen (DataLoss for bytes that
// cannot be a valid cofab header, InvalidArgument for a well-formed header this build rejects).
// Pure functions on caller-owned memory; callable from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace cofab::wire {

inline constexpr uint32_t kMagic = 0x42414643;  // "CFAB" as little-endian bytes 43 46 41 42
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 64;

// What a message is for. Values are wire format: append, never renumber.
enum class MessageType : uint8_t {
  kData = 1,       // a payload for the layer above (collectives, point-to-point)
  kControl = 2,    // small control payload (barriers, acks, desync checks)
  kHello = 3,      // transport handshake: the connecting side's id
  kHelloAck = 4,   // transport handshake: the accepting side's id
  kPush = 5,       // aggregator: a worker pushes a gradient chunk
  kPull = 6,       // aggregator: a worker asks for the aggregated chunk
  kPullReply = 7,  // aggregator: the aggregated chunk
  kGoodbye = 8,    // orderly shutdown of a connection
};
inline constexpr uint8_t kMaxMessageType = 8;

std::string_view messageTypeName(MessageType type);

// Flag bits. Unknown bits are rejected by the decoder (a newer peer asking for something this
// build cannot honour must fail loudly, not be misread).
enum HeaderFlags : uint16_t {
  kFlagPayloadCrc = 1u << 0,  // payloadCrc holds CRC32C of the payload; the receiver verifies it
  kFlagLastChunk = 1u << 1,   // informational: last chunk of a chunked transfer
};
inline constexpr uint16_t kKnownFlags = kFlagPayloadCrc | kFlagLastChunk;

// Default bound on payloadLength accepted by decoders (1 GiB): larger lengths from a peer are
// rejected before anything is allocated or read.
inline constexpr uint64_t kDefaultMaxPayload = 1ull << 30;

struct Header {
  MessageType type = MessageType::kData;
  uint16_t flags = 0;
  uint32_t senderRank = 0;
  uint32_t chunkIndex = 0;   // < chunkCount when chunkCount > 0
  uint32_t chunkCount = 0;   // 0: not chunked
  DType dtype = DType::kU8;  // element type of the payload (u8: raw bytes)
  uint8_t opcode = 0;        // meaning defined by the layer above (e.g. which collective)
  uint64_t key = 0;          // what the payload belongs to (tensor / gradient key)
  uint64_t sequence = 0;     // per-connection or per-collective sequence number
  uint64_t iteration = 0;    // training iteration / model version
  uint64_t payloadLength = 0;
  uint32_t payloadCrc = 0;   // meaningful only with kFlagPayloadCrc

  bool hasPayloadCrc() const { return (flags & kFlagPayloadCrc) != 0; }
  // "Data key=7 seq=3 chunk=1/4 from rank 2, 4096 bytes f32" for error messages.
  std::string describe() const;
  friend bool operator==(const Header&, const Header&) = default;
};

using EncodedHeader = std::array<uint8_t, kHeaderSize>;

struct DecodeOptions {
  uint64_t maxPayload = kDefaultMaxPayload;
};

// Writes `header` into `out` (kHeaderSize bytes), computing the header CRC32C. The fields are
// written as given; validateHeader() first if they come from untrusted code.
void encodeHeader(const Header& header, uint8_t* out);
inline EncodedHeader encodeHeader(const Header& header) {
  EncodedHeader out;
  encodeHeader(header, out.data());
  return out;
}

// Parses and checks `bytes`: size, magic, version, header CRC, type, flags, dtype, reserved
// bytes, chunk index/count and payload length against options.maxPayload.
StatusOr<Header> decodeHeader(std::span<const uint8_t> bytes, const DecodeOptions& options = {});

// The checks decodeHeader() applies to the fields, for senders that want to fail before sending.
Status validateHeader(const Header& header, const DecodeOptions& options = {});

}  // namespace cofab::wire

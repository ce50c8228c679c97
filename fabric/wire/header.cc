#include "fabric/wire/header.h"

#include <bit>
#include <cstring>
#include <sstream>

#include "fabric/wire/crc32c.h"

namespace cofab::wire {
namespace {

static_assert(std::endian::native == std::endian::little,
              "cofab's wire codec assumes a little-endian host (it memcpy's fields)");

// Byte offsets (docs/WIRE.md).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffType = 5;
constexpr size_t kOffFlags = 6;
constexpr size_t kOffSender = 8;
constexpr size_t kOffChunkIndex = 12;
constexpr size_t kOffChunkCount = 16;
constexpr size_t kOffDType = 20;
constexpr size_t kOffOpcode = 21;
constexpr size_t kOffReserved = 22;
constexpr size_t kOffKey = 24;
constexpr size_t kOffSequence = 32;
constexpr size_t kOffIteration = 40;
constexpr size_t kOffPayloadLength = 48;
constexpr size_t kOffPayloadCrc = 56;
constexpr size_t kOffHeaderCrc = 60;
static_assert(kOffHeaderCrc + 4 == kHeaderSize);

template <typename T>
void put(uint8_t* out, size_t off, T v) {
  std::memcpy(out + off, &v, sizeof(T));
}
template <typename T>
T get(const uint8_t* in, size_t off) {
  T v;
  std::memcpy(&v, in + off, sizeof(T));
  return v;
}

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

std::string_view messageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kData: return "Data";
    case MessageType::kControl: return "Control";
    case MessageType::kHello: return "Hello";
    case MessageType::kHelloAck: return "HelloAck";
    case MessageType::kPush: return "Push";
    case MessageType::kPull: return "Pull";
    case MessageType::kPullReply: return "PullReply";
    case MessageType::kGoodbye: return "Goodbye";
  }
  return "Unknown";
}

std::string Header::describe() const {
  std::ostringstream os;
  os << messageTypeName(type) << " key=" << key << " seq=" << sequence;
  if (chunkCount > 0) os << " chunk=" << chunkIndex << "/" << chunkCount;
  os << " iter=" << iteration << " op=" << static_cast<int>(opcode) << " from rank " << senderRank
     << ", " << payloadLength << " bytes " << (isValidDType(static_cast<uint8_t>(dtype))
                                                    ? dtypeName(dtype)
                                                    : std::string_view("?"));
  return os.str();
}

void encodeHeader(const Header& h, uint8_t* out) {
  put<uint32_t>(out, kOffMagic, kMagic);
  put<uint8_t>(out, kOffVersion, kVersion);
  put<uint8_t>(out, kOffType, static_cast<uint8_t>(h.type));
  put<uint16_t>(out, kOffFlags, h.flags);
  put<uint32_t>(out, kOffSender, h.senderRank);
  put<uint32_t>(out, kOffChunkIndex, h.chunkIndex);
  put<uint32_t>(out, kOffChunkCount, h.chunkCount);
  put<uint8_t>(out, kOffDType, static_cast<uint8_t>(h.dtype));
  put<uint8_t>(out, kOffOpcode, h.opcode);
  put<uint16_t>(out, kOffReserved, 0);
  put<uint64_t>(out, kOffKey, h.key);
  put<uint64_t>(out, kOffSequence, h.sequence);
  put<uint64_t>(out, kOffIteration, h.iteration);
  put<uint64_t>(out, kOffPayloadLength, h.payloadLength);
  put<uint32_t>(out, kOffPayloadCrc, h.hasPayloadCrc() ? h.payloadCrc : 0);
  put<uint32_t>(out, kOffHeaderCrc, crc32c(0, out, kOffHeaderCrc));
}

Status validateHeader(const Header& h, const DecodeOptions& options) {
  const auto type = static_cast<uint8_t>(h.type);
  if (type == 0 || type > kMaxMessageType) {
    return InvalidArgument("wire header: unknown message type " + std::to_string(type) +
                           " (this build knows 1.." + std::to_string(kMaxMessageType) + ")");
  }
  if ((h.flags & ~kKnownFlags) != 0) {
    return InvalidArgument("wire header: unknown flag bits " + hex(h.flags & ~kKnownFlags) +
                           " (a newer peer? known flags " + hex(kKnownFlags) + ")");
  }
  if (!isValidDType(static_cast<uint8_t>(h.dtype))) {
    return InvalidArgument("wire header: invalid dtype " +
                           std::to_string(static_cast<int>(h.dtype)));
  }
  if (h.chunkCount > 0 && h.chunkIndex >= h.chunkCount) {
    return InvalidArgument("wire header: chunk index " + std::to_string(h.chunkIndex) +
                           " is not below chunk count " + std::to_string(h.chunkCount));
  }
  if (h.chunkCount == 0 && h.chunkIndex != 0) {
    return InvalidArgument("wire header: chunk index " + std::to_string(h.chunkIndex) +
                           " on an unchunked message (chunk count 0)");
  }
  if (h.payloadLength > options.maxPayload) {
    return InvalidArgument("wire header: payload length " + std::to_string(h.payloadLength) +
                           " exceeds the configured maximum " +
                           std::to_string(options.maxPayload) + " bytes (" + h.describe() + ")");
  }
  const size_t elem = dtypeSize(h.dtype);
  if (h.payloadLength % elem != 0) {
    return InvalidArgument("wire header: payload length " + std::to_string(h.payloadLength) +
                           " is not a multiple of the " + std::string(dtypeName(h.dtype)) +
                           " element size " + std::to_string(elem));
  }
  return OkStatus();
}

StatusOr<Header> decodeHeader(std::span<const uint8_t> bytes, const DecodeOptions& options) {
  if (bytes.size() < kHeaderSize) {
    return InvalidArgument("wire header: need " + std::to_string(kHeaderSize) + " bytes, got " +
                           std::to_string(bytes.size()));
  }
  const uint8_t* in = bytes.data();
  const auto magic = get<uint32_t>(in, kOffMagic);
  if (magic != kMagic) {
    return DataLoss("wire header: bad magic " + hex(magic) + " (expected " + hex(kMagic) +
                    "): the peer is not speaking cofab, or the stream lost framing");
  }
  const auto version = get<uint8_t>(in, kOffVersion);
  if (version != kVersion) {
    return InvalidArgument("wire header: unsupported version " + std::to_string(version) +
                           " (this build speaks version " + std::to_string(kVersion) +
                           "): run the same cofab version on every rank");
  }
  const auto sent = get<uint32_t>(in, kOffHeaderCrc);
  const uint32_t computed = crc32c(0, in, kOffHeaderCrc);
  if (sent != computed) {
    return DataLoss("wire header: header CRC32C mismatch (header says " + hex(sent) +
                    ", bytes give " + hex(computed) + "): corrupted in transit");
  }
  if (get<uint16_t>(in, kOffReserved) != 0) {
    return InvalidArgument("wire header: reserved bytes 22..23 are not zero");
  }
  Header h;
  h.type = static_cast<MessageType>(get<uint8_t>(in, kOffType));
  h.flags = get<uint16_t>(in, kOffFlags);
  h.senderRank = get<uint32_t>(in, kOffSender);
  h.chunkIndex = get<uint32_t>(in, kOffChunkIndex);
  h.chunkCount = get<uint32_t>(in, kOffChunkCount);
  h.dtype = static_cast<DType>(get<uint8_t>(in, kOffDType));
  h.opcode = get<uint8_t>(in, kOffOpcode);
  h.key = get<uint64_t>(in, kOffKey);
  h.sequence = get<uint64_t>(in, kOffSequence);
  h.iteration = get<uint64_t>(in, kOffIteration);
  h.payloadLength = get<uint64_t>(in, kOffPayloadLength);
  h.payloadCrc = get<uint32_t>(in, kOffPayloadCrc);
  if (!h.hasPayloadCrc() && h.payloadCrc != 0) {
    return InvalidArgument("wire header: payload CRC field is set but the payload-CRC flag is not");
  }
  COFAB_RETURN_IF_ERROR(validateHeader(h, options));
  return h;
}

}  // namespace cofab::wire

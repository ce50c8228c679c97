#include "fabric/rendezvous/tcp_store_protocol.h"

#include <cstring>

namespace cofab::store_proto {

void Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void Writer::i64(int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

void Writer::bytes(const void* data, size_t len) {
  u32(static_cast<uint32_t>(len));
  const auto* p = static_cast<const uint8_t*>(data);
  buf_.insert(buf_.end(), p, p + len);
}

Bytes Writer::frame(uint32_t magic) const {
  Writer head;
  head.u32(magic);
  head.u32(static_cast<uint32_t>(buf_.size()));
  Bytes out = std::move(head.buf_);
  out.insert(out.end(), buf_.begin(), buf_.end());
  return out;
}

Status Reader::truncated() const { return InvalidArgument("store protocol: truncated field"); }

StatusOr<uint8_t> Reader::u8() {
  if (end_ - p_ < 1) return truncated();
  return *p_++;
}

StatusOr<uint32_t> Reader::u32() {
  if (end_ - p_ < 4) return truncated();
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p_[i]) << (8 * i);
  p_ += 4;
  return v;
}

StatusOr<int64_t> Reader::i64() {
  if (end_ - p_ < 8) return truncated();
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
  p_ += 8;
  return static_cast<int64_t>(v);
}

StatusOr<Bytes> Reader::blob() {
  COFAB_ASSIGN_OR_RETURN(uint32_t len, u32());
  if (static_cast<size_t>(end_ - p_) < len) return truncated();
  Bytes out(p_, p_ + len);
  p_ += len;
  return out;
}

StatusOr<std::string> Reader::str() {
  COFAB_ASSIGN_OR_RETURN(Bytes b, blob());
  return std::string(b.begin(), b.end());
}

StatusOr<uint32_t> parseFrameHeader(const uint8_t header[kFrameHeaderBytes], uint32_t magic) {
  Reader r(header, kFrameHeaderBytes);
  uint32_t got = *r.u32();
  uint32_t len = *r.u32();
  if (got != magic) {
    return InvalidArgument("store protocol: bad magic 0x" + [&] {
      char buf[16];
      snprintf(buf, sizeof(buf), "%08x", got);
      return std::string(buf);
    }() + " (not a cofab store peer?)");
  }
  if (len > kMaxBodyBytes) {
    return InvalidArgument("store protocol: frame of " + std::to_string(len) +
                           " bytes exceeds the limit of " + std::to_string(kMaxBodyBytes));
  }
  return len;
}

}  // namespace cofab::store_proto

// The TcpStore request/response framing, shared by client and server. Documented in
// docs/STORE.md.
//
//   frame    := magic:u32 ('CFST' requests, 'CFSR' responses) body_len:u32 body
//   request  := op:u8 fields...        response := status:u8 fields...
//   string   := len:u32 bytes          (all integers little-endian)
//
// Decoding trusts nothing: a body longer than kMaxBodyBytes, an unknown op, a truncated field or
// trailing bytes is a protocol error, and the server closes that connection.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "fabric/rendezvous/store.h"

namespace cofab::store_proto {

inline constexpr uint32_t kRequestMagic = 0x54534643;   // "CFST"
inline constexpr uint32_t kResponseMagic = 0x52534643;  // "CFSR"
inline constexpr size_t kFrameHeaderBytes = 8;
// The largest value plus two keys and framing.
inline constexpr size_t kMaxBodyBytes = 2 * kMaxStoreValueBytes + 4 * kMaxStoreKeyBytes + 64;
inline constexpr uint32_t kMaxWaitKeys = 65536;

enum class Op : uint8_t {
  kSet = 1,         // key, value
  kGet = 2,         // key, timeout_ms:u32 -> value
  kAdd = 3,         // key, delta:i64 -> i64
  kWait = 4,        // n:u32 keys..., timeout_ms:u32
  kCompareSet = 5,  // key, expected, desired -> value
  kRemove = 6,      // key -> u8 existed
  kCheck = 7,       // n:u32 keys... -> u8 all_present
};

enum class Reply : uint8_t {
  kOk = 0,       // followed by the op's result fields
  kTimeout = 1,  // followed by missing-keys count and keys
  kError = 2,    // followed by code:u8, message string
};

// Appends little-endian fields to a body.
class Writer {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u32(uint32_t v);
  void i64(int64_t v);
  void bytes(const void* data, size_t len);
  void str(std::string_view s) { bytes(s.data(), s.size()); }
  void blob(const Bytes& b) { bytes(b.data(), b.size()); }
  // The framed message: magic, length, body.
  Bytes frame(uint32_t magic) const;
  size_t size() const { return buf_.size(); }

 private:
  Bytes buf_;
};

// Reads fields from a body; every read checks bounds.
class Reader {
 public:
  Reader(const uint8_t* data, size_t len) : p_(data), end_(data + len) {}
  StatusOr<uint8_t> u8();
  StatusOr<uint32_t> u32();
  StatusOr<int64_t> i64();
  StatusOr<std::string> str();
  StatusOr<Bytes> blob();
  bool done() const { return p_ == end_; }

 private:
  Status truncated() const;
  const uint8_t* p_;
  const uint8_t* end_;
};

// Validates a frame header; returns the body length.
StatusOr<uint32_t> parseFrameHeader(const uint8_t header[kFrameHeaderBytes], uint32_t magic);

}  // namespace cofab::store_proto

// Gradient compression codecs for the push-pull path (issue 9 part 6): 8-bit min-max per block
// and 1-bit sign with a per-block scale and error feedback. Pure functions on caller-owned
// memory plus ErrorFeedback, the per-key residual store a compressor's owner keeps; any thread
// (an ErrorFeedback is not thread-safe: its owner serialises access, e.g. under its own lock).
//
// Encoded format (little-endian, docs/COMPRESSION.md), for `count` f32 elements in blocks of
// `block` elements (the last block shorter):
//   u32 count, u32 block, then per block:
//     kInt8:   f32 min, f32 scale, then n bytes q      (x' = min + q * scale, q in 0..255)
//     kOneBit: f32 scale, then ceil(n / 8) bytes of sign bits, bit j%8 (least significant first) of byte j/8 = x_j >= 0
//              (x' = +scale or -scale; scale = mean |x| over the block)
//   A block with an Inf or NaN has NaN parameters (min and scale, or scale) and zero bytes.
//   then zero padding to a multiple of 4 bytes (the wire header's f32 element size).
// The size is a function of (codec, count, block) only, so a receiver checks it exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace cofab::compress {

enum class Compression : uint8_t {
  kNone = 0,
  kInt8 = 1,    // 8-bit min-max per block: |error| <= scale / 2 per element
  kOneBit = 2,  // sign + per-block mean |x|, with error feedback (residual carried over)
};

inline constexpr size_t kDefaultBlock = 256;
inline constexpr size_t kMaxBlock = 1u << 20;
inline constexpr size_t kPrefixBytes = 8;

std::string_view compressionName(Compression c);  // "none", "int8", "onebit"

// Bytes of the encoding of `count` elements in blocks of `block` (kNone: 4 * count).
size_t compressedBytes(Compression c, size_t count, size_t block);

// Encodes `count` floats of `in` into `out` (compressedBytes(c, count, block) bytes); count > 0
// (inspect() refuses a zero-element encoding, so none is ever made).
// `residual` (count floats, or null for none) is the error feedback: it is added to the input
// before encoding and replaced by (input + old residual - decoded). c must be kInt8 or kOneBit.
//
// Non-finite values (docs/COMPRESSION.md): a block in which input + residual holds an Inf or a
// NaN (an fp16 loss-scaling overflow, say) is encoded with NaN parameters, so that every element
// of the block decodes to NaN (the overflow stays visible to whoever checks the result), and its
// residual is reset to 0 (never carried into later encodings: the next finite input encodes as
// if the block had no history). Returns the number of such blocks. A finite block never becomes
// NaN or Inf: int8 values decode to at most FLT_MAX, a block whose range exceeds 255 * 2^120
// (about FLT_MAX) saturates at min + 255 * 2^120 and its residual at +-FLT_MAX, and a 1-bit block
// whose sum of |x| overflows still gets its mean |x|.
size_t compress(Compression c, const float* in, size_t count, size_t block, float* residual,
                uint8_t* out);

// What an encoded buffer says about itself; InvalidArgument if `bytes` is not exactly the size
// its prefix implies (or the prefix is impossible), naming what was wrong.
struct EncodedInfo {
  size_t count = 0;
  size_t block = 0;
};
StatusOr<EncodedInfo> inspect(Compression c, const uint8_t* in, size_t bytes);

// Decodes into `out` (`expectedCount` floats). InvalidArgument on a wrong size or count.
Status decompress(Compression c, const uint8_t* in, size_t bytes, size_t expectedCount, float* out);

// Per-key residuals for error feedback, owned by whoever compresses a stream of tensors.
class ErrorFeedback {
 public:
  // The residual of `key` resized (zero-filled) to `count` floats.
  float* residual(uint64_t key, size_t count);
  void clear() { residuals_.clear(); }

 private:
  std::unordered_map<uint64_t, std::vector<float>> residuals_;
};

}  // namespace cofab::compress

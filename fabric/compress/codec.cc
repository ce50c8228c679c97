#include "fabric/compress/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace cofab::compress {

namespace {

size_t blockBytes(Compression c, size_t n) {
  return c == Compression::kInt8 ? 8 + n : 4 + (n + 7) / 8;
}

template <typename T>
void put(uint8_t*& p, T v) {
  std::memcpy(p, &v, sizeof(T));
  p += sizeof(T);
}
template <typename T>
T get(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

// A block that holds an Inf or a NaN (after adding the residual) is encoded as an invalid
// block: its parameters are quiet NaNs, so every element decodes to NaN (docs/COMPRESSION.md,
// "Non-finite values"), and compress() resets that block's residual to 0.
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// int8 scales are kept in [FLT_MIN, 2^120] when the block is not constant: 1 / scale stays finite
// (a subnormal scale's inverse overflows) and min + 255 * scale stays finite (255 * 2^120 <
// FLT_MAX); a block whose range exceeds 255 * 2^120 saturates at min + 255 * 2^120.
constexpr float kMinInt8Scale = std::numeric_limits<float>::min();
constexpr float kMaxInt8Scale = 0x1p120f;

// An int8 element's value: lo + q * scale, at most FLT_MAX. With the block's max at or just below
// FLT_MAX, lo + 255 * scale can round past it to +Inf (e.g. {1.3e37, FLT_MAX}): a finite block
// would decode to Inf and leave a -Inf residual. Encoder and decoder both use this, so what the
// encoder feeds back is what every decoder sees. A NaN (an invalid block) stays NaN.
inline float int8Value(float lo, float q, float scale) {
  const float v = lo + q * scale;
  return std::numeric_limits<float>::max() < v ? std::numeric_limits<float>::max() : v;
}

// Whether every x[j] is finite: an integer test of the exponent field, which vectorises and,
// unlike the min/max comparisons, also sees a NaN.
bool allFinite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; ++j) {
    bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(x[j]) & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// The invalid encoding of a block: `paramCount` NaN parameters, then `bytes` zero bytes.
void putInvalidBlock(uint8_t*& p, size_t paramCount, size_t bytes) {
  for (size_t i = 0; i < paramCount; ++i) put(p, kNaN);
  std::memset(p, 0, bytes);
  p += bytes;
}

// Block of n values x (input + residual already added): encodes, and writes the decoded values
// back into x so that the caller can update the residual. False for a non-finite block (encoded
// as invalid; x is then left as it was).
bool encodeInt8(float* x, size_t n, uint8_t*& p) {
  // A pass of its own, so that the quantisation below only ever sees finite values: its
  // float-to-int conversion then stays defined, and the loop keeps the integer clamp that GCC
  // vectorises (a float clamp there, NaN-safe, left the loop scalar: 3x slower).
  if (!allFinite(x, n)) {
    putInvalidBlock(p, 2, n);
    return false;
  }
  float lo = x[0], hi = x[0];
  for (size_t j = 1; j < n; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  float scale = (hi - lo) / 255.0f;  // +Inf when hi - lo overflows
  if (hi > lo) scale = std::clamp(scale, kMinInt8Scale, kMaxInt8Scale);
  put(p, lo);
  put(p, scale);
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  if (scale < kMaxInt8Scale) {
    for (size_t j = 0; j < n; ++j) {
      // (x - lo) * inv is in [0, 255.x], so the conversion is defined; truncating v + 0.5
      // rounds to nearest (and vectorises, unlike nearbyint on the baseline x86-64 ISA).
      const int q = std::min(static_cast<int>((x[j] - lo) * inv + 0.5f), 255);
      p[j] = static_cast<uint8_t>(q);
      x[j] = int8Value(lo, static_cast<float>(q), scale);
    }
  } else {
    // A saturated block (range up to 2^129): x - lo may overflow, x * inv - lo * inv cannot
    // (each term is at most ~2^9), and the sum stays near 1024 at most ({-FLT_MAX, FLT_MAX}), so
    // the conversion to int stays defined before the clamp to 255.
    const float loInv = lo * inv;
    for (size_t j = 0; j < n; ++j) {
      const int q = std::min(static_cast<int>(x[j] * inv - loInv + 0.5f), 255);
      p[j] = static_cast<uint8_t>(q);
      x[j] = int8Value(lo, static_cast<float>(q), scale);
    }
  }
  p += n;
  return true;
}

// Mean |x| of a finite block whose sum of |x| overflows: summed at 2^-32 (exact for all but
// negligible subnormal contributions; at most 2^20 * FLT_MAX * 2^-32, finite), at most FLT_MAX.
float meanAbsOfHugeBlock(const float* x, size_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (size_t k = 0; k < 8; ++k) part[k] += std::fabs(x[j + k]) * 0x1p-32f;
  }
  for (; j < n; ++j) part[0] += std::fabs(x[j]) * 0x1p-32f;
  const float sum =
      ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  return std::min(sum / static_cast<float>(n) * 0x1p32f, std::numeric_limits<float>::max());
}

bool encodeOneBit(float* x, size_t n, uint8_t*& p) {
  // Eight partial sums in a fixed order: vectorisable, and the same bits on every machine.
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (size_t k = 0; k < 8; ++k) part[k] += std::fabs(x[j + k]);
  }
  for (; j < n; ++j) part[0] += std::fabs(x[j]);
  const float sum =
      ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  float scale = sum / static_cast<float>(n);
  if (!std::isfinite(sum)) {
    // Once per block: an Inf or a NaN in it, or finite values whose sum overflows.
    if (!allFinite(x, n)) {
      putInvalidBlock(p, 1, (n + 7) / 8);
      return false;
    }
    scale = meanAbsOfHugeBlock(x, n);
  }
  put(p, scale);
  for (size_t b = 0; b < (n + 7) / 8; ++b) {
    const size_t m = std::min<size_t>(8, n - 8 * b);
    float* xb = x + 8 * b;
    unsigned byte = 0;
    for (size_t k = 0; k < m; ++k) {
      const bool positive = xb[k] >= 0.0f;
      byte |= static_cast<unsigned>(positive) << k;
      xb[k] = positive ? scale : -scale;
    }
    p[b] = static_cast<uint8_t>(byte);
  }
  p += (n + 7) / 8;
  return true;
}

}  // namespace

std::string_view compressionName(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "none";
    case Compression::kInt8:
      return "int8";
    case Compression::kOneBit:
      return "onebit";
  }
  return "unknown";
}

size_t compressedBytes(Compression c, size_t count, size_t block) {
  if (c == Compression::kNone) return count * sizeof(float);
  if (block == 0) block = kDefaultBlock;
  const size_t full = count / block;
  const size_t tail = count % block;
  size_t bytes = kPrefixBytes + full * blockBytes(c, block) + (tail ? blockBytes(c, tail) : 0);
  return (bytes + 3) / 4 * 4;
}

size_t compress(Compression c, const float* in, size_t count, size_t block, float* residual,
                uint8_t* out) {
  COFAB_CHECK(c == Compression::kInt8 || c == Compression::kOneBit) << "compress: no codec";
  COFAB_CHECK(count > 0 && count <= UINT32_MAX && block > 0 && block <= kMaxBlock)
      << "compress: bad sizes (count " << count << ", block " << block << ")";
  const size_t total = compressedBytes(c, count, block);
  uint8_t* p = out;
  put(p, static_cast<uint32_t>(count));
  put(p, static_cast<uint32_t>(block));
  float x[kDefaultBlock];
  std::vector<float> big;
  float* buf = x;
  if (block > kDefaultBlock) {
    big.resize(block);
    buf = big.data();
  }
  size_t nonFinite = 0;
  for (size_t base = 0; base < count; base += block) {
    const size_t n = std::min(block, count - base);
    for (size_t j = 0; j < n; ++j) buf[j] = in[base + j] + (residual ? residual[base + j] : 0.0f);
    float* decoded = buf;
    if (residual) {
      // residual = (input + old residual) - decoded; keep the pre-encoding value in residual.
      for (size_t j = 0; j < n; ++j) residual[base + j] = buf[j];
    }
    const bool finite =
        c == Compression::kInt8 ? encodeInt8(decoded, n, p) : encodeOneBit(decoded, n, p);
    if (!finite) ++nonFinite;
    if (residual) {
      if (finite) {
        // x - decoded overflows when a saturated int8 block spans more than FLT_MAX + 255 * 2^120
        // ({-FLT_MAX, FLT_MAX}): the excess beyond +-FLT_MAX is dropped, never carried as Inf.
        constexpr float kMax = std::numeric_limits<float>::max();
        for (size_t j = 0; j < n; ++j) {
          residual[base + j] = std::clamp(residual[base + j] - decoded[j], -kMax, kMax);
        }
      } else {
        // Nothing non-finite is carried into later encodings.
        std::fill_n(residual + base, n, 0.0f);
      }
    }
  }
  while (static_cast<size_t>(p - out) < total) *p++ = 0;
  return nonFinite;
}

StatusOr<EncodedInfo> inspect(Compression c, const uint8_t* in, size_t bytes) {
  if (c != Compression::kInt8 && c != Compression::kOneBit) {
    return InvalidArgument("compressed payload: unknown codec " +
                           std::to_string(static_cast<int>(c)));
  }
  if (bytes < kPrefixBytes) {
    return InvalidArgument("compressed payload of " + std::to_string(bytes) +
                           " bytes is shorter than its 8-byte prefix");
  }
  const uint8_t* p = in;
  EncodedInfo info;
  info.count = get<uint32_t>(p);
  info.block = get<uint32_t>(p);
  if (info.block == 0 || info.block > kMaxBlock) {
    return InvalidArgument("compressed payload: block size " + std::to_string(info.block) +
                           " outside [1, " + std::to_string(kMaxBlock) + "]");
  }
  if (info.count == 0) return InvalidArgument("compressed payload: zero elements");
  const size_t want = compressedBytes(c, info.count, info.block);
  if (bytes != want) {
    return InvalidArgument("compressed payload (" + std::string(compressionName(c)) + ") of " +
                           std::to_string(bytes) + " bytes, but " + std::to_string(info.count) +
                           " elements in blocks of " + std::to_string(info.block) + " take " +
                           std::to_string(want));
  }
  return info;
}

Status decompress(Compression c, const uint8_t* in, size_t bytes, size_t expectedCount,
                  float* out) {
  COFAB_ASSIGN_OR_RETURN(EncodedInfo info, inspect(c, in, bytes));
  if (info.count != expectedCount) {
    return InvalidArgument("compressed payload holds " + std::to_string(info.count) +
                           " elements, expected " + std::to_string(expectedCount));
  }
  const uint8_t* p = in + kPrefixBytes;
  for (size_t base = 0; base < info.count; base += info.block) {
    const size_t n = std::min(info.block, info.count - base);
    if (c == Compression::kInt8) {
      const float lo = get<float>(p);
      const float scale = get<float>(p);
      for (size_t j = 0; j < n; ++j) out[base + j] = int8Value(lo, static_cast<float>(p[j]), scale);
      p += n;
    } else {
      // +scale or -scale by setting the sign bit of scale's pattern: branch-free, vectorisable.
      uint32_t pattern;
      const float scale = get<float>(p);
      std::memcpy(&pattern, &scale, 4);
      pattern &= 0x7fffffffu;
      float* o = out + base;
      size_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const uint32_t byte = p[j / 8];
        uint32_t bits[8];
        for (uint32_t k = 0; k < 8; ++k) bits[k] = pattern | ((~byte >> k) & 1u) << 31;
        std::memcpy(o + j, bits, sizeof(bits));
      }
      // The tail the same way: a negative scale from a peer must not decode differently here.
      for (; j < n; ++j) {
        const uint32_t byte = p[j / 8];
        o[j] = std::bit_cast<float>(pattern | ((~byte >> (j % 8)) & 1u) << 31);
      }
      p += (n + 7) / 8;
    }
  }
  return OkStatus();
}

float* ErrorFeedback::residual(uint64_t key, size_t count) {
  auto& r = residuals_[key];
  if (r.size() != count) r.assign(count, 0.0f);
  return r.data();
}

}  // namespace cofab::compress

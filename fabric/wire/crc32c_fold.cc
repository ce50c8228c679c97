#include "fabric/wire/crc32c_fold.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define COFAB_CRC32C_FOLD 1
#else
#define COFAB_CRC32C_FOLD 0
#endif

namespace cofab::wire::detail {

#if COFAB_CRC32C_FOLD
namespace {

// How it works. CRC32C is the remainder of the message polynomial (times x^32) modulo P. A block
// of the message that lies D bits before the end of a later block contributes block * x^D, and
// only its remainder modulo P matters, so a 128-bit block can be moved ("folded") D bits forward
// by multiplying its two 64-bit halves by the 32-bit constants x^(64+D) mod P and x^D mod P and
// adding (XOR) the products, at most 96 bits, into the later block. Four 512-bit accumulators
// (sixteen 128-bit lanes) walk the buffer 256 bytes at a time; the lanes are then folded into
// one 128-bit value, whose remainder two crc32 instructions take. The initial CRC enters by
// XOR into the first four bytes, as the crc32 instruction's register would.

constexpr uint32_t kPolyNormal = 0x1EDC6F41u;  // P without its x^32 term, x^i at bit i

// The multiplier that moves a 64-bit half n bits forward. CRC32C is bit-reflected: a loaded
// qword's bit t is the coefficient of x^(63-t) and a 128-bit block's bit m that of x^(127-m),
// so a carry-less product of a qword and a multiplier whose bit k stands for x^(64-k) lands
// in block order. That multiplier is x * (x^(n-1) mod P): the x^i coefficient of
// (x^(n-1) mod P) goes to bit 63-i.
constexpr uint64_t foldMultiplier(size_t n) {
  uint32_t r = 1;
  for (size_t i = 0; i + 1 < n; ++i) r = (r & 0x80000000u) ? (r << 1) ^ kPolyNormal : r << 1;
  uint64_t k = 0;
  for (int i = 0; i < 32; ++i) {
    if ((r >> i) & 1u) k |= uint64_t{1} << (63 - i);
  }
  return k;
}

// Multipliers for four 128-bit lanes, each moved by its own distance in bits (0: the lane is
// dropped, its product is zero): low qword times x^(64+d), high qword times x^d.
struct alignas(64) LaneMultipliers {
  uint64_t q[8];
};
constexpr LaneMultipliers lanesBy(size_t d0, size_t d1, size_t d2, size_t d3) {
  LaneMultipliers m{};
  const size_t d[4] = {d0, d1, d2, d3};
  for (int i = 0; i < 4; ++i) {
    m.q[2 * i] = d[i] == 0 ? 0 : foldMultiplier(64 + d[i]);
    m.q[2 * i + 1] = d[i] == 0 ? 0 : foldMultiplier(d[i]);
  }
  return m;
}
constexpr LaneMultipliers kBy256Bytes = lanesBy(2048, 2048, 2048, 2048);
constexpr LaneMultipliers kBy64Bytes = lanesBy(512, 512, 512, 512);
// The last 64 bytes' lanes onto the fourth: 48, 32 and 16 bytes forward.
constexpr LaneMultipliers kLanesToLast = lanesBy(384, 256, 128, 0);
alignas(16) constexpr uint64_t kBy16Bytes[2] = {foldMultiplier(64 + 128), foldMultiplier(128)};

#define COFAB_FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

COFAB_FOLD_TARGET inline __m512i multipliers(const LaneMultipliers& m) {
  return _mm512_load_si512(m.q);
}

// acc moved forward by the distance `k` encodes, added to `next`.
COFAB_FOLD_TARGET inline __m512i fold(__m512i acc, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00),
                                   _mm512_clmulepi64_epi128(acc, k, 0x11), next, 0x96);
}
COFAB_FOLD_TARGET inline __m128i fold(__m128i acc, __m128i k, __m128i next) {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x00), _mm_clmulepi64_si128(acc, k, 0x11)), next);
}

// 128-bit lane i of x. The masked form because GCC 12's unmasked one reads an undefined
// register that -Werror=uninitialized rejects.
template <int kLane>
COFAB_FOLD_TARGET inline __m128i lane(__m512i x) {
  return _mm512_maskz_extracti32x4_epi32(0xF, x, kLane);
}

template <bool kCopy>
COFAB_FOLD_TARGET inline __m512i load64(const uint8_t* p, uint8_t* d, size_t off) {
  const __m512i v = _mm512_loadu_si512(p + off);
  if constexpr (kCopy) _mm512_storeu_si512(d + off, v);
  return v;
}

template <bool kCopy>
COFAB_FOLD_TARGET uint32_t foldCrc(uint32_t crc, uint8_t* d, const uint8_t* p, size_t size) {
  const __m512i init = _mm512_maskz_set1_epi32(1, static_cast<int>(~crc));
  __m512i x0 = _mm512_xor_si512(load64<kCopy>(p, d, 0), init);
  __m512i x1 = load64<kCopy>(p, d, 64);
  __m512i x2 = load64<kCopy>(p, d, 128);
  __m512i x3 = load64<kCopy>(p, d, 192);
  size_t off = 256;
  const __m512i by256 = multipliers(kBy256Bytes);
  while (size - off >= 256) {
    x0 = fold(x0, by256, load64<kCopy>(p, d, off));
    x1 = fold(x1, by256, load64<kCopy>(p, d, off + 64));
    x2 = fold(x2, by256, load64<kCopy>(p, d, off + 128));
    x3 = fold(x3, by256, load64<kCopy>(p, d, off + 192));
    off += 256;
  }
  const __m512i by64 = multipliers(kBy64Bytes);
  x1 = fold(x0, by64, x1);
  x2 = fold(x1, by64, x2);
  x3 = fold(x2, by64, x3);
  while (size - off >= 64) {
    x3 = fold(x3, by64, load64<kCopy>(p, d, off));
    off += 64;
  }
  const __m512i toLast = multipliers(kLanesToLast);
  const __m512i t = _mm512_xor_si512(_mm512_clmulepi64_epi128(x3, toLast, 0x00),
                                     _mm512_clmulepi64_epi128(x3, toLast, 0x11));
  __m128i a =
      _mm_xor_si128(_mm_xor_si128(lane<0>(t), lane<1>(t)), _mm_xor_si128(lane<2>(t), lane<3>(x3)));
  const __m128i by16 = _mm_load_si128(reinterpret_cast<const __m128i*>(kBy16Bytes));
  while (size - off >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + off));
    if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + off), v);
    a = fold(a, by16, v);
    off += 16;
  }
  // The 128-bit remainder-equivalent through the crc32 instruction from a zero register, then
  // the last few bytes.
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(a)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(a, 1)));
  if (size - off >= 8) {
    uint64_t v;
    std::memcpy(&v, p + off, 8);
    if constexpr (kCopy) std::memcpy(d + off, &v, 8);
    c = _mm_crc32_u64(c, v);
    off += 8;
  }
  for (; off < size; ++off) {
    if constexpr (kCopy) d[off] = p[off];
    c = _mm_crc32_u8(static_cast<uint32_t>(c), p[off]);
  }
  return ~static_cast<uint32_t>(c);
}

bool detect() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
         __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
}

}  // namespace

bool crc32cFoldSupported() {
  static const bool supported = detect();
  return supported;
}

uint32_t crc32cFold(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t size) {
  return dst != nullptr ? foldCrc<true>(crc, dst, src, size) : foldCrc<false>(crc, dst, src, size);
}

#else

bool crc32cFoldSupported() { return false; }
// Not reachable: callers check crc32cFoldSupported() first, and it is false off x86-64.
uint32_t crc32cFold(uint32_t, uint8_t*, const uint8_t*, size_t) { std::abort(); }

#endif

}  // namespace cofab::wire::detail

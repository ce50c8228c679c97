// IEEE binary16 (f16) and bfloat16 conversions, usable on host and device (COFAB_HD), so that
// the CPU reductions and the CUDA kernels share one definition of the per-element math.
// Conversions from float round to nearest even; NaN stays NaN, overflow goes to infinity.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define COFAB_HD __host__ __device__
#else
#define COFAB_HD
#endif

namespace cofab {

COFAB_HD inline uint32_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
COFAB_HD inline float bitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

COFAB_HD inline uint16_t floatToBf16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
COFAB_HD inline float bf16ToFloat(uint16_t h) { return bitsFloat(static_cast<uint32_t>(h) << 16); }

COFAB_HD inline float halfToFloatPortable(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return bitsFloat(out);
}

COFAB_HD inline uint16_t floatToHalfPortable(float f) {
  uint32_t u = floatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {                                               // subnormal or zero
    if (abs < 0x33000000u) return sign;                                  // below half of min sub
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (112 - exp)... produces 10-bit subnormal mantissa
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

// The conversions everything uses. On a CUDA device, numbers go through the conversion
// instructions, which give the same bits as the code above (exact widening; round to nearest
// even, with subnormals and overflow to infinity, when narrowing: tests/gpu/half_conversion_test.cu
// checks every f16 and every f32 value on a GPU) in one instruction instead of a dozen or more:
// the f16 reduction kernel was bound by the conversions. NaNs take the code above, whose payload
// handling the instructions need not share.
COFAB_HD inline float halfToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  if ((h & 0x7c00u) != 0x7c00u) {  // finite
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
#endif
  return halfToFloatPortable(h);
}

COFAB_HD inline uint16_t floatToHalf(float f) {
#if defined(__CUDA_ARCH__)
  if ((floatBits(f) & 0x7fffffffu) <= 0x7f800000u) {  // not NaN
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
#endif
  return floatToHalfPortable(f);
}

}  // namespace cofab

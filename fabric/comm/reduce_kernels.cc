#include "fabric/comm/reduce_kernels.h"

#include <cpuid.h>
#include <immintrin.h>

#include <bit>
#include <string>

#include "core/half.h"

// Function multiversioning: each clone below is the same loop compiled for one ISA; an ifunc
// resolver picks the best one at load time. Sanitizer builds keep one version (ifunc resolvers
// run before the sanitizer runtime is initialised).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define COFAB_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define COFAB_HAVE_F16C_PATH 1
#else
#define COFAB_CLONES
#define COFAB_HAVE_F16C_PATH 0
#endif

namespace cofab::comm {
namespace {

template <typename T>
struct SumF {
  static T apply(T a, T b) { return a + b; }
};
// min/max propagate NaN whichever operand holds it (`b != b` is false for integers): with a
// bare `b < a ? b : a` a NaN survived only as the first operand, so whether a rank's NaN reached
// the result depended on its rank, the element's block and the algorithm.
template <typename T>
struct MinF {
  static T apply(T a, T b) { return (b < a || b != b) ? b : a; }
};
template <typename T>
struct MaxF {
  static T apply(T a, T b) { return (a < b || b != b) ? b : a; }
};

// Integer sums wrap instead of being undefined: go through the unsigned type.
template <typename T, typename U>
struct WrapSumF {
  static T apply(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
};

template <typename F, typename T>
__attribute__((always_inline)) inline void loop(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F::apply(a[i], b[i]);
}

template <typename F, typename T>
__attribute__((always_inline)) inline void loopDiv(T* dst, const T* a, const T* b, size_t n,
                                                   T div) {
  for (size_t i = 0; i < n; ++i) dst[i] = F::apply(a[i], b[i]) / div;
}

template <typename T, typename SumOp>
__attribute__((always_inline)) inline void dispatch(ReduceOp op, int divisor, T* dst, const T* a,
                                                    const T* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
      loop<SumOp>(dst, a, b, n);
      return;
    case ReduceOp::kAvg:
      if (divisor > 1) {
        loopDiv<SumOp>(dst, a, b, n, static_cast<T>(divisor));
      } else {
        loop<SumOp>(dst, a, b, n);
      }
      return;
    case ReduceOp::kMin:
      loop<MinF<T>>(dst, a, b, n);
      return;
    case ReduceOp::kMax:
      loop<MaxF<T>>(dst, a, b, n);
      return;
  }
}

COFAB_CLONES void reduceF32(ReduceOp op, int div, float* d, const float* a, const float* b,
                            size_t n) {
  dispatch<float, SumF<float>>(op, div, d, a, b, n);
}
COFAB_CLONES void reduceF64(ReduceOp op, int div, double* d, const double* a, const double* b,
                            size_t n) {
  dispatch<double, SumF<double>>(op, div, d, a, b, n);
}
COFAB_CLONES void reduceI32(ReduceOp op, int div, int32_t* d, const int32_t* a, const int32_t* b,
                            size_t n) {
  dispatch<int32_t, WrapSumF<int32_t, uint32_t>>(op, div, d, a, b, n);
}
COFAB_CLONES void reduceI64(ReduceOp op, int div, int64_t* d, const int64_t* a, const int64_t* b,
                            size_t n) {
  dispatch<int64_t, WrapSumF<int64_t, uint64_t>>(op, div, d, a, b, n);
}

__attribute__((always_inline)) inline float combine(ReduceOp op, float x, float y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return x + y;
    case ReduceOp::kMin:
      return (y < x || y != y) ? y : x;  // NaN from either side, as MinF
    case ReduceOp::kMax:
      return (x < y || y != y) ? y : x;
  }
  return x;
}

// bf16ToFloat / floatToBf16 (core/half.h) with std::bit_cast and no early return: the same
// results, in a form GCC vectorises (memcpy punning and the branch stop it).
__attribute__((always_inline)) inline float fromBf16(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
__attribute__((always_inline)) inline uint16_t toBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

template <ReduceOp kOp>
__attribute__((always_inline)) inline void bf16Loop(uint16_t* d, const uint16_t* a,
                                                    const uint16_t* b, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) {
    d[i] = toBf16(combine(kOp, fromBf16(a[i]), fromBf16(b[i])) * scale);
  }
}

COFAB_CLONES void reduceBf16(ReduceOp op, int div, uint16_t* d, const uint16_t* a,
                             const uint16_t* b, size_t n) {
  // Multiplying by 1 is exact, so the non-average ops share the loop shape.
  const float scale = op == ReduceOp::kAvg && div > 1 ? 1.0f / static_cast<float>(div) : 1.0f;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if (scale == 1.0f) {
        bf16Loop<ReduceOp::kSum>(d, a, b, n, 1.0f);
      } else {
        for (size_t i = 0; i < n; ++i) {
          d[i] = toBf16((fromBf16(a[i]) + fromBf16(b[i])) / static_cast<float>(div));
        }
      }
      return;
    case ReduceOp::kMin:
      bf16Loop<ReduceOp::kMin>(d, a, b, n, 1.0f);
      return;
    case ReduceOp::kMax:
      bf16Loop<ReduceOp::kMax>(d, a, b, n, 1.0f);
      return;
  }
}

void reduceF16Portable(ReduceOp op, int div, uint16_t* d, const uint16_t* a, const uint16_t* b,
                       size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v = combine(op, halfToFloat(a[i]), halfToFloat(b[i]));
    if (op == ReduceOp::kAvg && div > 1) v /= static_cast<float>(div);
    d[i] = floatToHalf(v);
  }
}

#if COFAB_HAVE_F16C_PATH
// F16C converts 8 halves per instruction with the same round-to-nearest-even as floatToHalf.
__attribute__((target("avx2,f16c"))) void reduceF16F16c(ReduceOp op, int div, uint16_t* d,
                                                        const uint16_t* a, const uint16_t* b,
                                                        size_t n) {
  const bool avg = op == ReduceOp::kAvg && div > 1;
  const __m256 vdiv = _mm256_set1_ps(static_cast<float>(div));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m256 r;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        r = _mm256_add_ps(x, y);
        if (avg) r = _mm256_div_ps(r, vdiv);
        break;
      case ReduceOp::kMin:
        r = _mm256_min_ps(y, x);  // y < x ? y : x, then NaN from either side, as combine()
        r = _mm256_blendv_ps(r, _mm256_add_ps(x, y), _mm256_cmp_ps(x, y, _CMP_UNORD_Q));
        break;
      default:
        r = _mm256_max_ps(y, x);
        r = _mm256_blendv_ps(r, _mm256_add_ps(x, y), _mm256_cmp_ps(x, y, _CMP_UNORD_Q));
        break;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  reduceF16Portable(op, div, d + i, a + i, b + i, n - i);
}
#endif

// Both paths: two f32 products, one f32 sum, one rounding to f16 (no fused multiply-add in
// either), so ranks on CPUs with and without F16C get the same bits.
void scaledSumF16Portable(uint16_t* d, const uint16_t* a, float sa, const uint16_t* b, float sb,
                          size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = halfToFloat(a[i]) * sa;
    const float y = halfToFloat(b[i]) * sb;
    d[i] = floatToHalf(x + y);
  }
}

#if COFAB_HAVE_F16C_PATH
__attribute__((target("avx2,f16c"))) void scaledSumF16F16c(uint16_t* d, const uint16_t* a,
                                                           float sa, const uint16_t* b, float sb,
                                                           size_t n) {
  const __m256 va = _mm256_set1_ps(sa);
  const __m256 vb = _mm256_set1_ps(sb);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m256 r = _mm256_add_ps(_mm256_mul_ps(x, va), _mm256_mul_ps(y, vb));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  scaledSumF16Portable(d + i, a + i, sa, b + i, sb, n - i);
}
#endif

#if COFAB_HAVE_F16C_PATH
bool hasF16c() {
  // F16C through cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
  static const bool kF16c = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0 &&
           __builtin_cpu_supports("avx2");
  }();
  return kF16c;
}
#endif

void reduceF16(ReduceOp op, int div, uint16_t* d, const uint16_t* a, const uint16_t* b,
               size_t n) {
#if COFAB_HAVE_F16C_PATH
  if (hasF16c()) {
    reduceF16F16c(op, div, d, a, b, n);
    return;
  }
#endif
  reduceF16Portable(op, div, d, a, b, n);
}

void run(DType dtype, ReduceOp op, int div, void* dst, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::kF32:
      reduceF32(op, div, static_cast<float*>(dst), static_cast<const float*>(a),
                static_cast<const float*>(b), n);
      return;
    case DType::kF64:
      reduceF64(op, div, static_cast<double*>(dst), static_cast<const double*>(a),
                static_cast<const double*>(b), n);
      return;
    case DType::kI32:
      reduceI32(op, div, static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                static_cast<const int32_t*>(b), n);
      return;
    case DType::kI64:
      reduceI64(op, div, static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                static_cast<const int64_t*>(b), n);
      return;
    case DType::kF16:
      reduceF16(op, div, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                static_cast<const uint16_t*>(b), n);
      return;
    case DType::kBF16:
      reduceBf16(op, div, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                 static_cast<const uint16_t*>(b), n);
      return;
    case DType::kU8:
      break;
  }
  COFAB_CHECK(false) << "reduce on a non-reducible dtype " << dtypeName(dtype);
}

// What the ifunc resolver of the clones above picks (the same cpu checks, in the same order).
int isaProbe() {
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  if (__builtin_cpu_supports("avx512f")) return 2;
  if (__builtin_cpu_supports("avx2")) return 1;
#endif
  return 0;
}

}  // namespace

std::string_view reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

StatusOr<ReduceOp> parseReduceOp(std::string_view name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    if (name == reduceOpName(op)) return op;
  }
  return InvalidArgument("unknown reduce op '" + std::string(name) +
                         "' (expected sum, avg, min or max)");
}

Status checkReducible(DType dtype, ReduceOp op) {
  if (dtype == DType::kU8) {
    return InvalidArgument("cannot reduce (" + std::string(reduceOpName(op)) +
                           ") elements of dtype u8: use f32, f64, f16, bf16, i32 or i64");
  }
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::kMax)) {
    return InvalidArgument("invalid reduce op value " + std::to_string(static_cast<int>(op)));
  }
  return OkStatus();
}

void reduce(DType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  run(dtype, op, 1, dst, a, b, n);
}

void reduceFinal(DType dtype, ReduceOp op, int divisor, void* dst, const void* a, const void* b,
                 size_t n) {
  run(dtype, op, divisor, dst, a, b, n);
}

void scaledSumF16(void* dst, const void* a, float aScale, const void* b, float bScale,
                  size_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
#if COFAB_HAVE_F16C_PATH
  if (hasF16c()) {
    scaledSumF16F16c(d, x, aScale, y, bScale, n);
    return;
  }
#endif
  scaledSumF16Portable(d, x, aScale, y, bScale, n);
}

std::string_view reduceIsa() {
  switch (isaProbe()) {
    case 2: return "avx512f";
    case 1: return "avx2";
    default: return "default";
  }
}

}  // namespace cofab::comm

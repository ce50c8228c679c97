#include "aggregator/reducer.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/half.h"
#include "fabric/comm/reduce_kernels.h"

namespace cofab::aggregator {

namespace {

// Elements folded at a time: the accumulator block stays in L1 while every contribution streams
// through it once, so the reduction reads each input and writes the output exactly once.
constexpr size_t kBlock = 2048;

// f32 and f64 accumulate in their own type, so the left fold is a chain of two-input adds, each
// rounded like the fold's step: the collectives' vectorised kernels (AVX2/AVX-512 clones chosen
// at run time) compute exactly these bits. The chain runs block by block in `out`, which stays in
// L1 between its steps. A generic loop over the contributions let GCC unroll the rank loop by two
// and leave the fused pair scalar: half the round's time went to addss.
void reduceSameType(DType dtype, bool average, std::span<const uint8_t* const> in, size_t count,
                    uint8_t* out) {
  const size_t width = dtypeSize(dtype);
  const size_t n = in.size();
  if (n == 1) {  // x / 1 == x: a copy (nothing at all when out is the input)
    if (out != in[0]) std::memmove(out, in[0], count * width);
    return;
  }
  const comm::ReduceOp op = average ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum;
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    uint8_t* acc = out + base * width;
    const uint8_t* first = in[0] + base * width;
    for (size_t r = 1; r < n; ++r) {
      const uint8_t* x = in[r] + base * width;
      if (r + 1 < n) {
        comm::reduce(dtype, comm::ReduceOp::kSum, acc, r == 1 ? first : acc, x, len);
      } else {  // the last add also divides for an average: (acc + x) / n
        comm::reduceFinal(dtype, op, static_cast<int>(n), acc, r == 1 ? first : acc, x, len);
      }
    }
  }
}

// f16/bf16 accumulate in f32 across every contribution and round once (the collectives' kernels
// round per call, so they cannot serve here).
template <typename T, typename Acc, typename Load, typename Store>
void reduceBlocks(std::span<const uint8_t* const> in, size_t count, uint8_t* outBytes, bool average,
                  Load load, Store store) {
  Acc acc[kBlock];
  const Acc divisor = static_cast<Acc>(in.size());
  T* out = reinterpret_cast<T*>(outBytes);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const T* x0 = reinterpret_cast<const T*>(in[0]) + base;
    for (size_t j = 0; j < n; ++j) acc[j] = load(x0[j]);
    for (size_t r = 1; r < in.size(); ++r) {
      const T* xr = reinterpret_cast<const T*>(in[r]) + base;
      for (size_t j = 0; j < n; ++j) acc[j] = acc[j] + load(xr[j]);
    }
    if (average) {
      for (size_t j = 0; j < n; ++j) acc[j] = acc[j] / divisor;
    }
    for (size_t j = 0; j < n; ++j) out[base + j] = store(acc[j]);
  }
}

}  // namespace

void reduceInRankOrder(DType dtype, bool average, std::span<const uint8_t* const> contributions,
                       size_t count, uint8_t* out) {
  COFAB_CHECK(!contributions.empty()) << "reduce without contributions";
  switch (dtype) {
    case DType::kF32:
    case DType::kF64:
      reduceSameType(dtype, average, contributions, count, out);
      return;
    case DType::kF16:
      reduceBlocks<uint16_t, float>(
          contributions, count, out, average, [](uint16_t v) { return halfToFloat(v); },
          [](float v) { return floatToHalf(v); });
      return;
    case DType::kBF16:
      reduceBlocks<uint16_t, float>(
          contributions, count, out, average, [](uint16_t v) { return bf16ToFloat(v); },
          [](float v) { return floatToBf16(v); });
      return;
    default:
      COFAB_CHECK(false) << "reduceInRankOrder: unsupported dtype " << dtypeName(dtype);
  }
}

}  // namespace cofab::aggregator

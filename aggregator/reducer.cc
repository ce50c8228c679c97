#include "aggregator/reducer.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/half.h"

namespace cofab::aggregator {

namespace {

// Elements folded at a time: the accumulator block stays in L1 while every contribution streams
// through it once, so the reduction reads each input and writes the output exactly once.
constexpr size_t kBlock = 2048;

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
      reduceBlocks<float, float>(
          contributions, count, out, average, [](float v) { return v; }, [](float v) { return v; });
      return;
    case DType::kF64:
      reduceBlocks<double, double>(
          contributions, count, out, average, [](double v) { return v; },
          [](double v) { return v; });
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

// Per-element math of the reduction kernels (sum and average of f32, f16, bf16 with f32
// accumulation), shared by the CUDA kernels (gpu/cuda/reduce_kernels.cu) and the CPU twin
// (gpu/reduce_cpu.cc) so that the CPU tests test exactly what the GPU computes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/half.h"

namespace cofab::gpu {

// How one element type is read into and written from the f32 accumulator.
struct F32Io {
  using Storage = float;
  COFAB_HD static float load(float v) { return v; }
  COFAB_HD static float store(float v) { return v; }
};
struct F16Io {
  using Storage = uint16_t;
  COFAB_HD static float load(uint16_t v) { return halfToFloat(v); }
  COFAB_HD static uint16_t store(float v) { return floatToHalf(v); }
};
struct Bf16Io {
  using Storage = uint16_t;
  COFAB_HD static float load(uint16_t v) { return bf16ToFloat(v); }
  COFAB_HD static uint16_t store(float v) { return floatToBf16(v); }
};

// out[i] = store(scale * sum_j load(ins[j][i])), summing inputs in index order. scale is 1 for
// a sum and 1/count for an average (one rounding to the storage type, at the end). The steps are
// named so that the vectorised CUDA kernel, which interleaves lanes, does the same arithmetic
// per element as the scalar kernel and the CPU twin.
template <typename Io>
struct ReduceElement {
  using Storage = typename Io::Storage;
  COFAB_HD static float add(float acc, Storage v) { return acc + Io::load(v); }
  COFAB_HD static Storage finish(float acc, float scale) { return Io::store(acc * scale); }

  COFAB_HD void operator()(const Storage* const* ins, int count, Storage* out, size_t i,
                           float scale) const {
    float acc = 0.0f;
    for (int j = 0; j < count; ++j) acc = add(acc, ins[j][i]);
    out[i] = finish(acc, scale);
  }
};

// Widening and narrowing for the FP64 decode of coded matmul (gpu/linear_combine.h).
struct WidenF32 {
  COFAB_HD double operator()(float v) const { return static_cast<double>(v); }
};
struct NarrowF64 {
  COFAB_HD float operator()(double v) const { return static_cast<float>(v); }
};

}  // namespace cofab::gpu

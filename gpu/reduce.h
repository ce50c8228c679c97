// Element-wise reductions the aggregator uses: output = sum (or average) of the inputs, for f32,
// f16 and bf16, accumulated in f32. One interface for both devices: the inputs' device picks the
// CUDA kernel or its CPU twin, which share the per-element math (gpu/reduce_math.h).
//
// The caller owns all buffers; the output may be one of the inputs (in-place). CPU calls are
// synchronous; CUDA calls are asynchronous on `stream` (nullptr = default stream). Any thread.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "core/tensor.h"

namespace cofab::gpu {

enum class ReduceOp : uint8_t { kSum, kAverage };

struct ReduceArgs {
  std::span<const TensorView> inputs;  // >= 1, same dtype, count and device as output
  TensorView output;
  ReduceOp op = ReduceOp::kSum;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
};

// InvalidArgument on mismatched or null tensors and unsupported dtypes; Unavailable for CUDA
// tensors in a build or on a machine without a usable GPU.
Status reduce(const ReduceArgs& args);

// The CPU twin, callable directly (tests compare the two).
Status reduceCpu(const ReduceArgs& args);

}  // namespace cofab::gpu

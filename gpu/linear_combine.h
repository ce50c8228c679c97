// Dense linear algebra for coded matmul, on CPU (OpenBLAS) or GPU (cuBLAS) behind one interface:
//   gemmF32        C = A x B, row-major fp32 (the tasks and the encode). On the GPU the cuBLAS
//                  handle runs in CUBLAS_PEDANTIC_MATH: no TF32, whatever the global setting, as
//                  DESIGN.md §6 requires for coded tasks (decode would amplify TF32's 1e-3 error).
//   linearCombine  out_i = sum_j coeffs[i][j] * in_j over fp32 blocks, accumulated in FP64 (the
//                  decode: inputs widened, one dgemm, outputs narrowed once; the widen/narrow
//                  functors are shared with the CPU twin, gpu/reduce_math.h).
// Coefficients always live on the host (they come from a small FP64 solve there). Buffers are the
// caller's. CUDA calls are asynchronous on `stream` except where scratch memory must be freed;
// they use a cuBLAS handle per call (simple; coded tasks are large). Any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"
#include "core/tensor.h"

namespace cofab::gpu {

struct GemmArgs {
  const float* a = nullptr;  // m x k, row stride lda
  const float* b = nullptr;  // k x n, row stride ldb
  float* c = nullptr;        // m x n, row stride ldc
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0 = dense
  Device device;
  void* stream = nullptr;
};

Status gemmF32(const GemmArgs& args);
Status gemmF32Cpu(const GemmArgs& args);

struct CombineArgs {
  std::span<const double> coeffs;  // outputs x inputs, row-major, host memory
  std::span<const float* const> inputs;
  std::span<float* const> outputs;
  size_t elements = 0;  // per block
  Device device;
  void* stream = nullptr;
};

Status linearCombine(const CombineArgs& args);
Status linearCombineCpu(const CombineArgs& args);

}  // namespace cofab::gpu

#include "gpu/ops_validate.h"

#include <cstdint>
#include <string>
#include <utility>

namespace cofab::gpu {
namespace {

// Bytes from the first element of a rows x cols row-major fp32 matrix with row stride ld (0 =
// cols) to one past its last; 0 for an empty one. Saturates: sizes and strides are checked
// below 2^31, so their product fits, but times four it may not.
size_t matrixBytes(int64_t rows, int64_t cols, int64_t ld) {
  if (rows <= 0 || cols <= 0) return 0;
  const auto stride = static_cast<uint64_t>(ld != 0 ? ld : cols);
  uint64_t elements = 0, bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(rows - 1), stride, &elements) ||
      __builtin_add_overflow(elements, static_cast<uint64_t>(cols), &elements) ||
      __builtin_mul_overflow(elements, uint64_t{sizeof(float)}, &bytes)) {
    return SIZE_MAX;
  }
  return bytes;
}

}  // namespace

Status validateReduce(const ReduceArgs& a) {
  if (a.inputs.empty() || a.inputs.size() > kMaxKernelInputs) {
    return InvalidArgument("reduce: needs 1.." + std::to_string(kMaxKernelInputs) +
                           " inputs, got " + std::to_string(a.inputs.size()));
  }
  const DType t = a.output.dtype;
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
    return InvalidArgument(std::string("reduce: dtype ") + std::string(dtypeName(t)) +
                           " is not supported (f32, f16, bf16)");
  }
  COFAB_RETURN_IF_ERROR(a.output.validate("reduce output"));
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const std::string what = "reduce input " + std::to_string(i);
    COFAB_RETURN_IF_ERROR(a.inputs[i].validate(what.c_str()));
    COFAB_RETURN_IF_ERROR(checkSameShape(a.inputs[i], a.output, what.c_str()));
    // The output may be an input (in place), not straddle one: element i's result would land
    // on another element of that input before the loop (or another GPU thread) read it.
    COFAB_RETURN_IF_ERROR(checkInPlaceOrDisjoint(a.inputs[i], a.output, what.c_str()));
    if (!(a.inputs[i].device == a.output.device)) {
      return InvalidArgument(what + " is on " + a.inputs[i].device.toString() +
                             " but the output is on " + a.output.device.toString());
    }
  }
  return OkStatus();
}

Status validateXor(const XorArgs& a) {
  if (a.srcs.empty() || a.srcs.size() > kMaxKernelInputs) {
    return InvalidArgument("xor: needs 1.." + std::to_string(kMaxKernelInputs) + " sources, got " +
                           std::to_string(a.srcs.size()));
  }
  if (a.bytes > 0) {
    if (a.dst == nullptr) return InvalidArgument("xor: dst is null");
    for (size_t i = 0; i < a.srcs.size(); ++i) {
      if (a.srcs[i] == nullptr)
        return InvalidArgument("xor: source " + std::to_string(i) + " is null");
      // dst may be a source (in place), not overlap one partly (as for reduce).
      if (a.srcs[i] != a.dst && bytesOverlap(a.srcs[i], a.bytes, a.dst, a.bytes)) {
        return InvalidArgument("xor: dst overlaps source " + std::to_string(i) +
                               " without being it (in place or disjoint only)");
      }
    }
  }
  return OkStatus();
}

Status validateGemm(const GemmArgs& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.m > INT32_MAX || g.n > INT32_MAX || g.k > INT32_MAX) {
    return InvalidArgument("gemm: sizes must be in [0, 2^31): m=" + std::to_string(g.m) +
                           " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k));
  }
  if ((g.lda != 0 && g.lda < g.k) || (g.ldb != 0 && g.ldb < g.n) || (g.ldc != 0 && g.ldc < g.n)) {
    return InvalidArgument("gemm: a leading dimension is smaller than its row length");
  }
  // BLAS and cuBLAS take 32-bit leading dimensions: a larger one would be truncated (OpenBLAS
  // then rejects it through xerbla and returns without computing, leaving C untouched).
  const std::pair<const char*, int64_t> lds[] = {{"lda", g.lda}, {"ldb", g.ldb}, {"ldc", g.ldc}};
  for (const auto& [name, ld] : lds) {
    if (ld > INT32_MAX) {
      return InvalidArgument(std::string("gemm: leading dimension ") + name + "=" +
                             std::to_string(ld) + " exceeds 2^31-1, the largest BLAS accepts");
    }
  }
  if (g.m * g.n > 0 && (g.c == nullptr || (g.k > 0 && (g.a == nullptr || g.b == nullptr)))) {
    return InvalidArgument("gemm: null matrix pointer");
  }
  // BLAS writes C in blocks while it still reads A and B: C = A x C "in place" returns garbage
  // (OpenBLAS and cuBLAS alike), so C must share no byte with either.
  const size_t cBytes = matrixBytes(g.m, g.n, g.ldc);
  if (bytesOverlap(g.c, cBytes, g.a, matrixBytes(g.m, g.k, g.lda))) {
    return InvalidArgument("gemm: C overlaps A; BLAS cannot compute in place");
  }
  if (bytesOverlap(g.c, cBytes, g.b, matrixBytes(g.k, g.n, g.ldb))) {
    return InvalidArgument("gemm: C overlaps B; BLAS cannot compute in place");
  }
  return OkStatus();
}

Status validateCombine(const CombineArgs& c) {
  const size_t in = c.inputs.size(), out = c.outputs.size();
  if (in == 0 || out == 0 || c.coeffs.size() != in * out) {
    return InvalidArgument(
        "linearCombine: needs inputs, outputs and outputs x inputs = " + std::to_string(out) +
        " x " + std::to_string(in) + " coefficients, got " + std::to_string(c.coeffs.size()));
  }
  if (in > kMaxKernelInputs || in > INT32_MAX || c.elements > INT32_MAX) {
    return InvalidArgument("linearCombine: too many inputs or elements");
  }
  if (c.elements > 0) {
    for (const float* p : c.inputs) {
      if (p == nullptr) return InvalidArgument("linearCombine: null input block");
    }
    for (float* p : c.outputs) {
      if (p == nullptr) return InvalidArgument("linearCombine: null output block");
    }
    // Outputs may overlap inputs (every input is read into scratch before any output is
    // written), not one another: the later output would overwrite the earlier one.
    const size_t bytes = c.elements * sizeof(float);
    for (size_t i = 0; i < out; ++i) {
      for (size_t j = i + 1; j < out; ++j) {
        if (bytesOverlap(c.outputs[i], bytes, c.outputs[j], bytes)) {
          return InvalidArgument("linearCombine: outputs " + std::to_string(i) + " and " +
                                 std::to_string(j) + " overlap");
        }
      }
    }
  }
  return OkStatus();
}

}  // namespace cofab::gpu

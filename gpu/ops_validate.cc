#include "gpu/ops_validate.h"

#include <cstdint>
#include <string>
#include <utility>

namespace cofab::gpu {

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
    const auto dst = reinterpret_cast<uintptr_t>(a.dst);
    for (size_t i = 0; i < a.srcs.size(); ++i) {
      if (a.srcs[i] == nullptr)
        return InvalidArgument("xor: source " + std::to_string(i) + " is null");
      // dst may be a source (in place), not overlap one partly (as for reduce).
      const auto src = reinterpret_cast<uintptr_t>(a.srcs[i]);
      if (src != dst && src < dst + a.bytes && dst < src + a.bytes) {
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
  }
  return OkStatus();
}

}  // namespace cofab::gpu

// CPU twins of gemmF32 and linearCombine: OpenBLAS, with the same widen/narrow functors as the
// CUDA path.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "gpu/linear_combine.h"
#include "gpu/ops_validate.h"
#include "gpu/reduce_math.h"

namespace cofab::gpu {

Status gemmF32Cpu(const GemmArgs& g) {
  COFAB_RETURN_IF_ERROR(validateGemm(g));
  if (!g.device.isCpu())
    return InvalidArgument("gemmF32Cpu: matrices are on " + g.device.toString());
  const int64_t lda = g.lda ? g.lda : g.k, ldb = g.ldb ? g.ldb : g.n, ldc = g.ldc ? g.ldc : g.n;
  if (g.m == 0 || g.n == 0) return OkStatus();
  if (g.k == 0) {
    for (int64_t r = 0; r < g.m; ++r) std::fill_n(g.c + r * ldc, g.n, 0.0f);
    return OkStatus();
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(g.m),
              static_cast<blasint>(g.n), static_cast<blasint>(g.k), 1.0f, g.a,
              static_cast<blasint>(lda), g.b, static_cast<blasint>(ldb), 0.0f, g.c,
              static_cast<blasint>(ldc));
  return OkStatus();
}

Status linearCombineCpu(const CombineArgs& c) {
  COFAB_RETURN_IF_ERROR(validateCombine(c));
  if (!c.device.isCpu())
    return InvalidArgument("linearCombineCpu: blocks are on " + c.device.toString());
  const size_t in = c.inputs.size(), out = c.outputs.size(), e = c.elements;
  if (e == 0) return OkStatus();
  const WidenF32 widen;
  const NarrowF64 narrow;
  std::vector<double> y(in * e), x(out * e);
  for (size_t j = 0; j < in; ++j) {
    for (size_t i = 0; i < e; ++i) y[j * e + i] = widen(c.inputs[j][i]);
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(out),
              static_cast<blasint>(e), static_cast<blasint>(in), 1.0, c.coeffs.data(),
              static_cast<blasint>(in), y.data(), static_cast<blasint>(e), 0.0, x.data(),
              static_cast<blasint>(e));
  for (size_t r = 0; r < out; ++r) {
    for (size_t i = 0; i < e; ++i) c.outputs[r][i] = narrow(x[r * e + i]);
  }
  return OkStatus();
}

}  // namespace cofab::gpu

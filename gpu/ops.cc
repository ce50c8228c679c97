// Device dispatch for the kernels with CPU twins: the one place that knows whether CUDA is built
// in (DESIGN.md §4).
#include "core/config.h"
#include "gpu/linear_combine.h"
#include "gpu/ops_validate.h"
#include "gpu/reduce.h"
#include "gpu/xor.h"

#if COFAB_HAVE_CUDA
#include "gpu/cuda/cuda_ops.h"
#endif

namespace cofab::gpu {
namespace {

[[maybe_unused]] Status noCuda(const char* what) {
  return Unavailable(std::string(what) +
                     ": CUDA tensors given but cofab was built without CUDA "
                     "(COFAB_WITH_CUDA=OFF or nvcc not found)");
}

}  // namespace

Status reduce(const ReduceArgs& a) {
  COFAB_RETURN_IF_ERROR(validateReduce(a));
  if (a.output.device.isCpu()) return reduceCpu(a);
#if COFAB_HAVE_CUDA
  return cuda::reduce(a);
#else
  return noCuda("reduce");
#endif
}

Status xorBuffers(const XorArgs& a) {
  COFAB_RETURN_IF_ERROR(validateXor(a));
  if (a.device.isCpu()) return xorBuffersCpu(a);
#if COFAB_HAVE_CUDA
  return cuda::xorBuffers(a);
#else
  return noCuda("xorBuffers");
#endif
}

Status gemmF32(const GemmArgs& g) {
  COFAB_RETURN_IF_ERROR(validateGemm(g));
  if (g.device.isCpu()) return gemmF32Cpu(g);
#if COFAB_HAVE_CUDA
  return cuda::gemmF32(g);
#else
  return noCuda("gemmF32");
#endif
}

Status linearCombine(const CombineArgs& c) {
  COFAB_RETURN_IF_ERROR(validateCombine(c));
  if (c.device.isCpu()) return linearCombineCpu(c);
#if COFAB_HAVE_CUDA
  return cuda::linearCombine(c);
#else
  return noCuda("linearCombine");
#endif
}

}  // namespace cofab::gpu

// CUDA implementations behind gpu/reduce.h, gpu/xor.h and gpu/linear_combine.h. Compiled only
// when COFAB_HAVE_CUDA; called by gpu/ops.cc after validation.
#pragma once

#include "gpu/linear_combine.h"
#include "gpu/reduce.h"
#include "gpu/xor.h"

namespace cofab::gpu::cuda {

Status reduce(const ReduceArgs& args);
Status xorBuffers(const XorArgs& args);
Status gemmF32(const GemmArgs& args);
Status linearCombine(const CombineArgs& args);

}  // namespace cofab::gpu::cuda

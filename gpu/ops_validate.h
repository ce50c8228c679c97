// Argument checks shared by the CPU twins and the CUDA paths, so both reject the same inputs
// with the same messages. Internal to gpu/.
#pragma once

#include "gpu/linear_combine.h"
#include "gpu/reduce.h"
#include "gpu/xor.h"

namespace cofab::gpu {

// Kernel arguments carry input pointers by value (no device-side pointer arrays to manage).
inline constexpr size_t kMaxKernelInputs = 64;

Status validateReduce(const ReduceArgs& args);
Status validateXor(const XorArgs& args);
Status validateGemm(const GemmArgs& args);
Status validateCombine(const CombineArgs& args);

}  // namespace cofab::gpu

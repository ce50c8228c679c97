// Per-element math of the XOR kernels, shared by the CUDA kernel (gpu/xor_kernels.cu) and its
// CPU twins (gpu/xor_cpu.cc, coding/shuffle/xor_bytes.cc), so CPU tests test what the GPU runs.
#pragma once

#include <cstdint>

#include "core/half.h"  // COFAB_HD

namespace cofab::gpu {

struct XorWords {
  COFAB_HD uint64_t operator()(uint64_t a, uint64_t b) const { return a ^ b; }
  COFAB_HD uint8_t byte(uint8_t a, uint8_t b) const { return static_cast<uint8_t>(a ^ b); }
};

}  // namespace cofab::gpu

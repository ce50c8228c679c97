// dst = srcs[0] ^ srcs[1] ^ ... over raw bytes, on CPU or GPU behind one interface: the XOR
// encode and decode of coded shuffling. Per-word math shared with the CPU twin (gpu/xor_math.h).
// Buffers are the caller's; dst may be one of the sources. CUDA calls are asynchronous on
// `stream`. Any thread.
#pragma once

#include <cstddef>
#include <span>

#include "core/status.h"
#include "core/tensor.h"

namespace cofab::gpu {

struct XorArgs {
  std::span<const void* const> srcs;  // >= 1
  void* dst = nullptr;
  size_t bytes = 0;
  Device device;
  void* stream = nullptr;
};

Status xorBuffers(const XorArgs& args);
Status xorBuffersCpu(const XorArgs& args);

}  // namespace cofab::gpu

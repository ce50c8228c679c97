// Checks that memory handed to a CUDA path can be read there, before a kernel touches it. A
// host pointer labelled as a CUDA tensor would otherwise fault on the device ("illegal memory
// access"), and that error is sticky: the process's CUDA context is lost for every later call,
// not only this one. One cudaPointerGetAttributes per pointer (about half a microsecond on an
// H100) buys a clear InvalidArgument instead. CUDA-only; internal to gpu/.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "gpu/cuda/cuda_status.h"

namespace cofab::gpu::cuda {

// Whether `device` reads pageable host memory directly (HMM or ATS systems): then any host
// pointer is fine.
inline bool pageableAccess(int device) {
  int v = 0;
  return cudaDeviceGetAttribute(&v, cudaDevAttrPageableMemoryAccess, device) == cudaSuccess &&
         v != 0;
}

// OK when `p` is memory of CUDA device `device`, managed memory, or host memory the device can
// address (pinned, or any where pageableAccess holds). `what` (and `index`, when >= 0) name the
// argument in the error; the name is only built then, since this runs on every kernel call.
inline Status checkDevicePointer(const void* p, int device, const char* what, int index = -1) {
  if (p == nullptr) return OkStatus();  // null with nothing to touch: ops_validate's business
  cudaPointerAttributes a{};
  COFAB_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&a, p));
  auto name = [&] { return std::string(what) + (index >= 0 ? " " + std::to_string(index) : ""); };
  switch (a.type) {
    case cudaMemoryTypeDevice:
      if (a.device == device) return OkStatus();
      return InvalidArgument(name() + " is memory of CUDA device " + std::to_string(a.device) +
                             ", but the call runs on device " + std::to_string(device));
    case cudaMemoryTypeManaged:
    case cudaMemoryTypeHost:
      return OkStatus();
    default:
      if (pageableAccess(device)) return OkStatus();
      return InvalidArgument(name() + " is host memory that CUDA device " + std::to_string(device) +
                             " cannot read (a CPU buffer labelled as a CUDA tensor?); pass "
                             "device memory, or pin the buffer with cudaHostRegister");
  }
}

}  // namespace cofab::gpu::cuda

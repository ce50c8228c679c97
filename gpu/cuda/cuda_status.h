// Turns CUDA runtime and cuBLAS results into Status naming the call (DESIGN.md §2). CUDA-only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "core/status.h"

namespace cofab::gpu::cuda {

inline Status cudaStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return OkStatus();
  // Reported here, so taken off the thread's last-error slot: otherwise the next launch check
  // (cudaGetLastError after a kernel launch) finds it and fails a call that went well. Seen on an
  // H100: a refused device index failed the next test's kernel launch. Sticky errors stay anyway.
  (void)cudaGetLastError();
  std::string msg = std::string(call) + " failed: " + cudaGetErrorString(err) + " (cudaError " +
                    std::to_string(static_cast<int>(err)) + ")";
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    return Unavailable(std::move(msg));
  }
  // GPUs exist but the caller named one past them: the argument is wrong, not the machine.
  if (err == cudaErrorInvalidDevice) {
    int count = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess) {
      msg += ": this machine has " + std::to_string(count) + " CUDA device(s), numbered from 0";
    }
    return InvalidArgument(std::move(msg));
  }
  if (err == cudaErrorMemoryAllocation) return ResourceExhausted(std::move(msg));
  return Internal(std::move(msg));
}

// cudaSetDevice after checking the index against the GPUs there are: a wrong index is refused
// without asking CUDA to fail, so the refusal leaves no API error behind (compute-sanitizer
// reports each one) and a negative index reads the same as one past the end.
inline Status setDevice(int device) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return cudaStatus(err, "cudaGetDeviceCount");
  }
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) + ": this machine has " +
                           std::to_string(count) + " CUDA device(s), numbered from 0");
  }
  return cudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

// Takes an error that an earlier call left unread (the application's own, ignored) off the
// thread's last-error slot before cofab launches: a launch is checked with cudaGetLastError,
// which would return that error and fail a call whose kernels were queued and will run, so the
// caller would see an error for a call that went on writing its output.
inline void clearUnreadError() { (void)cudaGetLastError(); }

inline Status cublasStatus(cublasStatus_t st, const char* call) {
  if (st == CUBLAS_STATUS_SUCCESS) return OkStatus();
  std::string msg =
      std::string(call) + " failed: cublasStatus " + std::to_string(static_cast<int>(st));
  if (st == CUBLAS_STATUS_NOT_INITIALIZED) return Unavailable(std::move(msg));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhausted(std::move(msg));
  return Internal(std::move(msg));
}

}  // namespace cofab::gpu::cuda

#define COFAB_CUDA_RETURN_IF_ERROR(call) \
  COFAB_RETURN_IF_ERROR(::cofab::gpu::cuda::cudaStatus((call), #call))
#define COFAB_CUBLAS_RETURN_IF_ERROR(call) \
  COFAB_RETURN_IF_ERROR(::cofab::gpu::cuda::cublasStatus((call), #call))

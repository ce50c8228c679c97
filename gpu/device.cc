#include "gpu/device.h"

#include "core/config.h"

#if COFAB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cofab::gpu {

StatusOr<int> deviceCount() {
#if COFAB_HAVE_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Error 35 (cudaErrorInsufficientDriver) on a machine without a GPU driver; count is
    // left untouched then, so it must not be read.
    return Unavailable("no usable CUDA device: cudaGetDeviceCount returned " +
                       std::to_string(static_cast<int>(err)) + " (" + cudaGetErrorString(err) +
                       ")");
  }
  if (count == 0) return Unavailable("no usable CUDA device: cudaGetDeviceCount found 0");
  return count;
#else
  return Unavailable("cofab was built without CUDA (COFAB_WITH_CUDA=OFF or nvcc not found)");
#endif
}

std::string describeDevices() {
  auto n = deviceCount();
  if (!n.ok()) return "unusable: " + n.status().message();
#if COFAB_HAVE_CUDA
  std::string out = std::to_string(*n) + " device(s):";
  for (int i = 0; i < *n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      out += std::string(" [") + std::to_string(i) + "] " + prop.name + " sm_" +
             std::to_string(prop.major) + std::to_string(prop.minor);
    }
  }
  return out;
#else
  return "unusable";
#endif
}

}  // namespace cofab::gpu

// CUDA device discovery. Without a usable GPU (not built with CUDA, no driver, no device) the
// calls report Unavailable with the reason, so callers and tests can say why they skip
// (DESIGN.md §5). The CUDA runtime is linked, never libcuda directly.
#pragma once

#include <string>

#include "core/status.h"

namespace cofab::gpu {

// Number of CUDA devices usable here; Unavailable (with cudaGetDeviceCount's error code and
// text) when there are none.
StatusOr<int> deviceCount();

// One line for cofab-info: "2 device(s): NVIDIA H100 ..." or the reason none is usable.
std::string describeDevices();

}  // namespace cofab::gpu

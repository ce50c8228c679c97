// A minimal raw DPDK sender/receiver over memif: the frame rate the dpdk transport is compared
// with. No cofab code on the path: one port, one queue, bursts of 32 pre-sized frames.
// Run each side in its own process (one EAL per process); both return after `seconds`.
#pragma once

#include <string>

namespace cofab::bench {

struct RawResult {
  bool ok = false;
  std::string error;
  double gbps = 0;  // frame bytes (Ethernet header included) per second, receiver side
  double mpps = 0;
};

// Starts EAL with `ealArgs` (memif vdev included), then sends or receives `frameBytes`-byte
// frames for `seconds`.
RawResult runRawMemif(const std::string& ealArgs, bool sender, int frameBytes, double seconds);

}  // namespace cofab::bench

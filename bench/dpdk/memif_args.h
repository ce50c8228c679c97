// EAL arguments and memif vdev strings for the dpdk benches' two processes (../shared/MACHINE.md:
// the memif server on lcore 1, the client on lcore 0, no hugepages, no PCI probe).
#pragma once

#include <string>

namespace cofab::bench {

inline std::string memifEalArgs(bool server) {
  return server ? "-l 1 --no-huge -m 256 --no-pci --no-shconf --no-telemetry"
                : "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";
}

// A memif port on the socket file `sock` (not abstract, so that it lives in the bench's temp dir).
inline std::string memifVdev(const std::string& sock, bool server) {
  return "net_memif0,role=" + std::string(server ? "server" : "client") + ",socket=" + sock +
         ",socket-abstract=no";
}

}  // namespace cofab::bench

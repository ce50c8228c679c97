// EAL arguments and memif vdev strings for the dpdk benches' two processes (../shared/MACHINE.md:
// the memif server on lcore 1, the client on lcore 0, no hugepages, no PCI probe).
#pragma once

#include <string>

namespace cofab::bench {

// `zeroCopy` (client only): memif's zero-copy mode, in which the client lends its own mbuf
// memory to the server, and the server copies every frame into and out of it. DPDK takes it
// only with one file per memory segment list (--single-file-segments; --no-huge memory is a
// memfd, so no hugepages are needed).
inline std::string memifEalArgs(bool server, bool zeroCopy = false) {
  std::string args = server ? "-l 1 --no-huge -m 256 --no-pci --no-shconf --no-telemetry"
                            : "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";
  if (zeroCopy && !server) args += " --single-file-segments";
  return args;
}

// A memif port on the socket file `sock` (not abstract, so that it lives in the bench's temp dir).
inline std::string memifVdev(const std::string& sock, bool server, bool zeroCopy = false) {
  return "net_memif0,role=" + std::string(server ? "server" : "client") + ",socket=" + sock +
         ",socket-abstract=no" + (zeroCopy && !server ? ",zero-copy=yes" : "");
}

}  // namespace cofab::bench

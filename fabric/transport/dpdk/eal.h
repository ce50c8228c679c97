// Eal: the once-per-process guard around DPDK's Environment Abstraction Layer and the ports it
// opened. Internal to fabric/transport/dpdk.
//
// EAL can start only once per process (a second rte_eal_init fails), so the first context to
// ask starts it with COFAB_DPDK_EAL_ARGS plus one --vdev per entry of COFAB_DPDK_VDEV, and the
// result — success or the failure's reason — is kept for the life of the process. Every port
// EAL probed is set up once (one RX and one TX queue, an mbuf pool) and lent to one context at a
// time; with no port at all, contexts get in-process ring ports (port.h). Never started from a
// static initialiser; never torn down (DPDK cannot restart EAL in a process anyway). Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "fabric/transport/dpdk/port.h"

namespace cofab::transport::dpdk {

class Eal {
 public:
  // Starts EAL on the first call; Unavailable with the reason when it cannot.
  static StatusOr<Eal*> get();

  // Lends a port: `wanted` is a port name (e.g. "net_memif0") or empty for the first free one.
  StatusOr<Port*> acquirePort(const std::string& wanted);
  // Takes the port back; frames still queued on it are freed.
  void releasePort(Port* port);

  // Ring mode: the RX ring of the in-use ring port with `mac`, or null.
  Port* ringPeer(const MacAddress& mac);

  bool ringMode() const { return ringMode_; }

 private:
  Eal() = default;
  Status start();
  StatusOr<Port*> setupPort(uint16_t portId, rte_ring* ringRx, rte_ring* ringTx,
                            const std::string& name, std::string_view vdevSpec,
                            const MacAddress* macOverride);

  std::mutex mu_;
  bool ringMode_ = false;
  std::vector<std::unique_ptr<Port>> ports_;
  // Ring ports in a fixed array so that the switch can read it without a lock.
  static constexpr int kMaxRingPorts = 8;
  std::atomic<Port*> ringPorts_[kMaxRingPorts] = {};
  int ringPortCount_ = 0;
};

}  // namespace cofab::transport::dpdk

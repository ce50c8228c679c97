// Port: one DPDK ethdev port with one RX and one TX queue, its mbuf pool, and the Waker its
// poller sleeps on. Internal to fabric/transport/dpdk.
//
// Ports are process-lifetime resources owned by the Eal guard (eal.h): a context borrows one
// exclusively (only its poller thread calls rxBurst/txBurst) and gives it back on join. They are
// never destroyed, because mbufs from a port's pool may still sit in another port's ring (ring
// mode) or in a PMD's queue after the context that used it is gone.
//
// Ring mode (no --vdev and no PCI port): each context gets a port made with rte_eth_from_rings;
// txBurst() hands the frames to the net_ring PMD and then moves them from this port's TX ring to
// the RX ring of the ring port that owns the destination MAC (a software switch inside the
// process), waking that port's poller if it sleeps.
#pragma once

#include <rte_mbuf.h>
#include <rte_ring.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/transport/dpdk/frame.h"

namespace cofab::transport::dpdk {

// Lets other threads wake a poller that went to sleep because it had nothing to do.
// Both sides make a read-modify-write of sleeping_ (no standalone fences, which TSan cannot
// model and GCC refuses under -fsanitize=thread -Werror): the RMWs are totally ordered, so
// either the producer's comes first and the poller's exchange synchronizes with it (its
// hasWork() then sees the enqueue), or the poller's comes first and the producer reads 1 and
// notifies under the mutex the poller holds until it waits.
class Waker {
 public:
  // Called by producers after they made work visible (an enqueue).
  void wake() {
    if (sleeping_.fetch_add(0, std::memory_order_acq_rel) != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_one();
    }
  }
  // Called by the poller: sleeps up to `d` unless `hasWork()` (checked after announcing the
  // sleep, so a concurrent wake() is never lost).
  template <typename Pred>
  void sleepFor(Duration d, Pred hasWork) {
    std::unique_lock<std::mutex> lock(mu_);
    sleeping_.exchange(1, std::memory_order_acq_rel);
    if (!hasWork()) cv_.wait_for(lock, d);
    sleeping_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<int> sleeping_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

class Eal;

class Port {
 public:
  Port(Eal* eal, uint16_t portId, std::string name, rte_mempool* pool, MacAddress mac, uint16_t mtu,
       rte_ring* ringRx, rte_ring* ringTx, bool rxArrivesCold)
      : eal_(eal),
        portId_(portId),
        name_(std::move(name)),
        pool_(pool),
        mac_(mac),
        mtu_(mtu),
        ringRx_(ringRx),
        ringTx_(ringTx),
        rxArrivesCold_(rxArrivesCold) {}

  uint16_t rxBurst(rte_mbuf** pkts, uint16_t n);
  // Returns how many frames were taken; the caller frees or retries the rest.
  uint16_t txBurst(rte_mbuf** pkts, uint16_t n);
  // Whether frames wait in the RX ring (ring mode only; false for PMD ports, which cannot say).
  bool rxPending() const { return ringRx_ != nullptr && rte_ring_count(ringRx_) > 0; }
  bool ringMode() const { return ringRx_ != nullptr; }

  uint16_t portId() const { return portId_; }
  const std::string& name() const { return name_; }
  rte_mempool* pool() const { return pool_; }
  const MacAddress& mac() const { return mac_; }
  uint16_t mtu() const { return mtu_; }
  // Whether received frames' bytes are not in this core's cache (driver_traits.h): the
  // poller then prefetches the next frame of a burst while it handles the current one.
  bool rxArrivesCold() const { return rxArrivesCold_; }
  Waker& waker() { return waker_; }

  // Owned by Eal, which hands the port out to one context at a time.
  std::atomic<bool> inUse{false};

 private:
  Eal* const eal_;
  const uint16_t portId_;
  const std::string name_;
  rte_mempool* const pool_;
  const MacAddress mac_;
  const uint16_t mtu_;
  rte_ring* const ringRx_;
  rte_ring* const ringTx_;
  const bool rxArrivesCold_;
  Waker waker_;
};

// Wraps a failed DPDK call: "<call> failed: <rte_strerror> (rte_errno N)".
Status dpdkError(StatusCode code, std::string_view call, int err);

}  // namespace cofab::transport::dpdk

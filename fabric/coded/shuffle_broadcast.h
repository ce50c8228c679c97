// Coded shuffling over DPDK Ethernet broadcast on a shared L2 segment (the second multicast path
// next to shuffle_relay.h's aggregator fan-out; built only with DPDK).
//
// The master sends every message of an epoch (shuffleEpochMessages() numbering: coded = the
// plan's multicasts, uncoded = one per needed row) exactly once as UDP frames to
// ff:ff:ff:ff:ff:ff / 255.255.255.255, so one frame reaches every worker on the segment and the
// master's egress is messages x rowBytes (+ per-frame headers) either way: coded sends fewer
// messages. Frames use the dpdk transport's layout (frame.h: Ethernet/IPv4/UDP + the 32-byte
// cofab header with its CRC32C) on UDP port kShuffleUdpPort, the header fields reused as
//   Data: dstConn = epoch tag (epoch << 1 | coded), srcConn = message id, seq = byte offset,
//         ack = segment index, window = segments in the message; payload = the segment
//   Fin:  dstConn = epoch tag, seq = the master's round: "everything was sent, report gaps"
//   Ack:  (worker -> master, unicast to the MAC the data came from) dstConn = epoch tag,
//         srcConn = worker; payload = the missing message ids (u32 LE) — a NACK; an empty
//         one says "done, look at the store" (a hint that saves waiting for the next round)
// Reliability: af_packet rings can drop frames. After the first pass the master broadcasts a Fin
// every kRoundMs; a worker that still misses messages answers it with a NACK and the master
// re-broadcasts those messages. A worker that has everything sets "<prefix>/done/<tag>/<w>" in
// the Store (reliable, so the master never waits on a lost "done" frame); the master returns
// once every worker's key is there (and removes them), or fails at the deadline naming the
// workers missing. A worker whose rowBytes differs from the master's (frames that pass their
// CRCs but cut the row differently) fails at once with InvalidArgument and writes why into its
// done key; the master then fails with RemoteError naming that worker and the reason.
//
// One EAL per process (eal.h): an endpoint takes the process's first DPDK port (COFAB_DPDK_VDEV,
// e.g. an af_packet vdev on a veth in a bridge) for its lifetime; ring mode (no vdev) has no
// shared segment and is refused. Threads: one thread at a time per endpoint; it polls the port
// itself (no I/O thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "coding/shuffle/coded_shuffle.h"
#include "core/clock.h"
#include "core/status.h"
#include "fabric/rendezvous/store.h"

namespace cofab::transport::dpdk {
class Port;
}

namespace cofab::coded {

inline constexpr uint16_t kShuffleUdpPort = 47900;

struct BroadcastShuffleStats {
  uint64_t egressBytes = 0;     // every frame the master sent (data, re-sends, Fins), wire bytes
  uint64_t firstPassBytes = 0;  // the first pass's data frames, wire bytes (headers included)
  uint64_t payloadBytes = 0;    // messages x rowBytes
  int64_t messages = 0;
  int64_t frames = 0;          // all frames sent
  int64_t resentMessages = 0;  // re-broadcasts after NACKs
  int64_t rounds = 0;          // Fin rounds until every worker was done
};

// One side of the broadcast shuffle; owns the DPDK port it borrowed until destroyed.
class BroadcastShuffleEndpoint {
 public:
  // rank: the worker index, or -1 for the master. prefix: Store key prefix shared by the job.
  static StatusOr<std::unique_ptr<BroadcastShuffleEndpoint>> open(Store& store, std::string prefix,
                                                                  int rank);
  ~BroadcastShuffleEndpoint();
  BroadcastShuffleEndpoint(const BroadcastShuffleEndpoint&) = delete;
  BroadcastShuffleEndpoint& operator=(const BroadcastShuffleEndpoint&) = delete;

  // Master: one epoch, coded or uncoded, to `workers` workers.
  StatusOr<BroadcastShuffleStats> sendEpoch(const coding::CodedShuffle& shuffle,
                                            const coding::ShufflePlan& plan, bool coded,
                                            std::span<const uint8_t> data, size_t rowBytes,
                                            Deadline deadline);

  // Worker: receives what it needs of the epoch and rebuilds batchOut (plan.batch[rank] order).
  Status receiveEpoch(const coding::CodedShuffle& shuffle, const coding::ShufflePlan& plan,
                      bool coded, const coding::WorkerCache& cache, size_t rowBytes,
                      std::span<uint8_t> batchOut, Deadline deadline);

  // Frames received that were not for this endpoint or failed their checks (diagnostics).
  int64_t framesIgnored() const { return ignored_; }

  struct Impl;

 private:
  BroadcastShuffleEndpoint() = default;
  // receiveEpoch() but for telling the master why it failed.
  Status receiveEpochOnce(const coding::CodedShuffle& shuffle, const coding::ShufflePlan& plan,
                          bool coded, const coding::WorkerCache& cache, size_t rowBytes,
                          std::span<uint8_t> batchOut, Deadline deadline);
  // Master: drops the epoch's done keys and plan key (nobody reads them again); the first error.
  Status removeDoneKeys(uint32_t tag, int workers);
  Store* store_ = nullptr;
  std::string prefix_;
  int rank_ = -1;
  transport::dpdk::Port* port_ = nullptr;
  int64_t ignored_ = 0;
};

}  // namespace cofab::coded

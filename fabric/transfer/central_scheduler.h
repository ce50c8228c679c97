// CentralScheduler: MLfabric's central scheduling mode (request -> grant -> delivered), the
// service behind `cofab-sched`. Workers' TransferManagers (TransferOptions::scheduler) ask it for
// a grant before sending each unit to its destination daemon and report delivery when the daemon
// acknowledged the unit. The scheduler keeps one FIFO queue of requests per destination and
//   - grants a request only while the destination's load (bytes granted and not yet delivered)
//     stays within destBytes (one unit may always go to an idle destination, so a unit larger
//     than destBytes cannot wedge),
//   - chooses the destination: a request names its candidate destinations (a worker's
//     equivalent units: the queued chunks of one update, which may travel in any order) and is
//     granted toward the least loaded candidate that has room; across requests, the least
//     loaded destination is served first,
//   - paces each destination at rateBytesPerSec: a grant carries a start delay (the
//     destination's virtual clock), so the bytes granted to it never start faster than that.
// The destination of a chunk is fixed by fabric/ps/placement.h (every worker must agree on it for
// the aggregation rounds): the scheduler chooses which unit goes next and when, never moves a
// chunk to another daemon (docs/TRANSFER.md, "Central scheduling").
//
// Protocol (its own connection, wire::MessageType::kControl, opcodes SchedOp below):
//   kRequest   worker -> sched  key = request id, iteration = bytes,
//                               payload = candidate destinations, u32 little-endian each
//   kGrant     sched -> worker  key = request id, sequence = the destination chosen,
//                               iteration = start delay in µs (pacing)
//   kDelivered worker -> sched  key = request id (the unit was acknowledged by its daemon);
//                               iteration = 1: given back unused (paced past the caller's
//                               deadline, its acquire gone, its unit dropped): its pacing
//                               slot is returned too
//   kRefuse    sched -> worker  key = request id, payload = reason text (bad destination, more
//                               than kMaxRequestBytes, ...)
// A worker whose connection ends releases the load of its undelivered grants.
//
// Ownership and threads: the scheduler owns its transport context; messages are handled on its
// I/O threads under one mutex (the state is tiny). create() and shutdown() from one thread,
// stats() and address() from any.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace cofab::transfer {

// Opcodes on a scheduler connection (their own space: nothing else travels there). Wire format.
enum class SchedOp : uint8_t { kRequest = 1, kGrant = 2, kDelivered = 3, kRefuse = 4 };

// The largest unit a request may ask for (1 GiB, the wire's largest payload): the bytes are the
// client's claim, added to a destination's load and paced, so larger ones are refused rather than
// granted (an idle destination takes any size) and overflowing that arithmetic.
inline constexpr uint64_t kMaxRequestBytes = uint64_t{1} << 30;

// Store key under which cofab-sched registers its address ("<prefix>/address").
std::string schedulerAddressKey(const std::string& prefix);
// cofab-sched's --dest-bytes / --rate, parsed with the ranges of COFAB_SCHED_DEST_BYTES /
// COFAB_SCHED_RATE (a flag and its variable accept the same values).
StatusOr<int64_t> parseDestBytes(const std::string& text, const std::string& source);
StatusOr<int64_t> parseRate(const std::string& text, const std::string& source);

struct SchedulerOptions {
  int numDestinations = 1;  // the aggregator daemons (destination ids 0..n-1)
  // Bytes granted and not yet delivered per destination; 0: COFAB_SCHED_DEST_BYTES (8 MiB).
  uint64_t destBytes = 0;
  // Pacing per destination in bytes/s, 0 = unpaced; unset: COFAB_SCHED_RATE (default unpaced).
  // Optional, not 0-means-default like destBytes: an explicit 0 (cofab-sched --rate 0) must
  // turn pacing off even where the environment sets a rate.
  std::optional<uint64_t> rateBytesPerSec;
  std::string transport = "tcp";
  std::string listenAddress;  // empty: the transport's default, kernel-chosen port
};

struct SchedDestinationStats {
  uint64_t granted = 0;    // grants issued
  uint64_t delivered = 0;  // grants reported delivered
  uint64_t released = 0;   // grants released because their worker's connection ended
  uint64_t load = 0;       // bytes granted and not delivered, now
  uint64_t maxLoad = 0;    // the most ever
  uint64_t maxGrant = 0;   // the largest single grant (a lone unit may exceed destBytes)
  uint64_t queued = 0;     // requests waiting now
  uint64_t maxQueued = 0;
};

struct SchedulerStats {
  uint64_t destBytes = 0;
  uint64_t rateBytesPerSec = 0;  // the pacing in effect (0: unpaced)
  uint64_t protocolErrors = 0;   // unknown request ids, duplicate deliveries, bad opcodes
  std::vector<SchedDestinationStats> destinations;
};

class CentralScheduler {
 public:
  static StatusOr<std::unique_ptr<CentralScheduler>> create(const SchedulerOptions& options);
  ~CentralScheduler();  // shutdown()
  CentralScheduler(const CentralScheduler&) = delete;
  CentralScheduler& operator=(const CentralScheduler&) = delete;

  const std::string& address() const;
  SchedulerStats stats() const;
  // Closes every connection (workers waiting for a grant see the scheduler gone). Idempotent.
  void shutdown();

  struct Impl;

 private:
  explicit CentralScheduler(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace cofab::transfer

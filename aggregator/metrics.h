// Metrics: the aggregator daemon's counters and gauges, rendered in Prometheus text format for
// the /metrics endpoint.
//
// Updated with relaxed atomics from the transport I/O threads and the engine threads (no locks
// on the hot path); read by the HTTP thread. Owned by AggregatorServer.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/sync_metrics.h"
#include "fabric/ps/ps_protocol.h"

namespace cofab::aggregator {

struct Metrics {
  explicit Metrics(int numWorkers, int numEngines);

  std::atomic<uint64_t> roundsCompleted{0};
  std::atomic<uint64_t> roundsFailed{0};
  std::atomic<uint64_t> roundsSkipped{0};  // rounds nobody contributed to (every worker dropped)
  std::atomic<uint64_t> bytesIn{0};
  std::atomic<uint64_t> bytesOut{0};
  std::atomic<uint64_t> chunksApplied{0};
  std::atomic<uint64_t> chunksDuplicate{0};
  std::atomic<uint64_t> chunksForwarded{0};
  std::atomic<uint64_t> forwardedApplied{0};
  std::atomic<uint64_t> connectionsAccepted{0};
  std::atomic<uint64_t> connectionsBroken{0};
  std::atomic<uint64_t> workersLost{0};
  std::atomic<uint64_t> backupLost{0};
  std::atomic<uint64_t> openRounds{0};
  // (key, chunk) slots held by the engines (each keeps its last result), and fan-out slots freed
  // by ControlOp::kFanOutRelease.
  std::atomic<uint64_t> slots{0};
  std::atomic<uint64_t> fanOutReleased{0};
  // Incast control (docs/TRANSFER.md): the window granted per worker connection (0: credits off),
  // pushes that arrived beyond it, the most any one connection had outstanding, and the receive
  // backlog (payload bytes received and not yet consumed by an engine) now and at its maximum.
  uint64_t creditWindow = 0;
  std::atomic<uint64_t> creditViolations{0};
  std::atomic<uint64_t> creditOutstandingMax{0};
  std::atomic<uint64_t> backlogBytes{0};
  std::atomic<uint64_t> backlogMaxBytes{0};
  std::atomic<uint64_t> backlogMaxChunks{0};
  std::atomic<uint64_t> backlogChunks{0};
  std::array<std::atomic<uint64_t>, ps::kMaxRejectReason + 1> rejects{};
  // Highest iteration of each worker's stored pushes (+1; 0 = nothing yet): lag = max - this.
  std::unique_ptr<std::atomic<uint64_t>[]> workerIteration;
  std::unique_ptr<std::atomic<uint64_t>[]> engineQueueDepth;
  int numWorkers;
  int numEngines;
  SyncMetrics sync;  // model store and compression

  void noteReject(ps::RejectReason reason) {
    rejects[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  void noteWorkerIteration(int rank, uint64_t iteration);
  // A push of `bytes` arrived / was consumed by an engine (receive backlog and credit use).
  // noteReceived returns true when it exceeded the sender's grant; only workers have grants
  // (`granted`), a primary forwarding to its backup does not.
  bool noteReceived(std::atomic<uint64_t>& senderUsed, uint64_t bytes, bool granted);
  void noteConsumed(std::atomic<uint64_t>* senderUsed, uint64_t bytes);
  uint64_t rejectsTotal() const;

  // Prometheus text exposition (version 0.0.4); `up` and `draining` describe the daemon.
  std::string render(int serverId, bool draining) const;
};

}  // namespace cofab::aggregator

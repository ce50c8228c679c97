// TransferManager: decides when each gradient update travels and in what order (MLfabric's
// point: the library, not the network, schedules). A training loop hands it GradientUpdates as
// the backward pass produces them; the manager
//   - fuses small updates (< fuseBelowBytes) into buckets of up to bucketBytes, closed when full,
//     when an update of another dtype/op arrives, or at flush(),
//   - splits large ones into chunks of chunkBytes,
//   - keeps at most maxInFlight units (chunks or buckets) handed to the transport and not yet
//     acknowledged by their daemon, and at most maxOutstanding without their result, and
//     whenever a slot frees picks the next queued unit with its OrderingPolicy (FIFO, priority
//     by layer, earliest deadline): a more urgent update enqueued later overtakes at the next
//     chunk boundary (the units of one wire key still go in enqueue order: a more urgent one
//     lends its urgency to the queued ones of its key instead),
//   - hands each unit to ps::PushPullClient as one single-chunk push-pull (so the client's
//     credits, placement, failover and in-order reduction apply unchanged) and scatters results,
//   - records per unit queued / sent / acknowledged / done times for stats and a Chrome trace.
//
//   COFAB_ASSIGN_OR_RETURN(auto mgr,
//                          transfer::TransferManager::create(*client, {.policy = "priority"}));
//   for (layer = L-1 .. 0) { backward(layer); h[layer] = mgr->enqueue({key, grad, ..., layer}); }
//   mgr->flush();
//   for (layer = 0 .. L-1) { COFAB_RETURN_IF_ERROR(h[layer].wait(Deadline::afterMs(30000)));
//                            forward(layer); }
//
// Cross-worker contract: every worker of the job enqueues the same sequence of updates (keys,
// sizes, dtypes, ops) and calls flush() at the same points, so that every worker forms the same
// buckets and chunks (the daemons sum unit by unit). Orders may differ between workers: the
// result window has a bypass that keeps differing orders from deadlocking (transfer_manager.cc,
// docs/TRANSFER.md).
//
// Deadlines and cancellation: an update whose deadline passes completes with DeadlineExceeded
// (its chunks still queued are dropped, never sent); cancel() drops the queued chunks and
// completes the update with Cancelled. Dropping is per worker: in synchronous training use them
// only when every worker drops the same updates (chunks one worker sent and another dropped
// leave a daemon round open until its --round-timeout-ms). A fused update keeps its place in
// its bucket (the bucket still travels so the workers' buckets match); only its result is not
// delivered.
//
// Ownership and threads: the caller owns the client (it must outlive the manager) and lends
// each update's tensors until its handle completes. A handle completes only once no chunk of
// it is left to send or with the client: after cancel(), a missed deadline or a failed chunk,
// the status is decided at once but the handle completes when the chunks already handed over
// are back (their results may land in `out`); wait() returns DeadlineExceeded meanwhile. enqueue(),
// flush(), cancel(), pause(), resume(), stats() and records() may be called from any thread. One
// dispatcher thread owned by the manager hands units to the client; completions run on the client's
// I/O threads. The destructor fails what is still queued with Cancelled and waits for nothing on
// the wire.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fabric/ps/push_pull.h"
#include "fabric/transfer/ordering_policy.h"
#include "fabric/transfer/sched_client.h"
#include "fabric/transfer/transfer_trace.h"

namespace cofab::transfer {

struct GradientUpdate {
  uint64_t key = 0;
  // The gradient, lent until the handle completes. `out` receives the sum (or average) over the
  // workers; empty (data == nullptr and count == 0): in place into `tensor`.
  TensorView tensor;
  TensorView out;
  uint64_t iteration = 0;  // the model version it was computed on (stats, trace)
  int priority = 0;        // smaller = more urgent; PriorityPolicy: the layer index
  Deadline deadline = Deadline::never();
  ps::ReduceOp op = ps::ReduceOp::kSum;
};

struct TransferOptions {
  // "fifo", "priority" or "deadline"; empty: COFAB_TRANSFER_POLICY (default "priority").
  std::string policy;
  // Units handed to the transport and not yet acknowledged; 0: COFAB_TRANSFER_INFLIGHT (2).
  int maxInFlight = 0;
  // Units handed to the transport whose result has not arrived yet (at least maxInFlight); a
  // unit more urgent than all of them may exceed it once they are all acknowledged (see the
  // .cc: this is what keeps workers with different orders from deadlocking).
  // 0: COFAB_TRANSFER_OUTSTANDING (4).
  int maxOutstanding = 0;
  // Chunk size of large updates; 0 or above the client's chunkBytes: the client's.
  size_t chunkBytes = 0;
  // Updates smaller than this are fused; 0: COFAB_TRANSFER_FUSE_BYTES (64 KiB); -1 would be
  // nonsense, so fusion is turned off with fuseBelowBytes = 1. At most the chunk size (clamped).
  size_t fuseBelowBytes = 0;
  // A bucket is closed once it holds this many bytes, or before an update that would take it
  // past them; 0 or above the chunk size: the chunk size (a bucket is one wire chunk at most).
  size_t bucketBytes = 0;
  // Start paused (nothing is sent until resume()): lets a caller queue a whole set first.
  bool startPaused = false;
  // Central scheduling (MLfabric; cofab-sched, docs/TRANSFER.md): when set, every unit waits for
  // a grant (SchedClient::acquire) before it is handed to the transport, and is reported
  // delivered when its daemon acknowledged it. Not owned; must outlive the manager. A unit whose
  // grant fails (scheduler gone, no grant within grantTimeoutMs) fails its update with that
  // Status. nullptr: COFAB_TRANSFER_SCHEDULER decides: "central" connects to the cofab-sched
  // registered in the store COFAB_STORE names (the manager owns that client), "none" (default):
  // no central scheduler (credits and windows only). While the dispatcher
  // waits for a grant, the destructor waits too (at most grantTimeoutMs).
  SchedClient* scheduler = nullptr;
  // How long one unit waits for its grant; 0: COFAB_TRANSFER_GRANT_TIMEOUT_MS (30000).
  int64_t grantTimeoutMs = 0;
  // Keep about this many TransferRecords: beyond it the oldest are dropped once finished, and
  // past twice it the oldest go even unfinished (records are stats; the units carry on).
  size_t maxRecords = 1 << 16;
};

// Per daemon. Sent units count where they went (the backup once the client failed over from a
// dead primary); queued ones where their placement puts them.
struct DestinationStats {
  uint64_t unitsSent = 0;
  uint64_t bytesSent = 0;
  uint64_t queued = 0;     // units queued for it now
  uint64_t maxQueued = 0;  // the most ever queued for it
};

struct TransferStats {
  uint64_t updatesEnqueued = 0;
  uint64_t updatesCompleted = 0;  // OK
  uint64_t updatesFailed = 0;     // any error other than the two below
  uint64_t updatesCancelled = 0;
  uint64_t deadlinesMissed = 0;
  // Sent: handed to the transport (a unit whose central grant failed never was).
  uint64_t chunksSent = 0;   // units that were a chunk of a large update
  uint64_t bucketsSent = 0;  // units that were a bucket of fused updates
  uint64_t bytesSent = 0;
  uint64_t maxQueued = 0;                      // most units queued at once
  std::vector<DestinationStats> destinations;  // by daemon index
};

namespace detail {
struct UpdateState;
struct ManagerCore;
}  // namespace detail

// Completion of one update. Copyable (shared state); a default-constructed handle is invalid.
class TransferHandle {
 public:
  TransferHandle() = default;
  explicit TransferHandle(std::shared_ptr<detail::UpdateState> s) : state_(std::move(s)) {}

  bool valid() const { return state_ != nullptr; }
  bool test() const;  // finished (successfully or not); never blocks
  // Waits until finished, `deadline` or the update's own deadline: the update's Status;
  // DeadlineExceeded naming the key and the units still queued / in flight otherwise (the
  // update's own deadline fails it for good, the caller's only ends this wait).
  Status wait(Deadline deadline) const;
  Status status() const;  // Unavailable("in progress") before it finished
  uint64_t key() const;

 private:
  friend class TransferManager;
  std::shared_ptr<detail::UpdateState> state_;
};

class TransferManager {
 public:
  // Checks the options (InvalidArgument for an unknown policy) and starts the dispatcher.
  static StatusOr<std::unique_ptr<TransferManager>> create(ps::PushPullClient& client,
                                                           const TransferOptions& options = {});
  ~TransferManager();
  TransferManager(const TransferManager&) = delete;
  TransferManager& operator=(const TransferManager&) = delete;

  // Queues an update (contract above). Argument errors complete the handle at once.
  TransferHandle enqueue(const GradientUpdate& update);
  // Closes the open fusion bucket(s) so they can travel.
  void flush();
  // Drops the update's queued chunks and completes it with Cancelled. FailedPrecondition if it
  // already finished or failed; InvalidArgument for a handle from another manager.
  Status cancel(const TransferHandle& handle);
  // After pause() returns no further unit is taken for sending until resume() (one the
  // dispatcher took just before may still reach the client; in central mode a grant that arrives
  // meanwhile goes back to the scheduler).
  void pause();
  void resume();

  TransferStats stats() const;
  // Every unit still remembered, in enqueue order (sendIndex gives the send order).
  std::vector<TransferRecord> records() const;
  // chromeTraceJson(records(), rank, "worker <rank>") written to `path`.
  Status writeTrace(const std::string& path) const;
  std::string policyName() const;

 private:
  explicit TransferManager(std::shared_ptr<detail::ManagerCore> core);
  std::shared_ptr<detail::ManagerCore> core_;
};

}  // namespace cofab::transfer

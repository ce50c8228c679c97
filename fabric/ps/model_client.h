// ModelClient: a worker's connection to the aggregator daemons' model store — the asynchronous
// parameter server used by bounded-staleness (SSP) training and by EASGD (docs/MODEL_STORE.md).
//
//   auto mc = ps::ModelClient::connect(*store, rank, worldSize, {});
//   COFAB_RETURN_IF_ERROR((*mc)->init(/*key=*/7, w0, Deadline::afterMs(10000)));  // all may call
//   for (uint64_t t = 0;; ++t) {
//     COFAB_ASSIGN_OR_RETURN(uint64_t version, (*mc)->pull(7, w, deadline));
//     ... compute the update `delta` (e.g. -lr * grad) on w ...
//     COFAB_ASSIGN_OR_RETURN(ps::ApplyResult r, (*mc)->apply(7, delta, /*clock=*/t, deadline));
//     // r.outcome == kDropped: the daemon refused it as too stale (see r.staleness)
//   }
//   (*mc)->close();
//
// The daemons keep, per (key, chunk), an f32 vector and a version (number of updates applied).
// A tensor is chunked and placed exactly as push-pull does (fabric/ps/placement.h, the same
// chunkBytes on every worker); model keys are a namespace of their own (key 7 here and key 7 of
// a pushPull are different things).
//
// Two staleness units (docs/MODEL_STORE.md "Staleness units"; pick one per key):
//  - versions (applyAndPull): every update carries the chunk version its delta was computed on
//    (the version of this client's last pull / applyAndPull of that chunk); the daemon applies it
//    if at most tau_v (the daemons' --version-staleness) updates were applied since, else drops
//    it, and in both cases answers with the chunk's fresh value: one round trip per step and
//    nobody ever waits for a slow worker.
//  - clocks (apply + pull, SSP as below): a fast worker waits for the slowest.
//
// Staleness (SSP, bound tau = the daemons' --staleness): every apply carries the worker's clock
// (its iteration, increasing per key). A worker more than tau clocks ahead of the slowest live
// worker is DEFERRED: the daemon holds the update, and apply() blocks, until the slowest catches
// up. An update more than tau clocks behind the fastest worker's applied clock (possible only for
// a worker the daemon had excluded as dead, or a clock that went backwards) is DROPPED and
// reported in the result. A worker whose connection broke stops counting as "slowest" after the
// daemons' --dead-worker-ms; one that close()s leaves at once.
//
// Ownership and threads: the client owns its transport connections (one per daemon, separate from
// any PushPullClient's, so a worker can use both). Every method may be called from any thread and
// blocks until the answer or the deadline; the caller's tensors are only used during the call.
// Errors name the daemon, key and chunk: InvalidArgument / FailedPrecondition for a daemon's
// rejection (wrong size, not initialised), DeadlineExceeded naming the daemons still to answer
// (and, for a deferred apply, the slow worker the daemon is waiting for), Unavailable when a
// daemon is gone (the model store has no replication), DataLoss naming the aggregator when an
// answer does not fit its request (another kind than the request's, a wrong dtype, chunk count
// or size). Errors are not sticky.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/store.h"

namespace cofab::ps {

enum class ApplyOutcome : uint8_t { kApplied, kDropped };  // deferred = the call waits

struct ApplyResult {
  ApplyOutcome outcome = ApplyOutcome::kApplied;  // kDropped: at least one chunk was dropped
  uint64_t version = 0;        // applied: min over chunks of the version after this update
  uint64_t staleness = 0;      // max over chunks (clocks or versions: docs/MODEL_STORE.md)
  uint32_t chunks = 0;         // chunks of the tensor
  uint32_t droppedChunks = 0;  // of which the daemons dropped (the others were applied)
  std::string dropReason;      // the first dropped chunk's reason, from the daemon
};

// One tensor of an applyAndPull: `delta` is added to `key`, whose fresh value lands in `out`
// (same element count; may alias `delta`).
struct ModelUpdate {
  uint64_t key = 0;
  TensorView delta;
  TensorView out;
};

class ModelClient {
 public:
  // Discovers the daemons like PushPullClient::connect (store keys, or options.serverAddresses)
  // and opens its own connection to each, as "worker <rank>". Uses options.transport,
  // storePrefix, serverAddresses, chunkBytes and connectTimeoutMs.
  static StatusOr<std::unique_ptr<ModelClient>> connect(Store& store, int rank, int worldSize,
                                                        const ClientOptions& options = {});
  // Same, only with options.serverAddresses (no store).
  static StatusOr<std::unique_ptr<ModelClient>> connect(int rank, int worldSize,
                                                        const ClientOptions& options);

  ~ModelClient();  // close()
  ModelClient(const ModelClient&) = delete;
  ModelClient& operator=(const ModelClient&) = delete;

  // Sets the initial value of `key` unless someone already did (then a no-op): every worker may
  // call it with the same value. f32 only.
  Status init(uint64_t key, TensorView value, Deadline deadline);
  // Copies the current value into `out`; returns its version (min over chunks).
  StatusOr<uint64_t> pull(uint64_t key, TensorView out, Deadline deadline);
  // Adds `delta` (computed at this worker's iteration `clock`) to the value: version += 1.
  // Blocks while the daemons defer it (SSP); kDropped when too stale.
  StatusOr<ApplyResult> apply(uint64_t key, TensorView delta, uint64_t clock, Deadline deadline);
  // Version-bounded apply-and-pull: each chunk's delta carries the version of this client's last
  // pull / applyAndPull of that chunk (pull the key first: FailedPrecondition otherwise, also
  // when a chunk of it was never received, e.g. after a pull that failed partway); the daemon
  // applies it when at most tau_v versions old, else drops it (reported per update), and
  // answers with the chunk's value, which goes into `out`. Every chunk of every update is in
  // flight at once: one round trip for the whole step. Never blocks on other workers. Every
  // update is checked (base versions known, every chunk's daemon alive) before any request is
  // sent: such a refusal applies none of them, so the step can be retried after a pull.
  StatusOr<std::vector<ApplyResult>> applyAndPull(std::span<const ModelUpdate> updates,
                                                  Deadline deadline);
  // EASGD elastic step: the daemon computes d = alpha * (x - center), center += d, version += 1,
  // and returns d in `diffOut` (may alias `x`); the worker then does x -= d itself.
  Status elastic(uint64_t key, TensorView x, float alpha, TensorView diffOut, Deadline deadline);

  // Tells the daemons this worker stops applying for now (clock-based SSP: nobody waits for it
  // any more) without closing; its next request makes it take part again. For a worker that
  // is done training but must still wait for the others (a barrier) before its final pull.
  void leave();
  // Tells the daemons this worker leaves the model store (it no longer holds others back), then
  // closes the connections; pending calls fail with Cancelled. Idempotent.
  void close();

  int rank() const;
  int numServers() const;
  size_t chunkBytes() const;
  ClientStats stats() const;  // bytesOut / bytesIn: payload bytes

  class Impl;

 private:
  explicit ModelClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cofab::ps

// Internal to fabric/sync: what every SyncAlgorithm implementation shares (the model, the
// per-thread optimizer state, the tensor layout, counters) and the factories of the
// implementations. Not a public header.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "fabric/sync/shared_model.h"
#include "fabric/sync/sync_algorithm.h"

namespace cofab::sync::detail {

class AlgorithmBase : public SyncAlgorithm {
 public:
  // backgroundThread: a thread of the algorithm's own updates the model while training threads
  // use it (shadowsync). With it, or with more than one training thread, the model is a
  // concurrent SharedModel; otherwise the training thread owns it (plain floats).
  AlgorithmBase(std::string name, const SyncOptions& options, const SyncEnv& env, int threads,
                bool backgroundThread = false);
  std::string name() const override { return name_; }
  int threads() const override { return threads_; }
  // Final: the algorithms implement doStart(). Records whether it succeeded, because a start()
  // that failed half way (layout set, client not connected) must not let step() run on the
  // half-made state: checkStep() refuses with FailedPrecondition until a start() succeeded.
  Status start(std::span<const float> initial, const std::vector<size_t>& tensorCounts) final;
  void read(int thread, std::span<float> out) override;
  std::vector<int> partitions() const override { return {env_.rank}; }
  uint64_t globalSamples() const override { return globalSamples_.load(std::memory_order_relaxed); }
  SyncStats stats() const override;
  // Whether the model pays for atomics (see the constructor).
  SharedModel::Access modelAccess() const { return model_.access(); }

 protected:
  // The algorithm's start() (SyncAlgorithm::start's contract).
  virtual Status doStart(std::span<const float> initial,
                         const std::vector<size_t>& tensorCounts) = 0;
  // Whether a background thread of the algorithm's runs (from a successful start() until
  // finish()): start() then refuses, as a second set-up would replace the model and clients
  // that thread uses.
  virtual bool backgroundRunning() const { return false; }
  // Whether the last start() succeeded.
  bool startedOk() const { return startedOk_.load(std::memory_order_acquire); }
  // finish()'s last step, after its collective part (so that the other workers are not left
  // waiting on this caller's sizing mistake): the model into `out`, which must hold exactly the
  // model. InvalidArgument naming both sizes otherwise, with `out` untouched.
  Status readFinal(std::span<float> out) const;
  // Records the layout and the initial model; call first in doStart().
  Status setUp(std::span<const float> initial, const std::vector<size_t>& tensorCounts);
  Status checkStep(int thread, std::span<const float> grad) const;
  // The thread's SGD-with-momentum step on the shared model: model -= lr * v.
  void localSgd(int thread, std::span<const float> grad);
  Deadline deadline() const { return Deadline::afterMs(options_.timeoutMs); }
  float alpha() const;
  std::span<float> tensorOf(std::vector<float>& buf, size_t t) {
    return std::span<float>(buf).subspan(offsets_[t], counts_[t]);
  }
  // Store barrier: every worker sets "<prefix>/<what>/<rank>" and waits for all of them.
  Status storeBarrier(const std::string& what);
  // Adds this worker's samples since the last call to the job's counter in the store and
  // remembers the total.
  Status publishSamples();
  // "<client storePrefix>/sync/<name>/<what>": the job's aggregator namespace, so that groups
  // with daemons of their own (their own storePrefix) keep apart; runs one after another on one
  // store need their own prefix (or store) as the daemons' keys do.
  std::string storeKey(const std::string& what) const;

  const std::string name_;
  const SyncOptions options_;
  const SyncEnv env_;
  const int threads_;
  SharedModel model_;
  std::vector<std::unique_ptr<Momentum>> momentum_;  // per thread
  std::vector<size_t> offsets_, counts_;
  size_t total_ = 0;
  std::chrono::steady_clock::time_point started_;
  // Written by start(), read by the training threads' step() (which the caller starts after it).
  std::atomic<bool> startedOk_{false};
  // The algorithms' sticky failure (docs/SYNC.md §3): the first failed step (or failed part of
  // start()), returned by every later step() and finish(). start() clears it: an earlier run's
  // failure is not the new run's.
  Status failed_;

  // Counters (any thread).
  std::atomic<uint64_t> steps_{0}, syncs_{0}, bytesSent_{0}, bytesReceived_{0};
  std::atomic<uint64_t> localSamples_{0}, unpublishedSamples_{0}, globalSamples_{0};
  std::atomic<uint64_t> staleUpdates_{0}, maxStaleness_{0}, stalenessSum_{0}, applies_{0};
  std::atomic<uint64_t> dropped_{0}, droppedSamples_{0}, skipped_{0};
  // The store's sample counter when this run began (publishSamples() counts from it): 0 but
  // for a shadowsync easgd restart on the store and prefix of an earlier run.
  int64_t samplesBase_ = 0;
};

// A push-pull client to the job's aggregators (env.store, or env.client.serverAddresses).
StatusOr<std::unique_ptr<ps::PushPullClient>> connectPushPull(const SyncEnv& env);

// Waits for every handle, closing the client for one still running at the deadline
// (fabric/ps/push_pull.h; shared with ps::AggregatorCollectives).
using ps::waitEveryHandle;

using AlgorithmPtr = std::unique_ptr<SyncAlgorithm>;
// sync, int8, onebit
StatusOr<AlgorithmPtr> makeBspSync(const SyncOptions& options, const SyncEnv& env);
StatusOr<AlgorithmPtr> makeShadowSync(const SyncOptions& options, const SyncEnv& env);
StatusOr<AlgorithmPtr> makeGossipSync(const SyncOptions& options, const SyncEnv& env);
// ssp, easgd, eawild (ps::ModelClient)
StatusOr<AlgorithmPtr> makeSspSync(const SyncOptions& options, const SyncEnv& env);
StatusOr<AlgorithmPtr> makeElasticSync(const SyncOptions& options, const SyncEnv& env);
// gradcode (gradient coding through cofab-aggd --gradient-stragglers)
StatusOr<AlgorithmPtr> makeGradcodeSync(const SyncOptions& options, const SyncEnv& env);

}  // namespace cofab::sync::detail

// ssp, easgd, eawild: the algorithms on the aggregators' model store (ps::ModelClient).
//
// ssp: the parameter server holds the model. Each step a worker sends its SGD-with-momentum
//   update as a delta (-lr/W * v, so that W workers' updates add up to one synchronous step) and
//   gets the model back. stalenessUnit "versions" (default): one apply-and-pull round trip for
//   all tensors; the daemons drop an update more than --version-staleness versions old (its
//   samples are then not counted as the job's), nobody waits. "clocks": apply then pull; a worker
//   more than --staleness clocks ahead of the slowest waits inside apply().
// easgd: each worker trains its local model (SGD with momentum, full lr); every syncEvery steps
//   it makes the elastic move with the center held by the daemons: d = alpha (x - c),
//   c += d, x -= d.
// eawild: easgd with `threads` Hogwild threads per worker, all updating one SharedModel
//   (relaxed atomic adds) with lr / threads each, thread 0 doing the elastic moves.
// The job's sample count goes through the store (publishSamples()); finish() waits for every
// worker in the store, then pulls the server's model (ssp) or the center (easgd, eawild).
#include "fabric/ps/model_client.h"
#include "fabric/sync/algorithm_base.h"

namespace cofab::sync::detail {
namespace {

class ModelStoreSync : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;

  Status doStart(std::span<const float> initial,
                 const std::vector<size_t>& tensorCounts) override {
    COFAB_RETURN_IF_ERROR(setUp(initial, tensorCounts));
    if (env_.store == nullptr) return InvalidArgument("sync " + name_ + " needs env.store");
    COFAB_ASSIGN_OR_RETURN(
        client_, ps::ModelClient::connect(*env_.store, env_.rank, env_.worldSize, env_.client));
    buf_.assign(initial.begin(), initial.end());
    for (size_t t = 0; t < counts_.size(); ++t) {
      COFAB_RETURN_IF_ERROR(client_->init(t, view(buf_, t), deadline()));
    }
    COFAB_RETURN_IF_ERROR(pullAll(buf_));  // first writer won: everyone starts from its model
    model_.assign(buf_);
    return OkStatus();
  }

  Status finish(std::span<float> out) override {
    if (client_ == nullptr) return FailedPrecondition("sync " + name_ + ": start() not called");
    Status s = publishSamples();
    // Done applying: under clock-based SSP the others may be held waiting for this worker's
    // clock; leaving first lets them finish their last steps and reach the barrier too.
    client_->leave();
    if (s.ok()) s = storeBarrier("finish");
    // Past the barrier every worker has published its last samples: read the total again
    // (adding nothing), so globalSamples() is the job's on every worker, not only the last.
    if (s.ok()) s = publishSamples();
    if (s.ok()) s = pullAll(buf_);
    if (s.ok()) model_.assign(buf_);
    recordBytes();
    client_->close();
    const Status read = readFinal(out);
    if (!failed_.ok()) return failed_;  // after the collective part: the others still finish
    return s.ok() ? read : s;
  }

 protected:
  TensorView view(std::vector<float>& b, size_t t) {
    return TensorView(b.data() + offsets_[t], counts_[t], DType::kF32);
  }
  Status pullAll(std::vector<float>& into) {
    for (size_t t = 0; t < counts_.size(); ++t) {
      COFAB_RETURN_IF_ERROR(client_->pull(t, view(into, t), deadline()).status());
    }
    return OkStatus();
  }
  void recordBytes() {
    ps::ClientStats s = client_->stats();
    bytesSent_.store(s.bytesOut);
    bytesReceived_.store(s.bytesIn);
  }

  std::unique_ptr<ps::ModelClient> client_;
  std::vector<float> buf_;  // the syncing thread's scratch
  // ssp's step failures are sticky too (failed_): part of an update may have been applied
  // (tensor by tensor, or by the daemon after the wait gave up), so a retry could apply it twice.
};

class SspSync final : public ModelStoreSync {
 public:
  SspSync(const SyncOptions& options, const SyncEnv& env)
      : ModelStoreSync("ssp", options, env, 1) {}

  Status step(int thread, std::span<const float> grad, uint64_t step, uint64_t samples) override {
    COFAB_RETURN_IF_ERROR(checkStep(thread, grad));
    COFAB_RETURN_IF_ERROR(failed_);
    const float scale = -options_.lr / float(env_.worldSize);
    momentum_[0]->updateScaled(grad, scale, buf_);
    bool dropped = false;
    if (Status st = exchange(step, &dropped); !st.ok()) {
      failed_ = st.withContext("sync ssp: step " + std::to_string(step));
      return failed_;
    }
    model_.write(0, buf_);
    steps_.fetch_add(1);
    syncs_.fetch_add(1);
    localSamples_.fetch_add(samples);
    // Honest throughput: a step the daemons (partly) dropped did not train the job's model.
    (dropped ? droppedSamples_ : unpublishedSamples_).fetch_add(samples);
    recordBytes();
    // The store add is a round trip of its own: publish every few steps (finish() publishes the
    // rest, so the job's total stays exact; the epoch ends a few steps late at most).
    if (++sincePublish_ < kPublishEvery) return OkStatus();
    sincePublish_ = 0;
    // Sticky like an exchange failure: the step's update is applied, and a caller that retried
    // the step on this error would apply it twice.
    if (Status published = publishSamples(); !published.ok()) {
      failed_ = published.withContext("sync ssp: step " + std::to_string(step));
      return failed_;
    }
    return OkStatus();
  }

 private:
  static constexpr int kPublishEvery = 8;

  // Sends the update in buf_ and brings the model back into it.
  Status exchange(uint64_t step, bool* dropped) {
    if (options_.stalenessUnit == "clocks") {
      for (size_t t = 0; t < counts_.size(); ++t) {
        COFAB_ASSIGN_OR_RETURN(ps::ApplyResult r,
                               client_->apply(t, view(buf_, t), step, deadline()));
        *dropped |= count(r);
      }
      return pullAll(buf_);
    }
    // The fresh model comes back into buf_, over the deltas (the client copied them first).
    updates_.clear();
    for (size_t t = 0; t < counts_.size(); ++t) {
      updates_.push_back(ps::ModelUpdate{t, view(buf_, t), view(buf_, t)});
    }
    COFAB_ASSIGN_OR_RETURN(std::vector<ps::ApplyResult> rs,
                           client_->applyAndPull(updates_, deadline()));
    for (const ps::ApplyResult& r : rs) *dropped |= count(r);
    return OkStatus();
  }

  // Counts one tensor's apply; true when (part of) it was dropped.
  bool count(const ps::ApplyResult& r) {
    if (r.outcome == ps::ApplyOutcome::kDropped) {
      dropped_.fetch_add(1);
      return true;
    }
    // Staleness statistics are over applied updates (a dropped one's exceeds the bound).
    applies_.fetch_add(1);
    stalenessSum_.fetch_add(r.staleness);
    if (r.staleness > 0) staleUpdates_.fetch_add(1);
    uint64_t prev = maxStaleness_.load();
    while (r.staleness > prev && !maxStaleness_.compare_exchange_weak(prev, r.staleness)) {
    }
    return false;
  }

  std::vector<ps::ModelUpdate> updates_;
  int sincePublish_ = 0;
};

class ElasticSync final : public ModelStoreSync {
 public:
  ElasticSync(const SyncOptions& options, const SyncEnv& env)
      : ModelStoreSync(options.algorithm, options, env,
                       options.algorithm == "eawild" ? options.threads : 1) {}

  Status step(int thread, std::span<const float> grad, uint64_t step, uint64_t samples) override {
    COFAB_RETURN_IF_ERROR(checkStep(thread, grad));
    COFAB_RETURN_IF_ERROR(stickyFailure());
    // Hogwild: concurrent with the other threads' steps. Each of the T threads steps with lr / T
    // on its share of the worker's batch, so the worker moves as far per sample as easgd does.
    model_.add(momentum_[size_t(thread)]->update(grad), -options_.lr / float(threads_));
    steps_.fetch_add(1);
    unpublishedSamples_.fetch_add(samples);
    localSamples_.fetch_add(samples);
    if (thread != 0 || (step + 1) % uint64_t(options_.syncEvery) != 0) return OkStatus();
    // Elastic move, tensor by tensor, on a snapshot of the (still moving) shared model.
    model_.read(buf_);
    for (size_t t = 0; t < counts_.size(); ++t) {
      // A failed move may still have moved the center (the request went out), and the tensors
      // before it have moved: the run cannot go on as if nothing happened (docs/SYNC.md §3).
      Status moved = client_->elastic(t, view(buf_, t), alpha(), view(buf_, t), deadline());
      if (!moved.ok()) {
        return fail(
            moved.withContext("sync " + name_ + ": elastic move of tensor " + std::to_string(t)));
      }
      model_.add(offsets_[t], tensorOf(buf_, t), -1.0f);
    }
    syncs_.fetch_add(1);
    recordBytes();
    Status published = publishSamples();
    return published.ok() ? published : fail(published);
  }

 private:
  // failed_ under failMu_: eawild's other threads read it in their steps while thread 0 sets it
  // (finish() reads it after every training thread has returned). The flag keeps the Hogwild
  // threads' steps off the mutex until something failed.
  Status stickyFailure() {
    if (!hasFailed_.load(std::memory_order_acquire)) return OkStatus();
    std::lock_guard<std::mutex> lock(failMu_);
    return failed_;
  }
  Status fail(const Status& s) {
    std::lock_guard<std::mutex> lock(failMu_);
    if (failed_.ok()) failed_ = s;
    hasFailed_.store(true, std::memory_order_release);
    return failed_;
  }

  std::atomic<bool> hasFailed_{false};
  std::mutex failMu_;
};

}  // namespace

StatusOr<AlgorithmPtr> makeSspSync(const SyncOptions& options, const SyncEnv& env) {
  return AlgorithmPtr(new SspSync(options, env));
}

StatusOr<AlgorithmPtr> makeElasticSync(const SyncOptions& options, const SyncEnv& env) {
  return AlgorithmPtr(new ElasticSync(options, env));
}

}  // namespace cofab::sync::detail

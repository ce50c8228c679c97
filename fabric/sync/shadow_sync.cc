// shadowsync: the training thread only ever touches its local model (SGD with momentum); a
// background "shadow" thread synchronizes that model with the other workers' at its own pace:
//
//   average: snapshot x_s of the model -> push-pull average a over the workers -> model += a - x_s
//            (the local progress made while the round was in flight is kept on top of a);
//   easgd:   elastic update with the center on the aggregators (ps::ModelClient::elastic).
//
// Each averaging round also carries, in a small extra key summed over the workers, each
// worker's sample count and whether it has finished: the rounds give every worker the job's
// progress (globalSamples()), and the shadow threads stop together after the round in which
// every worker had finished, so all of them do the same number of rounds and end with the
// identical average.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <thread>

#include "fabric/ps/model_client.h"
#include "fabric/ps/push_pull.h"
#include "fabric/sync/algorithm_base.h"

namespace cofab::sync::detail {
namespace {

class ShadowSync final : public AlgorithmBase {
 public:
  ShadowSync(const SyncOptions& options, const SyncEnv& env)
      : AlgorithmBase("shadowsync", options, env, 1, /*backgroundThread=*/true) {}
  ~ShadowSync() override { stopThread(); }

  bool backgroundRunning() const override { return thread_.joinable(); }

  Status doStart(std::span<const float> initial,
                 const std::vector<size_t>& tensorCounts) override {
    {
      // A previous run's finish() (or failure) must not end or fail this run's thread.
      std::lock_guard<std::mutex> lock(mu_);
      done_ = false;
      abort_ = false;
      error_ = OkStatus();
    }
    COFAB_RETURN_IF_ERROR(setUp(initial, tensorCounts));
    const bool easgd = options_.shadowMode == "easgd";
    if (!easgd && options_.shadowMode != "average") {
      return InvalidArgument("shadowsync: shadowMode '" + options_.shadowMode +
                             "' is not 'average' or 'easgd'");
    }
    if (easgd && env_.store == nullptr) return InvalidArgument("shadowsync easgd needs env.store");
    // A new run's figures (a restart after finish() begins from 0; started_ is setUp's).
    for (auto* c : {&steps_, &syncs_, &bytesSent_, &bytesReceived_, &localSamples_,
                    &unpublishedSamples_, &globalSamples_, &samplesAtRound_}) {
      c->store(0);
    }
    clientBytesOut_ = 0;
    clientBytesIn_ = 0;
    snapshot_.assign(initial.begin(), initial.end());
    avg_.resize(total_);
    if (easgd) {
      COFAB_ASSIGN_OR_RETURN(model_client_, ps::ModelClient::connect(*env_.store, env_.rank,
                                                                     env_.worldSize, env_.client));
      // The elastic rounds publish into the store's sample counter, which is not per run (an
      // earlier run on this store and prefix left its total there): this run counts from what
      // is there now. Read before round 0, which nobody leaves before every worker has read it,
      // so no sample of this run is in it yet.
      COFAB_ASSIGN_OR_RETURN(samplesBase_, env_.store->add(storeKey("samples"), 0));
    }
    COFAB_ASSIGN_OR_RETURN(client_, connectPushPull(env_));
    // Round 0 (exact average of the initial models) happens here, before training: start() is
    // collective. In easgd mode too (its client is otherwise only for the final average in
    // finish()): against daemons that served a run already, a new client's round 0 is refused
    // here (finished_iteration), not its final round after a whole run.
    COFAB_RETURN_IF_ERROR(averageRound(/*initial=*/true));
    if (easgd) {
      model_.read(snapshot_);
      for (size_t t = 0; t < counts_.size(); ++t) {
        TensorView v(snapshot_.data() + offsets_[t], counts_[t], DType::kF32);
        COFAB_RETURN_IF_ERROR(model_client_->init(t, v, deadline()));
        COFAB_RETURN_IF_ERROR(model_client_->pull(t, v, deadline()).status());
      }
      model_.assign(snapshot_);
    }
    thread_ = std::thread([this] { shadowLoop(); });
    return OkStatus();
  }

  Status step(int thread, std::span<const float> grad, uint64_t, uint64_t samples) override {
    COFAB_RETURN_IF_ERROR(checkStep(thread, grad));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
    }
    localSgd(0, grad);  // never waits for the network
    steps_.fetch_add(1);
    localSamples_.fetch_add(samples);
    return OkStatus();
  }

  uint64_t globalSamples() const override {
    // The last round's job total plus what this worker did since (the others' recent work is
    // not known yet).
    return globalSamples_.load() + localSamples_.load() - samplesAtRound_.load();
  }

  Status finish(std::span<float> out) override {
    // Without a model of the layout (or the clients) there is nothing to finish; the destructor
    // closes whatever a failed start() opened.
    if (!startedOk()) return FailedPrecondition("sync shadowsync: start() not called or failed");
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    Status s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = error_;
    }
    if (model_client_ != nullptr) {
      // The job's model is the average of the workers' final models: how close the center is
      // to it depends on how many elastic rounds the shadow threads managed.
      bool allDone = false;
      if (s.ok()) s = averageRound(/*initial=*/false, /*done=*/true, &allDone);
      if (s.ok() && !allDone) s = Internal("shadowsync easgd: final round without every worker");
      model_client_->close();
    }
    if (client_ != nullptr) client_->close();
    const Status read = readFinal(out);
    return s.ok() ? read : s;
  }

 private:
  void stopThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      abort_ = true;
    }
    cv_.notify_all();
    // A round in flight waits for the other workers: closing fails it (Cancelled) at once.
    if (client_ != nullptr) client_->close();
    if (model_client_ != nullptr) model_client_->close();
    if (thread_.joinable()) thread_.join();
  }

  void shadowLoop() {
    while (true) {
      bool done;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (options_.shadowIntervalMs > 0) {
          // Through a saturating deadline: wait_for's conversion of a huge interval to
          // nanoseconds overflowed, and the rounds ran back to back.
          cv_.wait_until(lock, Deadline::afterMs(options_.shadowIntervalMs).when(),
                         [&] { return done_; });
        }
        if (abort_) return;
        done = done_;
      }
      Status s;
      bool allDone = false;
      if (options_.shadowMode == "average") {
        s = averageRound(/*initial=*/false, done, &allDone);
      } else {
        s = elasticRound();
        allDone = done;
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = s;
        return;
      }
      if (allDone) return;
    }
  }

  // A round needs every worker, and a worker sleeps up to one interval between its rounds (one
  // that has finished runs them back to back): a round may wait that much longer than an
  // operation.
  Deadline roundDeadline() const {
    const int64_t extra = std::max<int64_t>(options_.shadowIntervalMs, 0);
    return options_.timeoutMs > INT64_MAX / 2 - extra
               ? Deadline::never()
               : Deadline::afterMs(options_.timeoutMs + extra);
  }

  // One averaging round; `done`: this worker has finished (its snapshot is final).
  Status averageRound(bool initial, bool done = false, bool* allDone = nullptr) {
    uint64_t local = localSamples_.load();
    if (!initial) model_.read(snapshot_);
    ps::PushPullOptions avg;
    avg.op = ps::ReduceOp::kAverage;
    handles_.clear();
    for (size_t t = 0; t < counts_.size(); ++t) {
      handles_.push_back(
          client_->pushPull(t, TensorView(snapshot_.data() + offsets_[t], counts_[t], DType::kF32),
                            TensorView(avg_.data() + offsets_[t], counts_[t], DType::kF32), avg));
    }
    // Progress key: [samples, done]; doubles keep sample counts exact.
    progress_[0] = double(local);
    progress_[1] = done ? 1.0 : 0.0;
    handles_.push_back(client_->pushPull(counts_.size(), TensorView(progress_, 2, DType::kF64),
                                         TensorView(progress_, 2, DType::kF64), {}));
    // Every handle, also after one failed: none may still write avg_ or progress_ (or read
    // snapshot_) once this returns; one still running at the deadline closes the client.
    Status waited = waitEveryHandle(*client_, handles_, initial ? deadline() : roundDeadline());
    if (!waited.ok()) return waited.withContext("shadowsync round");
    const bool everyoneDone = progress_[1] >= double(env_.worldSize);
    if (initial) {
      model_.assign(avg_);
    } else if (everyoneDone) {
      model_.write(0, avg_);  // nobody trains any more: end on the exact average
      syncs_.fetch_add(1);
    } else if (done) {
      // This worker has finished and its model stays as trained until the final average.
      // (Applying average - snapshot here would bake in the others' progress between their
      // snapshots and ours — an overshoot that only further training corrects.)
    } else {
      for (size_t i = 0; i < total_; ++i) avg_[i] -= snapshot_[i];
      model_.add(avg_, 1.0f);
      syncs_.fetch_add(1);
    }
    samplesAtRound_.store(local);
    globalSamples_.store(uint64_t(progress_[0]));
    if (allDone != nullptr) *allDone = everyoneDone;
    // Added, not stored: in easgd mode the elastic rounds count their bytes into the same
    // counters, which the final average's client figures overwrote.
    const ps::ClientStats cs = client_->stats();
    bytesSent_.fetch_add(cs.bytesOut - clientBytesOut_);
    bytesReceived_.fetch_add(cs.bytesIn - clientBytesIn_);
    clientBytesOut_ = cs.bytesOut;
    clientBytesIn_ = cs.bytesIn;
    return OkStatus();
  }

  Status elasticRound() {
    model_.read(snapshot_);
    for (size_t t = 0; t < counts_.size(); ++t) {
      TensorView x(snapshot_.data() + offsets_[t], counts_[t], DType::kF32);
      TensorView d(avg_.data() + offsets_[t], counts_[t], DType::kF32);
      COFAB_RETURN_IF_ERROR(model_client_->elastic(t, x, alpha(), d, deadline()));
      model_.add(offsets_[t], tensorOf(avg_, t), -1.0f);
      bytesSent_.fetch_add(counts_[t] * sizeof(float));
      bytesReceived_.fetch_add(counts_[t] * sizeof(float));
    }
    syncs_.fetch_add(1);
    // One load: samples the training thread adds meanwhile are published by the next round
    // (two loads would drop those added between them from the job's count for good).
    const uint64_t local = localSamples_.load();
    unpublishedSamples_.store(local - samplesAtRound_.load());
    samplesAtRound_.store(local);
    return publishSamples();
  }

  std::unique_ptr<ps::PushPullClient> client_;
  std::unique_ptr<ps::ModelClient> model_client_;
  std::vector<float> snapshot_, avg_;  // shadow thread only (after start())
  std::vector<ps::PushPullHandle> handles_;
  double progress_[2] = {0, 0};
  // client_'s byte counts already added to bytesSent_/bytesReceived_ (the thread running the
  // rounds: start(), then the shadow thread, then finish()).
  uint64_t clientBytesOut_ = 0, clientBytesIn_ = 0;
  std::atomic<uint64_t> samplesAtRound_{0};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;   // under mu_
  bool abort_ = false;  // under mu_
  Status error_;        // under mu_: the shadow thread's failure
};

}  // namespace

StatusOr<AlgorithmPtr> makeShadowSync(const SyncOptions& options, const SyncEnv& env) {
  return AlgorithmPtr(new ShadowSync(options, env));
}

}  // namespace cofab::sync::detail

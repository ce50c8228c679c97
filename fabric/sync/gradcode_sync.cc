// gradcode: bulk-synchronous SGD with gradient coding (fractional repetition, Tandon et al.;
// coding/gradient/fractional_repetition.h, docs/CODED.md). n workers form n/(s+1) groups of s+1
// consecutive ranks; every worker of group g computes the gradients of the group's s+1 data
// partitions and pushes their sum. The daemons (cofab-aggd --gradient-stragglers s) complete a
// round as soon as every group has one contribution and return the full sum over all n
// partitions; every worker divides it by n (the average of the partitions' mean gradients, what
// sync averages) and applies the same SGD-with-momentum step, so the models stay identical.
//
// Stragglers: a worker whose round completed without it must still apply that round's result.
// Round r travels on keys of its own, (r mod window) x tensors + t at iteration r / window, so
// the daemons keep the results of the last `window` rounds; every worker that learns a round's
// result marks it done in the store, and needsGradient(r) looks the mark up: a straggler skips
// the computation of completed rounds and fetches their results with pull-only operations
// (answered at once from the kept result), until it is current again. A straggler that pushes
// a round that completed meanwhile is answered from the round's result too (a late resend, never
// applied). So that nobody falls out of the window, every worker publishes its progress every
// window/4 rounds and waits, before a round, while another is more than window/2 rounds behind
// (bounded lag: a straggler a few rounds behind is never waited for; a stalled one is, once it
// is half a window behind). Should a worker still fall more than `window` rounds behind (a
// window too small for the model's memory budget), its step fails with FailedPrecondition.
//
// Failures of the push-pulls are sticky: that step and every later one (and needsGradient())
// return the first. The step's other tensors are waited for, and those still running at the
// deadline are cancelled by closing the client, so nothing reads the caller's gradient or writes
// result_ after step() returned.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "coding/gradient/fractional_repetition.h"
#include "fabric/coded/gradient_coding_client.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/ps/push_pull.h"
#include "fabric/sync/algorithm_base.h"

namespace cofab::sync::detail {
namespace {

// start(): the configuration check (one float per daemon, keys from kCheckKey up) and the
// initial model; rounds use keys below.
constexpr uint64_t kCheckKey = 1u << 21;
constexpr uint64_t kInitialKeys = 1u << 20;

class GradcodeSync final : public AlgorithmBase {
 public:
  GradcodeSync(const SyncOptions& options, const SyncEnv& env,
               coding::FractionalRepetitionCode code)
      : AlgorithmBase("gradcode", options, env, 1), code_(std::move(code)) {}
  // Closes the client first: its I/O threads may still receive into result_.
  ~GradcodeSync() override {
    if (client_ != nullptr) client_->close();
  }

  Status doStart(std::span<const float> initial,
                 const std::vector<size_t>& tensorCounts) override {
    checkedThrough_ = 0;  // an earlier run's progress is not this one's
    COFAB_RETURN_IF_ERROR(setUp(initial, tensorCounts));
    if (uint64_t(options_.gradcodeWindow) * counts_.size() >= kInitialKeys) {
      return InvalidArgument("sync gradcode: gradcodeWindow x tensors must stay below 2^20");
    }
    COFAB_ASSIGN_OR_RETURN(client_, connectPushPull(env_));
    // The daemons must complete rounds per group (each of them: a probe key per daemon).
    Status checked = coded::checkDaemonsRunTheCode(*client_, code_, kCheckKey, deadline());
    if (!checked.ok()) {
      failed_ = checked.withContext("sync gradcode: configuration check");
      return failed_;
    }
    // Start from one group member's initial model per group, summed and divided by the number of
    // groups: the same bits on every worker whatever they were given.
    result_.assign(initial.begin(), initial.end());
    std::vector<ps::PushPullHandle> handles;
    for (size_t t = 0; t < counts_.size(); ++t) {
      TensorView view(result_.data() + offsets_[t], counts_[t], DType::kF32);
      handles.push_back(client_->pushPull(kInitialKeys + t, view, view));
    }
    Status initialized = waitEveryHandle(*client_, handles, deadline());
    if (!initialized.ok()) {
      failed_ = initialized.withContext("sync gradcode: initial model");
      return failed_;
    }
    const float inv = 1.0f / float(code_.groups());
    for (float& v : result_) v *= inv;
    model_.assign(result_);
    return OkStatus();
  }

  std::vector<int> partitions() const override { return code_.partitionsOf(env_.rank); }

  StatusOr<bool> needsGradient(int thread, uint64_t step) override {
    COFAB_RETURN_IF_ERROR(checkStep(thread, std::span<const float>(result_.data(), total_)));
    COFAB_RETURN_IF_ERROR(failed_);
    COFAB_RETURN_IF_ERROR(keepWithinWindow(step));
    COFAB_ASSIGN_OR_RETURN(bool done, env_.store->check({doneKey(step)}));
    return !done;
  }

  Status step(int thread, std::span<const float> grad, uint64_t step, uint64_t samples) override {
    // An empty gradient: the round completed without this worker (needsGradient() said so).
    const bool fetchOnly = grad.empty();
    COFAB_RETURN_IF_ERROR(
        checkStep(thread, fetchOnly ? std::span<const float>(result_.data(), total_) : grad));
    if (client_ == nullptr) return FailedPrecondition("sync gradcode: start() not called");
    COFAB_RETURN_IF_ERROR(failed_);
    COFAB_RETURN_IF_ERROR(keepWithinWindow(step));
    const uint64_t window = uint64_t(options_.gradcodeWindow);
    ps::PushPullOptions po;
    po.iteration = step / window;
    po.delivery = fetchOnly ? ps::Delivery::kPullOnly : ps::Delivery::kPushBack;
    std::vector<ps::PushPullHandle> handles;
    for (size_t t = 0; t < counts_.size(); ++t) {
      TensorView out(result_.data() + offsets_[t], counts_[t], DType::kF32);
      TensorView in = fetchOnly ? out
                                : TensorView(const_cast<float*>(grad.data()) + offsets_[t],
                                             counts_[t], DType::kF32);
      handles.push_back(client_->pushPull((step % window) * counts_.size() + t, in, out, po));
    }
    size_t t = 0;
    Status st = waitEveryHandle(*client_, handles, deadline(), &t);
    // A draining daemon and one that no longer holds the round both reject with
    // FailedPrecondition: only the reason tells them apart, and the remedies differ (restart the
    // job once the daemons are back vs. a larger gradcodeWindow).
    if (ps::rejectReasonOf(st) == ps::RejectReason::kDraining) {
      failed_ = st.withContext("sync gradcode: step " + std::to_string(step) +
                               ": an aggregator is shutting down (draining) and refused the "
                               "round; restart the job once the daemons are back");
      return failed_;
    }
    if (ps::rejectReasonOf(st) == ps::RejectReason::kFinishedIteration) {
      failed_ = st.withContext("sync gradcode: rank " + std::to_string(env_.rank) + " step " +
                               std::to_string(step) + " fell more than gradcodeWindow (" +
                               std::to_string(window) +
                               ") rounds behind; the daemons no longer hold that round");
      return failed_;
    }
    if (!st.ok()) {
      failed_ = st.withContext("sync gradcode: step " + std::to_string(step) + " tensor " +
                               std::to_string(t));
      return failed_;
    }
    recordBytes();
    // The sum over the n partitions of their mean gradients -> the average, as sync applies.
    // Applied before the store bookkeeping below: the round is complete, and its update must not
    // depend on a store call going through.
    const float inv = 1.0f / float(env_.worldSize);
    for (float& v : result_) v *= inv;
    localSgd(0, result_);
    steps_.fetch_add(1);
    syncs_.fetch_add(1);
    if (fetchOnly) skipped_.fetch_add(1);
    globalSamples_.fetch_add(samples * uint64_t(env_.worldSize));
    // Sticky like a failed round: a caller that logs the error and goes on must not train on
    // with the marks and progress the others wait on missing.
    if (Status s = markRoundDone(step); !s.ok()) {
      failed_ = s.withContext("sync gradcode: step " + std::to_string(step) +
                              " (applied): store bookkeeping");
      return failed_;
    }
    return OkStatus();
  }

  Status finish(std::span<float> out) override {
    if (client_ == nullptr) return FailedPrecondition("sync gradcode: start() not called");
    Status s = client_->waitAll(deadline());
    recordBytes();
    client_->close();
    // After a failed step, its cause (waitAll() may only see the Cancelled of the operations
    // closed with the client).
    if (!failed_.ok()) s = failed_;
    const Status read = readFinal(out);
    return s.ok() ? read : s;
  }

 private:
  // Tells stragglers the round is over, drops an old mark, publishes this worker's progress.
  Status markRoundDone(uint64_t step) {
    const uint64_t window = uint64_t(options_.gradcodeWindow);
    // Idempotent: every worker that knows sets it.
    COFAB_RETURN_IF_ERROR(env_.store->set(doneKey(step), Bytes{1}));
    // Done marks two windows old are read by nobody: keepWithinWindow() keeps every worker
    // within the window, and the daemons no longer hold such a round anyway. One worker per round
    // (by rank, round-robin) removes one, so a long job leaves about 2 x window marks, not one
    // per round.
    const uint64_t kept = 2 * window;
    if (step >= kept && step % uint64_t(env_.worldSize) == uint64_t(env_.rank)) {
      COFAB_RETURN_IF_ERROR(env_.store->remove(doneKey(step - kept)).status());
    }
    if ((step + 1) % progressEvery() == 0) {
      const std::string v = std::to_string(step + 1);
      COFAB_RETURN_IF_ERROR(env_.store->set(progressKey(env_.rank), Bytes(v.begin(), v.end())));
    }
    return OkStatus();
  }
  std::string doneKey(uint64_t step) const { return storeKey("done/" + std::to_string(step)); }
  std::string progressKey(int rank) const { return storeKey("progress/" + std::to_string(rank)); }
  uint64_t progressEvery() const {
    return std::max<uint64_t>(1, uint64_t(options_.gradcodeWindow) / 4);
  }

  // Bounded lag: before round `step` (checked every progressEvery() rounds), wait until every
  // worker has published progress within half the window, so that no worker can fall out of the
  // rounds the daemons keep. A straggler a few rounds behind never triggers it; one stalled for
  // half the window (or rank 0 evaluating for that long) holds the others until it catches up.
  Status keepWithinWindow(uint64_t step) {
    const uint64_t half = uint64_t(options_.gradcodeWindow) / 2;
    if (step < half || step % progressEvery() != 0 || step <= checkedThrough_) return OkStatus();
    const uint64_t need = step - half;
    const Deadline d = deadline();
    for (int r = 0; r < env_.worldSize; ++r) {
      if (r == env_.rank) continue;
      for (;;) {
        uint64_t progress = 0;
        COFAB_ASSIGN_OR_RETURN(bool published, env_.store->check({progressKey(r)}));
        if (published) {
          COFAB_ASSIGN_OR_RETURN(Bytes v, env_.store->get(progressKey(r), d));
          progress = std::strtoull(std::string(v.begin(), v.end()).c_str(), nullptr, 10);
        }
        if (progress >= need) break;
        if (d.expired()) {
          return DeadlineExceeded(
              "sync gradcode: rank " + std::to_string(env_.rank) + " waited for rank " +
              std::to_string(r) + " (at round " + std::to_string(progress) + ") to come within " +
              std::to_string(half) + " rounds of round " + std::to_string(step));
        }
        std::this_thread::sleep_for(Millis(1));
      }
    }
    checkedThrough_ = step;
    return OkStatus();
  }

  void recordBytes() {
    ps::ClientStats s = client_->stats();
    bytesSent_.store(s.bytesOut);
    bytesReceived_.store(s.bytesIn);
  }

  const coding::FractionalRepetitionCode code_;
  std::vector<float> result_;
  uint64_t checkedThrough_ = 0;  // keepWithinWindow() passed for this round
  // Declared after the buffer it receives into, so it is destroyed (closed) before it.
  std::unique_ptr<ps::PushPullClient> client_;
};

}  // namespace

StatusOr<AlgorithmPtr> makeGradcodeSync(const SyncOptions& options, const SyncEnv& env) {
  if (env.store == nullptr) {
    return InvalidArgument("sync gradcode needs a store (it marks completed rounds there)");
  }
  if (options.gradcodeWindow < 1) return InvalidArgument("sync gradcode: gradcodeWindow < 1");
  auto code = coding::FractionalRepetitionCode::create(
      {.workers = env.worldSize, .stragglers = options.gradientStragglers});
  if (!code.ok()) return code.status().withContext("sync gradcode");
  return AlgorithmPtr(new GradcodeSync(options, env, std::move(*code)));
}

}  // namespace cofab::sync::detail

// sync / int8 / onebit: bulk-synchronous data parallelism through the aggregators. Every step
// each worker pushes its gradient (one push-pull per tensor, all in flight at once), gets the
// average over the workers back, and applies the same SGD-with-momentum step to its model, so
// the models stay identical. int8/onebit only change the wire format of the push-pull (the
// daemon decompresses, accumulates in f32 and recompresses; onebit keeps an error-feedback
// residual per worker, and the daemon's reply none unless SyncOptions::replyFeedback).
//
// Failures are sticky: a push-pull that failed (or timed out) fails this step and every later
// one with the same Status. The step's other tensors are waited for, and those still running at
// the deadline are cancelled by closing the client, so no late result lands in buf_ after step()
// returned (and none while a later step refills it).
#include <memory>
#include <string>

#include "fabric/ps/push_pull.h"
#include "fabric/sync/algorithm_base.h"

namespace cofab::sync::detail {
namespace {

constexpr uint64_t kInitialKeys = 1u << 20;

class BspSync final : public AlgorithmBase {
 public:
  BspSync(const SyncOptions& options, const SyncEnv& env)
      : AlgorithmBase(options.algorithm, options, env, 1) {}
  // Closes the client first: its I/O threads may still receive into buf_.
  ~BspSync() override {
    if (client_ != nullptr) client_->close();
  }

  Status doStart(std::span<const float> initial,
                 const std::vector<size_t>& tensorCounts) override {
    COFAB_RETURN_IF_ERROR(setUp(initial, tensorCounts));
    COFAB_ASSIGN_OR_RETURN(client_, connectPushPull(env_));
    // Start from the average of the workers' initial models (exact: uncompressed), so the
    // workers agree bit for bit whatever they were given.
    buf_.assign(initial.begin(), initial.end());
    COFAB_RETURN_IF_ERROR(averageInPlace(/*compressed=*/false));
    model_.assign(buf_);
    return OkStatus();
  }

  Status step(int thread, std::span<const float> grad, uint64_t, uint64_t samples) override {
    COFAB_RETURN_IF_ERROR(checkStep(thread, grad));
    if (client_ == nullptr) return FailedPrecondition("sync " + name_ + ": start() not called");
    COFAB_RETURN_IF_ERROR(failed_);
    if (name_ == "sync") {
      buf_.assign(grad.begin(), grad.end());
      COFAB_RETURN_IF_ERROR(averageInPlace(/*compressed=*/true));
      localSgd(0, buf_);
    } else {
      // Compressed: momentum first, then the velocity goes on the wire (error-feedback SGD with
      // momentum). Without compression this is the same update (the average of the workers'
      // velocities is the velocity of the averaged gradients); with 1-bit it converges much
      // better, because the smooth velocity, not the noisy gradient, is quantized.
      // onebit quantizes the Nesterov look-ahead step by default (SyncOptions::onebitNesterov).
      std::span<const float> v = name_ == "onebit" && options_.onebitNesterov
                                     ? momentum_[0]->nesterovUpdate(grad)
                                     : momentum_[0]->update(grad);
      buf_.assign(v.begin(), v.end());
      COFAB_RETURN_IF_ERROR(averageInPlace(/*compressed=*/true));
      model_.add(buf_, -options_.lr);
    }
    steps_.fetch_add(1);
    syncs_.fetch_add(1);
    globalSamples_.fetch_add(samples * uint64_t(env_.worldSize));
    return OkStatus();
  }

  Status finish(std::span<float> out) override {
    if (client_ == nullptr) return FailedPrecondition("sync " + name_ + ": start() not called");
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
  Status averageInPlace(bool compressed) {
    ps::PushPullOptions options;
    options.op = ps::ReduceOp::kAverage;
    if (compressed && options_.compressionBlock > 0)
      options.compressionBlock = options_.compressionBlock;
    if (compressed && name_ == "int8") options.compression = ps::Compression::kInt8;
    if (compressed && name_ == "onebit") {
      options.compression = ps::Compression::kOneBit;
      options.replyFeedback = options_.replyFeedback;
    }
    handles_.clear();
    // A key keeps its compression on the daemons: the initial (exact) average has keys of its own.
    const uint64_t keyBase = compressed ? 0 : kInitialKeys;
    for (size_t t = 0; t < counts_.size(); ++t) {
      TensorView view(buf_.data() + offsets_[t], counts_[t], DType::kF32);
      handles_.push_back(client_->pushPull(keyBase + t, view, view, options));
    }
    size_t t = 0;
    Status st = waitEveryHandle(*client_, handles_, deadline(), &t);
    if (!st.ok()) {
      failed_ = st.withContext("sync " + name_ + ": tensor " + std::to_string(t));
      return failed_;
    }
    recordBytes();
    return OkStatus();
  }

  void recordBytes() {
    ps::ClientStats s = client_->stats();
    bytesSent_.store(s.bytesOut);
    bytesReceived_.store(s.bytesIn);
  }

  std::vector<float> buf_;
  std::vector<ps::PushPullHandle> handles_;
  // Declared after the buffers it receives into, so it is destroyed (closed) before them.
  std::unique_ptr<ps::PushPullClient> client_;
};

}  // namespace

StatusOr<AlgorithmPtr> makeBspSync(const SyncOptions& options, const SyncEnv& env) {
  return AlgorithmPtr(new BspSync(options, env));
}

}  // namespace cofab::sync::detail

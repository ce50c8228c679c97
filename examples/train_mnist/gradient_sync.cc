#include "examples/train_mnist/gradient_sync.h"

#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/bootstrap.h"
#include "fabric/sync/sync_algorithm.h"

namespace cofab::examples {
namespace {

constexpr int64_t kStepTimeoutMs = 120'000;

class LocalSync final : public GradientSync {
 public:
  int rank() const override { return 0; }
  int worldSize() const override { return 1; }
  std::string describe() const override { return "local (one process)"; }
  Status sumGradients(const std::vector<TensorSlot>&, std::vector<float>&, uint64_t) override {
    return OkStatus();
  }
};

// Synchronous data-parallel SGD through aggregator daemons: each tensor is pushed to the
// aggregators and the sum over all workers comes back in place. All tensors of a step are in
// flight at once; the step waits for every handle.
class AggregatorSync final : public GradientSync {
 public:
  static StatusOr<std::unique_ptr<GradientSync>> create() {
    auto sync = std::unique_ptr<AggregatorSync>(new AggregatorSync());
    COFAB_ASSIGN_OR_RETURN(sync->boot_, bootstrapFromEnv(Deadline::afterMs(kStepTimeoutMs)));
    ps::ClientOptions options;
    // The model is ~0.8 MB: with the default 4 MiB chunks each tensor would be one chunk on one
    // daemon. 64 KiB chunks spread the big layer over every daemon. (Every worker uses the same
    // value, as placement requires.)
    options.chunkBytes = 64 << 10;
    COFAB_ASSIGN_OR_RETURN(sync->client_,
                           ps::PushPullClient::connect(*sync->boot_.store, sync->boot_.info.rank,
                                                       sync->boot_.info.worldSize, options));
    return std::unique_ptr<GradientSync>(std::move(sync));
  }
  int rank() const override { return boot_.info.rank; }
  int worldSize() const override { return boot_.info.worldSize; }
  std::string describe() const override {
    return "aggregator (push-pull through cofab-aggd, store " + boot_.store->describe() + ")";
  }
  Status sumGradients(const std::vector<TensorSlot>& tensors, std::vector<float>& grads,
                      uint64_t step) override {
    handles_.clear();
    ps::PushPullOptions options;
    options.iteration = step;
    for (size_t t = 0; t < tensors.size(); ++t) {
      TensorView view(grads.data() + tensors[t].offset, tensors[t].count, DType::kF32);
      handles_.push_back(client_->pushPull(t, view, view, options));
    }
    Deadline deadline = Deadline::afterMs(kStepTimeoutMs);
    for (size_t t = 0; t < handles_.size(); ++t) {
      COFAB_RETURN_IF_ERROR(handles_[t].wait(deadline).withContext("tensor " + tensors[t].name));
    }
    return OkStatus();
  }
  Status finish() override {
    Status s = client_->waitAll(Deadline::afterMs(kStepTimeoutMs));
    client_.reset();
    return s;
  }

 private:
  AggregatorSync() = default;
  BootstrapResult boot_;
  std::unique_ptr<ps::PushPullClient> client_;
  std::vector<ps::PushPullHandle> handles_;
};

}  // namespace

std::string syncModes() { return "local, aggregator, " + sync::syncAlgorithms(); }

bool isGradientSyncMode(const std::string& mode) { return mode == "local" || mode == "aggregator"; }

StatusOr<std::unique_ptr<GradientSync>> makeGradientSync(const std::string& mode) {
  if (mode == "local") return std::unique_ptr<GradientSync>(new LocalSync());
  if (mode == "aggregator") return AggregatorSync::create();
  return InvalidArgument("--sync '" + mode + "' is not one of: " + syncModes());
}

}  // namespace cofab::examples

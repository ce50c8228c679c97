#include "fabric/ps/aggregator_collectives.h"

#include "fabric/ps/placement.h"

namespace cofab::ps {

namespace {

bool aggregatorDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

// A PushPullHandle seen as a comm::PendingOp.
class PushPullPending final : public comm::PendingOp {
 public:
  explicit PushPullPending(PushPullHandle handle) : handle_(std::move(handle)) {}
  Status wait(Deadline deadline) override { return handle_.wait(deadline); }
  bool test() const override { return handle_.test(); }
  Status status() const override { return handle_.status(); }

 private:
  PushPullHandle handle_;
};

class AggregatorAllreducePath final : public comm::AllreducePath {
 public:
  AggregatorAllreducePath(std::shared_ptr<PushPullClient> client, uint64_t keyBase)
      : client_(std::move(client)), collectives_(*client_, keyBase) {}
  std::string name() const override { return "aggregators"; }
  bool serves(comm::ReduceOp op, DType dtype) const override {
    return (op == comm::ReduceOp::kSum || op == comm::ReduceOp::kAvg) && aggregatorDType(dtype);
  }
  std::shared_ptr<comm::PendingOp> start(const TensorView& in, const TensorView& out,
                                         comm::ReduceOp op, Deadline) override {
    // The deadline is enforced by whoever waits on the handle (CollectiveHandle::wait).
    return std::make_shared<PushPullPending>(collectives_.allreduceAsync(in, out, op));
  }

 private:
  std::shared_ptr<PushPullClient> client_;
  AggregatorCollectives collectives_;
};

}  // namespace

uint64_t AggregatorCollectives::keyFor(DType dtype, size_t count) const {
  return keyBase_ ^ (mix64((static_cast<uint64_t>(count) << 8) | static_cast<uint8_t>(dtype)) &
                     0x00000000ffffffffull);
}

PushPullHandle AggregatorCollectives::allreduceAsync(const TensorView& in, const TensorView& out,
                                                     comm::ReduceOp op) {
  PushPullOptions po;
  po.op = op == comm::ReduceOp::kAvg ? ReduceOp::kAverage : ReduceOp::kSum;
  return client_.pushPull(keyFor(in.dtype, in.count), in, out, po);
}

Status AggregatorCollectives::allreduce(const TensorView& in, const TensorView& out,
                                        const comm::AllreduceOptions& options) {
  if (options.op != comm::ReduceOp::kSum && options.op != comm::ReduceOp::kAvg) {
    return Unimplemented("allreduce through aggregators supports sum and avg, not " +
                         std::string(comm::reduceOpName(options.op)));
  }
  Deadline deadline = Deadline::afterMs(300000);
  if (options.deadline) {
    deadline = *options.deadline;
  } else if (options.timeout.count() > 0) {
    deadline = Deadline::after(options.timeout);
  }
  return allreduceAsync(in, out, options.op).wait(deadline);
}

std::shared_ptr<comm::AllreducePath> aggregatorAllreducePath(std::shared_ptr<PushPullClient> client,
                                                             uint64_t keyBase) {
  return std::make_shared<AggregatorAllreducePath>(std::move(client), keyBase);
}

}  // namespace cofab::ps

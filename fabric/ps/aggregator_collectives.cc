#include "fabric/ps/aggregator_collectives.h"

#include <mutex>
#include <span>

#include "fabric/ps/placement.h"

namespace cofab::ps {

namespace {

bool aggregatorDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

// What an AggregatorAllreducePath shares with its pending operations (which may outlive it, in a
// CollectiveHandle): the client, and the error that failed the path for good.
class PathState {
 public:
  explicit PathState(std::shared_ptr<PushPullClient> client) : client_(std::move(client)) {}
  PushPullClient& client() const { return *client_; }
  Status failed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  // An allreduce ended with `st`: when the client is unusable now (closed because the operation
  // outran its deadline, or failed by a sticky error), the path is broken for good.
  void noteEnd(const Status& st) {
    if (st.ok() || client_->status().ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = st;
  }

 private:
  std::shared_ptr<PushPullClient> client_;
  mutable std::mutex mu_;
  Status failed_;
};

// An allreduce refused by a broken path: complete from the start.
class FailedPending final : public comm::PendingOp {
 public:
  explicit FailedPending(Status status) : status_(std::move(status)) {}
  Status wait(Deadline) override { return status_; }
  bool test() const override { return true; }
  Status status() const override { return status_; }
  void cancel(const Status&) override {}

 private:
  Status status_;
};

// A PushPullHandle seen as a comm::PendingOp. The collective's own deadline is enforced when the
// op is waited on with a deadline no earlier than it (comm::allreduce waits with none), or polled
// with test() once it has passed: an operation still running then is cancelled by closing the
// client (waitEveryHandle), so that the DeadlineExceeded returned means nothing reads `in` or
// writes `out` any more, and the path fails for good. A caller's earlier deadline only ends that
// wait (the op keeps running).
class PushPullPending final : public comm::PendingOp {
 public:
  PushPullPending(std::shared_ptr<PathState> state, PushPullHandle handle, Deadline opDeadline)
      : state_(std::move(state)), handle_(std::move(handle)), opDeadline_(opDeadline) {}
  Status wait(Deadline deadline) override {
    if (Status e = expired(); !e.ok()) return e;
    Status st;
    if (deadline.when() < opDeadline_.when()) {
      st = handle_.wait(deadline);
      if (handle_.test()) state_->noteEnd(st);
    } else {
      const std::span<const PushPullHandle> one(&handle_, 1);
      st = waitEveryHandle(state_->client(), one, opDeadline_);
      state_->noteEnd(st);
    }
    // Ended by cancel() meanwhile: its reason, not the Cancelled the closed client gave.
    if (Status e = expired(); !e.ok()) return e;
    return st;
  }
  bool test() const override {
    if (handle_.test()) return true;
    if (!opDeadline_.expired()) return false;
    // A caller polling test() (docs/COLLECTIVES.md: whoever waits or polls enforces the
    // deadline) spun until the daemons' round timeout, minutes later, before.
    std::lock_guard<std::mutex> lock(mu_);
    if (expired_.ok()) {
      const std::span<const PushPullHandle> one(&handle_, 1);
      Status st = waitEveryHandle(state_->client(), one, opDeadline_);
      state_->noteEnd(st);
      expired_ = st;  // OK if it completed meanwhile: status() is then the handle's
    }
    return true;
  }
  Status status() const override {
    if (Status e = expired(); !e.ok()) return e;
    return handle_.status();
  }
  void cancel(const Status& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!expired_.ok() || handle_.test()) return;
    // Set first: a waiter that the close below wakes returns `why` (it reads it under mu_,
    // once the close is done).
    expired_ = why;
    // Closing the client is the only way to stop a push-pull: the path fails for good.
    const std::span<const PushPullHandle> one(&handle_, 1);
    // OK: it completed meanwhile (judged by the op, not by the shared client, which another
    // op's deadline may have closed): its own status stands.
    if (waitEveryHandle(state_->client(), one, Deadline::afterMs(0)).ok()) {
      expired_ = Status();
      return;
    }
    state_->noteEnd(why);
  }

 private:
  Status expired() const {
    std::lock_guard<std::mutex> lock(mu_);
    return expired_;
  }

  std::shared_ptr<PathState> state_;
  PushPullHandle handle_;
  Deadline opDeadline_;
  mutable std::mutex mu_;
  mutable Status expired_;  // under mu_: what test() got enforcing the deadline
};

class AggregatorAllreducePath final : public comm::AllreducePath {
 public:
  AggregatorAllreducePath(std::shared_ptr<PushPullClient> client, uint64_t keyBase)
      : state_(std::make_shared<PathState>(client)), collectives_(*client, keyBase) {}
  std::string name() const override { return "aggregators"; }
  bool serves(comm::ReduceOp op, DType dtype) const override {
    return (op == comm::ReduceOp::kSum || op == comm::ReduceOp::kAvg) && aggregatorDType(dtype);
  }
  std::shared_ptr<comm::PendingOp> start(const TensorView& in, const TensorView& out,
                                         comm::ReduceOp op, Deadline deadline) override {
    if (Status failed = state_->failed(); !failed.ok()) {
      return std::make_shared<FailedPending>(
          failed.withContext("allreduce through the aggregators: the path failed for good"));
    }
    return std::make_shared<PushPullPending>(state_, collectives_.allreduceAsync(in, out, op),
                                             deadline);
  }

 private:
  std::shared_ptr<PathState> state_;  // keeps the client alive
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
  if (!failed_.ok()) {
    return failed_.withContext(
        "allreduce through the aggregators: an earlier allreduce failed for good");
  }
  COFAB_ASSIGN_OR_RETURN(const Deadline deadline, comm::collectiveDeadline(options));
  // Not handle.wait(): after its DeadlineExceeded the push-pull would go on reading `in` and
  // writing `out`, which the caller takes back with our error. waitEveryHandle closes the
  // client instead, so the error returned means nothing touches them any more.
  const PushPullHandle handle = allreduceAsync(in, out, options.op);
  Status st = waitEveryHandle(client_, std::span<const PushPullHandle>(&handle, 1), deadline);
  if (!st.ok() && !client_.status().ok()) failed_ = st;  // the client is unusable now
  return st;
}

std::shared_ptr<comm::AllreducePath> aggregatorAllreducePath(std::shared_ptr<PushPullClient> client,
                                                             uint64_t keyBase) {
  return std::make_shared<AggregatorAllreducePath>(std::move(client), keyBase);
}

}  // namespace cofab::ps

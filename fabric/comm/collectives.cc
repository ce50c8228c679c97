#include "fabric/comm/collectives.h"

#include <string>

#include "core/param.h"
#include "fabric/comm/collective_op.h"
#include "fabric/comm/direct_ops.h"
#include "fabric/comm/ring_op.h"
#include "fabric/wire/header.h"

namespace cofab::comm {

COFAB_PARAM_INT(kTimeoutMs, "COFAB_COLLECTIVE_TIMEOUT_MS", 300000, 1, 86400000,
                "default deadline of a collective or send/recv, ms from the call");
COFAB_PARAM_ENUM(kAllreduceAlgo, "COFAB_ALLREDUCE_ALGO", "auto",
                 (std::vector<std::string>{"auto", "ring", "direct"}),
                 "allreduce algorithm: auto (by COFAB_ALLREDUCE_SMALL_BYTES), ring or direct");
// The direct algorithms send a whole tensor (allgather: a whole block) as one message, which a
// receiver refuses past wire::kDefaultMaxPayload: their thresholds stop there.
COFAB_PARAM_INT(kAllreduceSmallBytes, "COFAB_ALLREDUCE_SMALL_BYTES", 64 << 10, 0,
                int64_t{wire::kDefaultMaxPayload},
                "allreduce messages up to this many bytes use the direct algorithm (auto)");
COFAB_PARAM_INT(kRingChunkBytes, "COFAB_RING_CHUNK_BYTES", 1 << 20, 1024, 1 << 30,
                "message size of the pipelined ring and broadcast chain, bytes");
COFAB_PARAM_INT(kRingWindow, "COFAB_RING_WINDOW", 4, 1, 1024,
                "receives the ring posts ahead (scratch slots of one chunk each)");
COFAB_PARAM_INT(kBroadcastSmallBytes, "COFAB_BROADCAST_SMALL_BYTES", 64 << 10, 0,
                int64_t{wire::kDefaultMaxPayload},
                "broadcasts up to this many bytes go from the root to every rank directly");
COFAB_PARAM_INT(kAllgatherSmallBytes, "COFAB_ALLGATHER_SMALL_BYTES", 64 << 10, 0,
                int64_t{wire::kDefaultMaxPayload},
                "allgathers whose output is up to this many bytes use a direct exchange");

StatusOr<Deadline> collectiveDeadline(const CollectiveOptions& o) {
  if (o.deadline) return *o.deadline;
  if (o.timeout > Duration::zero()) return Deadline::after(o.timeout);
  COFAB_ASSIGN_OR_RETURN(int64_t ms, kTimeoutMs.get());
  return Deadline::afterMs(ms);
}

namespace {

int64_t intParam(const IntParam& p, Status* error) {
  auto v = p.get();
  if (!v.ok()) {
    if (error->ok()) *error = v.status();
    return p.defaultValue();
  }
  return *v;
}

Deadline deadlineOf(const CollectiveOptions& o, Status* error) {
  auto d = collectiveDeadline(o);
  if (d.ok()) return *d;
  if (error->ok()) *error = d.status();
  return Deadline::afterMs(kTimeoutMs.defaultValue());
}

Status checkTensor(const TensorView& t, const char* what) {
  COFAB_RETURN_IF_ERROR(t.validate(what));
  if (!t.device.isCpu()) {
    return InvalidArgument(std::string(what) + " is on " + t.device.toString() +
                           ": the collectives take host memory");
  }
  return OkStatus();
}

// Whether `whole` elements are exactly `ranks` blocks of `block`. Divided, not multiplied: a
// block count near the validate() limit times the ranks wraps, and then matched an empty tensor.
bool holdsBlocks(size_t whole, size_t block, int ranks) {
  const auto n = static_cast<size_t>(ranks);
  return whole % n == 0 && whole / n == block;
}

// allgather / reduce_scatter: `small` is exactly this rank's block of `large` (in place) or
// apart from it. Any other overlap is refused: chunked sends read their input late, so a peer
// would get bytes a result had already overwritten.
Status checkBlockInPlaceOrDisjoint(const TensorView& small, const TensorView& large, int rank,
                                   const char* what) {
  const auto* block =
      static_cast<const uint8_t*>(large.data) + static_cast<size_t>(rank) * small.bytes();
  if (overlaps(small, large) && small.data != block) {
    return InvalidArgument(std::string(what) + ": the buffers overlap, but the smaller one is not "
                           "rank " + std::to_string(rank) +
                           "'s block of the larger one (the in-place form); pass that block, or "
                           "disjoint buffers");
  }
  return OkStatus();
}

OpSignature baseSig(OpCode code, DType dtype, uint64_t count) {
  OpSignature sig;
  sig.code = code;
  sig.dtype = dtype;
  sig.count = count;
  return sig;
}

CollectiveHandle run(Communicator& comm, std::shared_ptr<CollectiveOp> op) {
  comm.submit(op);
  return CollectiveHandle(std::move(op));
}

Status waitOn(CollectiveHandle h) { return h.wait(Deadline::never()); }

}  // namespace

CollectiveHandle CollectiveHandle::failed(const Status& status) {
  CollectiveHandle h;
  h.failed_ = status;
  return h;
}

Status CollectiveHandle::wait(Deadline deadline) {
  if (external_) return external_->wait(deadline);
  if (!op_) return failed_.ok() ? FailedPrecondition("wait on an empty CollectiveHandle") : failed_;
  return op_->wait(deadline);
}

bool CollectiveHandle::test() const {
  if (external_) return external_->test();
  return !op_ || op_->test();
}

Status CollectiveHandle::status() const {
  if (external_) {
    return external_->test() ? external_->status() : Unavailable("allreduce in progress");
  }
  if (!op_) return failed_.ok() ? FailedPrecondition("status of an empty CollectiveHandle") : failed_;
  return op_->status();
}

CollectiveHandle allreduceAsync(Communicator& comm, const TensorView& in, const TensorView& out,
                                const AllreduceOptions& options) {
  Status error;
  if (!(error = checkTensor(in, "allreduce input")).ok() ||
      !(error = checkTensor(out, "allreduce output")).ok() ||
      !(error = checkSameShape(in, out, "allreduce input and output")).ok() ||
      !(error = checkInPlaceOrDisjoint(in, out, "allreduce")).ok() ||
      !(error = checkReducible(in.dtype, options.op)).ok()) {
    return CollectiveHandle::failed(error);
  }
  const Deadline deadline = deadlineOf(options, &error);
  if (AllreducePath* path = comm.allreducePath(); path && path->serves(options.op, in.dtype)) {
    if (!error.ok()) return CollectiveHandle::failed(error);
    // Sticky like every operation's failure: a failed (or aborted) communicator starts nothing.
    if (Status failed = comm.asyncError(); !failed.ok()) return CollectiveHandle::failed(failed);
    std::shared_ptr<PendingOp> op = path->start(in, out, options.op, deadline);
    comm.notePathOp(op);
    return CollectiveHandle(std::move(op));
  }
  AllreduceAlgorithm algo = options.algorithm;
  if (algo == AllreduceAlgorithm::kAuto) {
    auto forced = kAllreduceAlgo.get();
    if (!forced.ok()) return CollectiveHandle::failed(forced.status());
    if (*forced == "ring") {
      algo = AllreduceAlgorithm::kRing;
    } else if (*forced == "direct") {
      algo = AllreduceAlgorithm::kDirect;
    } else {
      const auto small = static_cast<size_t>(intParam(kAllreduceSmallBytes, &error));
      algo = in.bytes() <= small ? AllreduceAlgorithm::kDirect : AllreduceAlgorithm::kRing;
    }
  }
  // Direct sends the whole tensor in one message, which receivers refuse past the largest
  // payload: a bigger one goes by ring even when direct was asked for (every rank sees the same
  // size, so they all decide alike).
  if (algo == AllreduceAlgorithm::kDirect && in.bytes() > wire::kDefaultMaxPayload) {
    algo = AllreduceAlgorithm::kRing;
  }
  RingPlan plan;
  plan.chunkBytes = static_cast<size_t>(intParam(kRingChunkBytes, &error));
  plan.window = static_cast<int>(intParam(kRingWindow, &error));
  if (!error.ok()) return CollectiveHandle::failed(error);

  OpSignature sig = baseSig(OpCode::kAllreduce, in.dtype, in.count);
  sig.reduceOp = options.op;
  if (algo == AllreduceAlgorithm::kDirect) {
    sig.algorithm = Algorithm::kDirect;
    return run(comm, makeDirectAllreduce(comm, sig, deadline, in, out));
  }
  sig.algorithm = Algorithm::kRing;
  plan.mode = RingPlan::Mode::kAllreduce;
  plan.in = in;
  plan.out = out;
  return run(comm, makeRingOp(comm, sig, deadline, plan));
}

Status allreduce(Communicator& comm, const TensorView& in, const TensorView& out,
                 const AllreduceOptions& options) {
  return waitOn(allreduceAsync(comm, in, out, options));
}

CollectiveHandle reduceScatterAsync(Communicator& comm, const TensorView& in,
                                    const TensorView& out, const ReduceScatterOptions& options) {
  Status error;
  if (!(error = checkTensor(in, "reduce_scatter input")).ok() ||
      !(error = checkTensor(out, "reduce_scatter output")).ok() ||
      !(error = checkReducible(in.dtype, options.op)).ok()) {
    return CollectiveHandle::failed(error);
  }
  if (in.dtype != out.dtype || !holdsBlocks(in.count, out.count, comm.size())) {
    return CollectiveHandle::failed(InvalidArgument(
        "reduce_scatter: the input must hold size() = " + std::to_string(comm.size()) +
        " blocks of the output (" + out.toString() + "), got " + in.toString()));
  }
  if (!(error = checkBlockInPlaceOrDisjoint(out, in, comm.rank(), "reduce_scatter")).ok()) {
    return CollectiveHandle::failed(error);
  }
  const Deadline deadline = deadlineOf(options, &error);
  RingPlan plan;
  plan.chunkBytes = static_cast<size_t>(intParam(kRingChunkBytes, &error));
  plan.window = static_cast<int>(intParam(kRingWindow, &error));
  if (!error.ok()) return CollectiveHandle::failed(error);
  OpSignature sig = baseSig(OpCode::kReduceScatter, out.dtype, out.count);
  sig.reduceOp = options.op;
  sig.algorithm = Algorithm::kRing;
  plan.mode = RingPlan::Mode::kReduceScatter;
  plan.in = in;
  plan.out = out;
  return run(comm, makeRingOp(comm, sig, deadline, plan));
}

Status reduceScatter(Communicator& comm, const TensorView& in, const TensorView& out,
                     const ReduceScatterOptions& options) {
  return waitOn(reduceScatterAsync(comm, in, out, options));
}

CollectiveHandle allgatherAsync(Communicator& comm, const TensorView& in, const TensorView& out,
                                const CollectiveOptions& options) {
  Status error;
  if (!(error = checkTensor(in, "allgather input")).ok() ||
      !(error = checkTensor(out, "allgather output")).ok()) {
    return CollectiveHandle::failed(error);
  }
  if (in.dtype != out.dtype || !holdsBlocks(out.count, in.count, comm.size())) {
    return CollectiveHandle::failed(InvalidArgument(
        "allgather: the output must hold size() = " + std::to_string(comm.size()) +
        " blocks of the input (" + in.toString() + "), got " + out.toString()));
  }
  if (!(error = checkBlockInPlaceOrDisjoint(in, out, comm.rank(), "allgather")).ok()) {
    return CollectiveHandle::failed(error);
  }
  const Deadline deadline = deadlineOf(options, &error);
  const auto small = static_cast<size_t>(intParam(kAllgatherSmallBytes, &error));
  RingPlan plan;
  plan.chunkBytes = static_cast<size_t>(intParam(kRingChunkBytes, &error));
  plan.window = static_cast<int>(intParam(kRingWindow, &error));
  if (!error.ok()) return CollectiveHandle::failed(error);
  OpSignature sig = baseSig(OpCode::kAllgather, in.dtype, in.count);
  if (out.bytes() <= small) {
    sig.algorithm = Algorithm::kDirect;
    return run(comm, makeDirectAllgather(comm, sig, deadline, in, out));
  }
  sig.algorithm = Algorithm::kRing;
  plan.mode = RingPlan::Mode::kAllgather;
  plan.in = in;
  plan.out = out;
  return run(comm, makeRingOp(comm, sig, deadline, plan));
}

Status allgather(Communicator& comm, const TensorView& in, const TensorView& out,
                 const CollectiveOptions& options) {
  return waitOn(allgatherAsync(comm, in, out, options));
}

CollectiveHandle broadcastAsync(Communicator& comm, const TensorView& data,
                                const BroadcastOptions& options) {
  Status error = checkTensor(data, "broadcast data");
  if (!error.ok()) return CollectiveHandle::failed(error);
  if (options.root < 0 || options.root >= comm.size()) {
    return CollectiveHandle::failed(InvalidArgument(
        "broadcast: root " + std::to_string(options.root) + " is not a rank of a communicator "
        "of size " + std::to_string(comm.size())));
  }
  const Deadline deadline = deadlineOf(options, &error);
  const auto small = static_cast<size_t>(intParam(kBroadcastSmallBytes, &error));
  const auto chunk = static_cast<size_t>(intParam(kRingChunkBytes, &error));
  if (!error.ok()) return CollectiveHandle::failed(error);
  OpSignature sig = baseSig(OpCode::kBroadcast, data.dtype, data.count);
  sig.root = static_cast<uint32_t>(options.root);
  sig.algorithm = data.bytes() <= small ? Algorithm::kDirect : Algorithm::kChain;
  return run(comm, makeBroadcast(comm, sig, deadline, data, chunk));
}

Status broadcast(Communicator& comm, const TensorView& data, const BroadcastOptions& options) {
  return waitOn(broadcastAsync(comm, data, options));
}

CollectiveHandle barrierAsync(Communicator& comm, const CollectiveOptions& options) {
  Status error;
  const Deadline deadline = deadlineOf(options, &error);
  if (!error.ok()) return CollectiveHandle::failed(error);
  OpSignature sig = baseSig(OpCode::kBarrier, DType::kU8, 0);
  sig.algorithm = Algorithm::kDirect;
  return run(comm, makeBarrier(comm, sig, deadline));
}

Status barrier(Communicator& comm, const CollectiveOptions& options) {
  return waitOn(barrierAsync(comm, options));
}

namespace {

CollectiveHandle p2p(Communicator& comm, const TensorView& data, int peer,
                     const CollectiveOptions& options, bool sending) {
  const char* what = sending ? "send" : "recv";
  Status error = checkTensor(data, what);
  if (!error.ok()) return CollectiveHandle::failed(error);
  if (peer < 0 || peer >= comm.size() || peer == comm.rank()) {
    return CollectiveHandle::failed(InvalidArgument(
        std::string(what) + ": peer " + std::to_string(peer) + " must be another rank of this "
        "communicator (size " + std::to_string(comm.size()) + ", this is rank " +
        std::to_string(comm.rank()) + ")"));
  }
  const Deadline deadline = deadlineOf(options, &error);
  if (!error.ok()) return CollectiveHandle::failed(error);
  OpSignature sig;
  sig.code = OpCode::kSendRecv;
  sig.dtype = data.dtype;
  sig.count = data.count;
  sig.algorithm = Algorithm::kDirect;
  // Both sides put the receiver in `root`: a send matched against a recv from another rank is
  // caught by the receiver. A send matched against a send is not caught by either (neither
  // receives): the stray messages fail the next operation (collectives.h).
  sig.root = static_cast<uint32_t>(sending ? peer : comm.rank());
  sig.peer = peer;
  return run(comm, makeP2p(comm, sig, deadline, data, sending));
}

}  // namespace

CollectiveHandle sendAsync(Communicator& comm, const TensorView& data, int peer,
                           const CollectiveOptions& options) {
  return p2p(comm, data, peer, options, true);
}
CollectiveHandle recvAsync(Communicator& comm, const TensorView& data, int peer,
                           const CollectiveOptions& options) {
  return p2p(comm, data, peer, options, false);
}
Status send(Communicator& comm, const TensorView& data, int peer,
            const CollectiveOptions& options) {
  return waitOn(sendAsync(comm, data, peer, options));
}
Status recv(Communicator& comm, const TensorView& data, int peer,
            const CollectiveOptions& options) {
  return waitOn(recvAsync(comm, data, peer, options));
}

}  // namespace cofab::comm

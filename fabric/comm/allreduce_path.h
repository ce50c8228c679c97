// AllreducePath: an allreduce served by something other than a communicator's own peer
// connections — the aggregator daemons, for one (ps::aggregatorAllreducePath in
// fabric/ps/aggregator_collectives.h makes that path). A Communicator created with
// CommOptions::allreducePath hands every allreduce the path serves() to it, so code written
// against comm::allreduce runs unchanged on either path; ops the path does not serve (min/max
// through the aggregators, for example) and every other collective keep running over the peers.
//
// Contract for implementations: every rank of the communicator calls start() for the same
// allreduces in the same order (the collective API's rule), from the thread that issued the
// collective; start() returns at once and the returned PendingOp completes exactly once; the
// caller lends `in` and `out` until it has. The communicator tracks the ops: its failure
// (abort() included) and its destruction cancel() those still running, and it refuses to start
// new ones once failed. A path is shared by one communicator's rank only
// (not by its split() sub-communicators, which use their peers). A path's allreduce starts when
// issued, outside the communicator's queue: it does not wait for earlier async operations, nor
// later ones for it (docs/AGGREGATOR.md §8).
#pragma once

#include <memory>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fabric/comm/reduce_kernels.h"

namespace cofab::comm {

// One operation started elsewhere; polled and waited on through a CollectiveHandle.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // The operation's Status once done, or DeadlineExceeded at `deadline` (it keeps running).
  virtual Status wait(Deadline deadline) = 0;
  virtual bool test() const = 0;
  // The final Status once test() is true.
  virtual Status status() const = 0;
  // Ends the operation early (its communicator failed or is being destroyed): on return nothing
  // touches `in` or `out` any more and test() is true; status() is `why`, or the op's own if it
  // had completed. The path may be unusable afterwards.
  virtual void cancel(const Status& why) = 0;
};

class AllreducePath {
 public:
  virtual ~AllreducePath() = default;
  // "aggregators": named in errors.
  virtual std::string name() const = 0;
  // Whether this path reduces `op` over `dtype`; false: the peers' algorithms run instead.
  virtual bool serves(ReduceOp op, DType dtype) const = 0;
  virtual std::shared_ptr<PendingOp> start(const TensorView& in, const TensorView& out, ReduceOp op,
                                           Deadline deadline) = 0;
};

}  // namespace cofab::comm

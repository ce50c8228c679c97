// AggregatorCollectives: the collective API's allreduce (fabric/comm/collectives.h shapes and
// options) served by the aggregator daemons through a PushPullClient, so code written against
// comm::allreduce can run on either path. Two ways in: this object, called directly; or
// aggregatorAllreducePath(), given to a Communicator as CommOptions::allreducePath, after which
// comm::allreduce / allreduceAsync on that communicator go through the daemons (sum and avg over
// f32, f64, f16, bf16; min, max and integer dtypes stay on the peers).
//
// Every rank calls allreduce() in the same order with the same shapes (as for comm). Each call
// is one push-pull on a key derived from (keyBase, dtype, count), at the next iteration of that
// key, so repeated same-shape calls reuse one daemon slot. Blocking; one call at a time per
// object (calls of one shape must not overlap: the daemons run one round per chunk at a time).
// Not thread-safe; the client must outlive this object.
//
// Errors: when allreduce() returns, nothing reads `in` or writes `out` any more, also on error.
// A push-pull still running at the deadline (another rank did not arrive) is cancelled by
// closing the client (ps::waitEveryHandle): the call returns DeadlineExceeded, and, like a ring
// Communicator after a timeout, this object is then failed for good: every later allreduce()
// returns that error (latched; also after a sticky client failure such as a lost daemon). The
// client is closed for everyone who uses it (its status() says so). A daemon's reject of one
// call fails that call only.
//
// The path from aggregatorAllreducePath() behaves the same way at the collective's own deadline
// (AllreduceOptions deadline or timeout, else COFAB_COLLECTIVE_TIMEOUT_MS), enforced when its
// handle is waited on (comm::allreduce does); a CollectiveHandle::wait with an earlier deadline
// only ends that wait, and the allreduce keeps running. Communicator::asyncError() covers the
// communicator's peers only: it stays OK when the aggregator path failed. The path reports its
// failure through the allreduces it serves (each later one fails at once with the latched
// error) and through the client's status().
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "fabric/comm/allreduce_path.h"
#include "fabric/comm/collectives.h"
#include "fabric/ps/push_pull.h"

namespace cofab::ps {

class AggregatorCollectives {
 public:
  // keyBase keeps these keys apart from the caller's own push-pull keys.
  explicit AggregatorCollectives(PushPullClient& client, uint64_t keyBase = 0xA11ED0CE00000000ull)
      : client_(client), keyBase_(keyBase) {}

  // out = sum (kSum) or average (kAvg) over all workers of in; kMin/kMax are Unimplemented.
  // The deadline is comm::collectiveDeadline(options): options.deadline, else options.timeout,
  // else COFAB_COLLECTIVE_TIMEOUT_MS (default 300 s).
  Status allreduce(const TensorView& in, const TensorView& out,
                   const comm::AllreduceOptions& options = {});
  Status allreduce(const TensorView& inout, const comm::AllreduceOptions& options = {}) {
    return allreduce(inout, inout, options);
  }

  // Starts the allreduce and returns its handle (same keys and rules as allreduce()).
  PushPullHandle allreduceAsync(const TensorView& in, const TensorView& out, comm::ReduceOp op);

  // The key a call with this shape uses (exposed for tests and metrics).
  uint64_t keyFor(DType dtype, size_t count) const;

 private:
  PushPullClient& client_;
  uint64_t keyBase_;
  Status failed_;  // latched: the error that left the client unusable
};

// A comm::AllreducePath through the daemons `client` talks to (which it keeps alive): give it to
// Communicator::create in CommOptions::allreducePath on every rank.
std::shared_ptr<comm::AllreducePath> aggregatorAllreducePath(
    std::shared_ptr<PushPullClient> client, uint64_t keyBase = 0xA11ED0CE00000000ull);

}  // namespace cofab::ps

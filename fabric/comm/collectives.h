// Collectives and point-to-point operations on a Communicator (fabric/comm/communicator.h).
//
// Every function takes the communicator, caller-owned tensors (TensorView: data, count, dtype)
// and an options struct. The caller lends the tensors' memory until the operation completes:
// the blocking forms return when it has; the *Async forms return a CollectiveHandle to wait on.
// Every rank must issue the same collectives, in the same order, with the same count, dtype,
// op and root; a rank that does not gets InvalidArgument naming the mismatch (checked in every
// message header), never a hang. One gap: a rank that only sends in an op (a broadcast's root,
// a send) checks nothing itself, so two ranks that both believe they are the broadcast's root,
// or two sends matched against each other, both return OK (and the non-root data is not
// broadcast); their stray messages fail the communicator's next operation, naming the op. Operations have a deadline (options.timeout
// or COFAB_COLLECTIVE_TIMEOUT_MS): past it the operation fails with DeadlineExceeded naming the
// ranks that did not arrive and its sequence number. Any failure is sticky on the communicator.
//
// Sizes: count 0 and 1-rank communicators work everywhere. In-place use: pass the same view
// as input and output (allgather/reduce_scatter: the rank's block of the larger buffer); any
// other overlap of input and output is refused with InvalidArgument.
// Reductions: sum, avg, min, max over f32, f64, f16, bf16, i32, i64 (fabric/comm/reduce_kernels.h);
// every rank gets bitwise the same result.
#pragma once

#include <memory>
#include <optional>

#include "core/clock.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fabric/comm/communicator.h"
#include "fabric/comm/reduce_kernels.h"

namespace cofab::comm {

struct CollectiveOptions {
  // Bound on the operation, counted from the call. Zero: COFAB_COLLECTIVE_TIMEOUT_MS.
  Duration timeout{0};
  // An absolute deadline instead of `timeout` (wins when set).
  std::optional<Deadline> deadline;
};

enum class AllreduceAlgorithm : uint8_t {
  kAuto,    // direct below COFAB_ALLREDUCE_SMALL_BYTES, ring above; COFAB_ALLREDUCE_ALGO overrides
  kRing,    // pipelined, chunked ring: reduce-scatter then allgather (bandwidth-optimal)
  kDirect,  // one exchange with every peer (latency-optimal; each rank reduces in rank order)
};

// The deadline `options` give an operation starting now: `deadline`, else `timeout`, else
// COFAB_COLLECTIVE_TIMEOUT_MS (InvalidArgument when that is malformed). Every collective path
// uses it, the aggregators' too.
StatusOr<Deadline> collectiveDeadline(const CollectiveOptions& options);

struct AllreduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
};

struct ReduceScatterOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
};

struct BroadcastOptions : CollectiveOptions {
  int root = 0;
};

// A pending operation. Copyable (shared); the communicator keeps the operation alive while it
// runs, so a dropped handle does not cancel it.
class CollectiveHandle {
 public:
  CollectiveHandle() = default;
  explicit CollectiveHandle(std::shared_ptr<CollectiveOp> op) : op_(std::move(op)) {}
  // An operation running on the communicator's AllreducePath.
  explicit CollectiveHandle(std::shared_ptr<PendingOp> external) : external_(std::move(external)) {}
  static CollectiveHandle failed(const Status& status);

  // Waits until the operation completes or `deadline` passes (DeadlineExceeded; the operation
  // keeps running). Enforces the operation's own deadline as well.
  Status wait(Deadline deadline);
  // Whether the operation has completed (successfully or not). Never blocks.
  bool test() const;
  // The final status once test() is true; Unavailable while it runs.
  Status status() const;

 private:
  std::shared_ptr<CollectiveOp> op_;
  std::shared_ptr<PendingOp> external_;
  Status failed_;
};

// out[i] = op over ranks of in[i]. in and out have the same count and dtype; in == out is fine.
Status allreduce(Communicator& comm, const TensorView& in, const TensorView& out,
                 const AllreduceOptions& options = {});
inline Status allreduce(Communicator& comm, const TensorView& inout,
                        const AllreduceOptions& options = {}) {
  return allreduce(comm, inout, inout, options);
}
CollectiveHandle allreduceAsync(Communicator& comm, const TensorView& in, const TensorView& out,
                                const AllreduceOptions& options = {});

// in holds size() blocks of out.count elements; rank r gets block r reduced over the ranks.
Status reduceScatter(Communicator& comm, const TensorView& in, const TensorView& out,
                     const ReduceScatterOptions& options = {});
CollectiveHandle reduceScatterAsync(Communicator& comm, const TensorView& in, const TensorView& out,
                                    const ReduceScatterOptions& options = {});

// out holds size() blocks of in.count elements; block r is rank r's in.
Status allgather(Communicator& comm, const TensorView& in, const TensorView& out,
                 const CollectiveOptions& options = {});
CollectiveHandle allgatherAsync(Communicator& comm, const TensorView& in, const TensorView& out,
                                const CollectiveOptions& options = {});

// Every rank's data becomes the root's.
Status broadcast(Communicator& comm, const TensorView& data, const BroadcastOptions& options = {});
CollectiveHandle broadcastAsync(Communicator& comm, const TensorView& data,
                                const BroadcastOptions& options = {});

// Returns once every rank has called it.
Status barrier(Communicator& comm, const CollectiveOptions& options = {});
CollectiveHandle barrierAsync(Communicator& comm, const CollectiveOptions& options = {});

// Point-to-point. A send to `peer` matches that peer's recv from this rank with the same count
// and dtype; they are ordered with the collectives on the communicator (both sides must issue
// them at the same place relative to collectives). Like MPI_Isend/Irecv, posting both before
// waiting cannot deadlock, whatever the size: the next operation starts once one's messages
// are posted, without waiting for its bytes.
Status send(Communicator& comm, const TensorView& data, int peer,
            const CollectiveOptions& options = {});
Status recv(Communicator& comm, const TensorView& data, int peer,
            const CollectiveOptions& options = {});
CollectiveHandle sendAsync(Communicator& comm, const TensorView& data, int peer,
                           const CollectiveOptions& options = {});
CollectiveHandle recvAsync(Communicator& comm, const TensorView& data, int peer,
                           const CollectiveOptions& options = {});

}  // namespace cofab::comm

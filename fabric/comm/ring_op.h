// RingOp: the pipelined, chunked ring behind allreduce (reduce-scatter + allgather), reduce_scatter
// and allgather for large messages.
//
// The buffer is cut into one block per rank and every block into K chunks. Stage s sends one
// block to the right neighbour and receives one from the left; what arrives at stage s is what
// is sent at stage s + 1, chunk by chunk, so a chunk is forwarded as soon as it has been received
// and reduced: sends, receives and reductions of different chunks overlap. Receives are posted a
// window ahead into scratch slots (reduce-scatter stages) or straight into the output (allgather
// stages, no copy). Every rank ends with the same bits: each block is reduced along one chain and
// then copied. State is touched under the op's mutex only (see collective_op.h).
#pragma once

#include "core/tensor.h"
#include "fabric/comm/collective_op.h"

namespace cofab::comm {

struct RingPlan {
  enum class Mode : uint8_t { kAllreduce, kReduceScatter, kAllgather };
  Mode mode = Mode::kAllreduce;
  TensorView in;
  TensorView out;
  size_t chunkBytes = 1 << 20;  // target message size
  int window = 4;               // receives posted ahead
};

std::shared_ptr<CollectiveOp> makeRingOp(Communicator& comm, const OpSignature& signature,
                                         Deadline deadline, const RingPlan& plan);

}  // namespace cofab::comm

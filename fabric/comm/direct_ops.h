// Latency-oriented algorithms and point-to-point operations, each a CollectiveOp
// (fabric/comm/collective_op.h) posting all its messages at once:
//   - direct allreduce: every rank sends its input to every peer and reduces what it received
//     in rank order (one network step; the same bits on every rank);
//   - direct allgather and barrier (an exchange of empty messages);
//   - broadcast: the root sends to every rank (small) or a pipelined chain root -> root+1 -> ...
//     forwards chunk by chunk straight into the destination buffers (large);
//   - send / recv, cut into messages of at most kP2pMessageBytes.
#pragma once

#include <memory>

#include "core/tensor.h"
#include "fabric/comm/collective_op.h"

namespace cofab::comm {

inline constexpr size_t kP2pMessageBytes = 256u << 20;

std::shared_ptr<CollectiveOp> makeDirectAllreduce(Communicator& comm, const OpSignature& sig,
                                                  Deadline deadline, const TensorView& in,
                                                  const TensorView& out);
std::shared_ptr<CollectiveOp> makeDirectAllgather(Communicator& comm, const OpSignature& sig,
                                                  Deadline deadline, const TensorView& in,
                                                  const TensorView& out);
std::shared_ptr<CollectiveOp> makeBarrier(Communicator& comm, const OpSignature& sig,
                                          Deadline deadline);
// sig.algorithm: kDirect or kChain (chunkBytes: chain message size).
std::shared_ptr<CollectiveOp> makeBroadcast(Communicator& comm, const OpSignature& sig,
                                            Deadline deadline, const TensorView& data,
                                            size_t chunkBytes);
std::shared_ptr<CollectiveOp> makeP2p(Communicator& comm, const OpSignature& sig,
                                      Deadline deadline, const TensorView& data, bool sending);

}  // namespace cofab::comm

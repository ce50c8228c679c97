#include "fabric/ps/aggregator_collectives.h"

#include "fabric/ps/placement.h"

namespace cofab::ps {

uint64_t AggregatorCollectives::keyFor(DType dtype, size_t count) const {
  return keyBase_ ^ (mix64((static_cast<uint64_t>(count) << 8) | static_cast<uint8_t>(dtype)) &
                     0x00000000ffffffffull);
}

Status AggregatorCollectives::allreduce(const TensorView& in, const TensorView& out,
                                        const comm::AllreduceOptions& options) {
  PushPullOptions po;
  switch (options.op) {
    case comm::ReduceOp::kSum:
      po.op = ReduceOp::kSum;
      break;
    case comm::ReduceOp::kAvg:
      po.op = ReduceOp::kAverage;
      break;
    default:
      return Unimplemented("allreduce through aggregators supports sum and avg, not " +
                           std::string(comm::reduceOpName(options.op)));
  }
  Deadline deadline = Deadline::afterMs(300000);
  if (options.deadline) {
    deadline = *options.deadline;
  } else if (options.timeout.count() > 0) {
    deadline = Deadline::after(options.timeout);
  }
  return client_.pushPull(keyFor(in.dtype, in.count), in, out, po).wait(deadline);
}

}  // namespace cofab::ps

// AggregatorServer's model store entry point (the I/O-thread half): checks who is asking and
// that the request is well formed, then runs it on the engine that owns the (key, chunk) slot
// (model_store.h). Kept apart from aggregator_server.cc so the model store stays one feature.
#include "aggregator/aggregator_server.h"
#include "aggregator/model_store.h"
#include "fabric/ps/ps_protocol.h"

namespace cofab::aggregator {

using ps::ControlOp;
using ps::RejectReason;

void AggregatorServer::onModelMessage(const std::shared_ptr<Peer>& peer, const wire::Header& h,
                                      std::vector<uint8_t>&& payload) {
  const auto op = static_cast<ControlOp>(h.opcode);
  if (peer->workerRank < 0 || h.senderRank != static_cast<uint32_t>(peer->workerRank)) {
    peer->reject(metrics_, RejectReason::kUnknownWorker, h,
                 "model store requests come from workers of this job, as their own rank");
    return;
  }
  Event e;
  e.kind = Event::Kind::kModel;
  e.peer = peer;
  e.header = h;
  e.rank = peer->workerRank;
  if (op == ControlOp::kModelLeave) {
    broadcast(e);
    return;
  }
  if (draining_) {
    peer->reject(metrics_, RejectReason::kDraining, h, "the daemon is shutting down");
    return;
  }
  if (h.chunkCount == 0 || h.chunkIndex >= h.chunkCount) {
    peer->reject(metrics_, RejectReason::kMalformed, h, "a model request names chunk i of n >= 1");
    return;
  }
  if (op == ControlOp::kModelPull) {
    if (!payload.empty()) {
      peer->reject(metrics_, RejectReason::kMalformed, h, "a model pull carries no payload");
      return;
    }
  } else {
    if (h.dtype != DType::kF32) {
      peer->reject(metrics_, RejectReason::kUnsupportedDType, h,
                   "the model store holds f32, not " + std::string(dtypeName(h.dtype)));
      return;
    }
    if (payload.size() > options_.maxChunkBytes) {
      peer->reject(metrics_, RejectReason::kOversized, h,
                   std::to_string(payload.size()) + " bytes exceed --max-chunk-bytes " +
                       std::to_string(options_.maxChunkBytes));
      return;
    }
    // A chunk whose apply-and-pull answer cannot be one message (--max-chunk-bytes allows up to
    // 1 GiB) would fail the worker's connection at the answer, so it is refused here, saying why.
    if (payload.size() > ps::kMaxModelChunkBytes) {
      peer->reject(metrics_, RejectReason::kOversized, h,
                   std::to_string(payload.size()) + " bytes: a model chunk is at most " +
                       std::to_string(ps::kMaxModelChunkBytes) +
                       " (its apply-and-pull answer adds " +
                       std::to_string(ps::kModelApplyReplyBytes) + " bytes to one message)");
      return;
    }
    if (payload.empty() || payload.size() % sizeof(float) != 0) {
      peer->reject(metrics_, RejectReason::kWrongSize, h,
                   std::to_string(payload.size()) + " bytes is not a positive number of f32");
      return;
    }
  }
  metrics_.bytesIn.fetch_add(payload.size(), std::memory_order_relaxed);
  // The connection now carries this worker's state: its loss is a lost worker (kWorkerGone).
  if (!peer->active.exchange(true)) activateLink(peer->workerRank);
  e.payload = std::make_shared<std::vector<uint8_t>>(std::move(payload));
  engines_[engineFor(h.key, h.chunkIndex)]->post(std::move(e));
}

}  // namespace cofab::aggregator

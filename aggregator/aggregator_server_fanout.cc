// AggregatorServer's ControlOp::kFanOutRelease entry point (the I/O-thread half): checks the
// request, then every engine frees the fan-out slots of the key range it holds (engine.cc,
// onRelease) and the last one to finish acknowledges. Kept apart from aggregator_server.cc so
// the fan-out release stays one feature.
#include "aggregator/aggregator_server.h"

namespace cofab::aggregator {

void AggregatorServer::onFanOutRelease(const std::shared_ptr<Peer>& peer, const wire::Header& h,
                                       std::vector<uint8_t>&& payload) {
  if (peer->workerRank < 0 || h.senderRank != static_cast<uint32_t>(peer->workerRank)) {
    peer->reject(metrics_, ps::RejectReason::kUnknownWorker, h,
                 "fan-out releases come from workers of this job, as their own rank");
    return;
  }
  uint64_t count = 0;
  for (size_t i = 0; i < 8 && i < payload.size(); ++i) {
    count |= static_cast<uint64_t>(payload[i]) << (8 * i);
  }
  if (payload.size() != 8 || count == 0 || count > ps::kMaxFanOutReleaseKeys ||
      h.key + count < h.key) {
    peer->reject(metrics_, ps::RejectReason::kMalformed, h,
                 "a fan-out release carries a key count in [1, 2^24] (8 bytes) and must not wrap");
    return;
  }
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(payload));
  auto left = std::make_shared<std::atomic<int>>(static_cast<int>(engines_.size()));
  for (auto& engine : engines_) {
    Event e;
    e.kind = Event::Kind::kRelease;
    e.peer = peer;
    e.header = h;
    e.payload = shared;
    e.enginesLeft = left;
    engine->post(std::move(e));
  }
}

}  // namespace cofab::aggregator

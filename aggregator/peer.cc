#include "aggregator/peer.h"

namespace cofab::aggregator {

void Peer::send(const wire::Header& h, const void* data, size_t size,
                std::shared_ptr<const void> keep) const {
  if (unsent) unsent->fetch_add(1, std::memory_order_relaxed);
  conn->send(h, data, size, [keep = std::move(keep), counter = unsent](const Status&) {
    if (counter) counter->fetch_sub(1, std::memory_order_release);
  });
}

void Peer::sendControl(ps::ControlOp op, const wire::Header& about) const {
  send(ps::controlHeader(op, about), nullptr, 0, nullptr);
}

void Peer::sendText(ps::ControlOp op, const wire::Header& about, std::string_view text) const {
  auto payload = std::make_shared<std::string>(text);
  wire::Header h = ps::controlHeader(op, about);
  h.dtype = DType::kU8;  // the payload is text, not elements of the chunk's dtype
  send(h, payload->data(), payload->size(), payload);
}

void Peer::reject(Metrics& metrics, ps::RejectReason reason, const wire::Header& about,
                  std::string_view text) const {
  metrics.noteReject(reason);
  auto payload = std::make_shared<std::string>();
  payload->push_back(static_cast<char>(reason));
  payload->append(text);
  wire::Header h = ps::controlHeader(ps::ControlOp::kReject, about);
  h.dtype = DType::kU8;  // the payload is a reason, not elements of the chunk's dtype
  send(h, payload->data(), payload->size(), payload);
}

void Peer::sendResult(Metrics& metrics, const wire::Header& about,
                      const std::shared_ptr<const std::vector<uint8_t>>& result) const {
  wire::Header h;
  h.type = wire::MessageType::kPullReply;
  h.key = about.key;
  h.chunkIndex = about.chunkIndex;
  h.chunkCount = about.chunkCount;
  h.iteration = about.iteration;
  h.dtype = about.dtype;
  h.senderRank = about.senderRank;
  metrics.bytesOut.fetch_add(result->size(), std::memory_order_relaxed);
  send(h, result->data(), result->size(), result);
}

}  // namespace cofab::aggregator

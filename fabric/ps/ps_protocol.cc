#include "fabric/ps/ps_protocol.h"

#include <charconv>

namespace cofab::ps {

Reject parseReject(const std::vector<uint8_t>& payload) {
  Reject r;
  if (!payload.empty()) {
    r.reason = static_cast<RejectReason>(payload[0]);
    r.text.assign(payload.begin() + 1, payload.end());
  }
  return r;
}

std::optional<RejectReason> rejectReasonOf(const Status& status) {
  const std::string& m = status.message();
  const size_t at = m.find(" rejected ");
  if (status.ok() || at == std::string::npos) return std::nullopt;
  for (uint8_t code = 1; code <= kMaxRejectReason; ++code) {
    const auto reason = static_cast<RejectReason>(code);
    const std::string_view name = rejectReasonName(reason);
    if (name == "unknown") continue;  // an unassigned code
    if (m.find(": " + std::string(name) + ": ", at) != std::string::npos) return reason;
  }
  return std::nullopt;
}

std::string Reject::describe() const { return std::string(rejectReasonName(reason)) + ": " + text; }

std::string_view rejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kFinishedIteration:
      return "finished_iteration";
    case RejectReason::kBeyondWindow:
      return "beyond_window";
    case RejectReason::kUnknownWorker:
      return "unknown_worker";
    case RejectReason::kWrongSize:
      return "wrong_size";
    case RejectReason::kWrongDType:
      return "wrong_dtype";
    case RejectReason::kUnsupportedDType:
      return "unsupported_dtype";
    case RejectReason::kMalformed:
      return "malformed";
    case RejectReason::kOversized:
      return "oversized";
    case RejectReason::kWrongOp:
      return "wrong_op";
    case RejectReason::kDraining:
      return "draining";
    case RejectReason::kUninitialized:
      return "uninitialized";
    case RejectReason::kWrongCompression:
      return "wrong_compression";
    case RejectReason::kReleased:
      return "released";
    case RejectReason::kPullBacklog:
      return "pull_backlog";
  }
  return "unknown";
}

std::string workerPeerId(int rank) { return "worker " + std::to_string(rank); }
std::string aggregatorPeerId(int id) { return "agg " + std::to_string(id); }

namespace {
int parseTagged(std::string_view peerId, std::string_view tag) {
  if (peerId.size() <= tag.size() || peerId.substr(0, tag.size()) != tag) return -1;
  const std::string_view digits = peerId.substr(tag.size());
  int value = -1;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || value < 0) return -1;
  return value;
}
}  // namespace

int parseWorkerPeerId(std::string_view peerId) { return parseTagged(peerId, "worker "); }
int parseAggregatorPeerId(std::string_view peerId) { return parseTagged(peerId, "agg "); }

std::string serverAddressKey(std::string_view prefix, int id) {
  return std::string(prefix) + "/server/" + std::to_string(id);
}
std::string serverCountKey(std::string_view prefix) { return std::string(prefix) + "/count"; }
std::string serverMaxChunkKey(std::string_view prefix, int id) {
  return std::string(prefix) + "/max_chunk_bytes/" + std::to_string(id);
}

wire::Header controlHeader(ControlOp op, const wire::Header& about) {
  wire::Header h;
  h.type = wire::MessageType::kControl;
  h.opcode = static_cast<uint8_t>(op);
  h.key = about.key;
  h.chunkIndex = about.chunkIndex;
  h.chunkCount = about.chunkCount;
  h.iteration = about.iteration;
  h.senderRank = about.senderRank;
  h.dtype = about.dtype;
  h.sequence = about.sequence;
  return h;
}

}  // namespace cofab::ps

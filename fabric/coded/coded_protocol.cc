#include "fabric/coded/coded_protocol.h"

#include <cmath>
#include <cstring>

#include "core/param.h"

namespace cofab::coded {

COFAB_PARAM_INT(kCodedSetupTimeoutMs, "COFAB_CODED_SETUP_TIMEOUT_MS", 30000, 1, 3600000,
                "coded task service: bound on master/worker setup (rendezvous, connect, load)");

StatusOr<Duration> codedSetupTimeout(Duration given) {
  if (given != Duration{0}) return given;
  COFAB_ASSIGN_OR_RETURN(int64_t ms, kCodedSetupTimeoutMs.get());
  return Duration(Millis(ms));
}

namespace {

// Bounds on shapes from a peer: far above anything the service is used for, low enough that
// rows * cols * 4 cannot overflow.
constexpr int64_t kMaxDim = int64_t{1} << 24;

Status checkShape(const char* what, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || rows > kMaxDim || cols > kMaxDim) {
    return InvalidArgument(std::string(what) + ": bad shape " + std::to_string(rows) + "x" +
                           std::to_string(cols));
  }
  return OkStatus();
}

template <typename Record>
StatusOr<Record> readRecord(const char* what, std::span<const uint8_t> payload) {
  if (payload.size() < sizeof(Record)) {
    return InvalidArgument(std::string(what) + ": payload of " + std::to_string(payload.size()) +
                           " bytes is shorter than its " + std::to_string(sizeof(Record)) +
                           "-byte record");
  }
  Record r;
  std::memcpy(&r, payload.data(), sizeof(Record));
  return r;
}

Status checkData(const char* what, std::span<const uint8_t> payload, size_t recordBytes,
                 int64_t rows, int64_t cols) {
  const uint64_t want = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * sizeof(float);
  if (payload.size() - recordBytes != want) {
    return InvalidArgument(std::string(what) + ": " + std::to_string(rows) + "x" +
                           std::to_string(cols) + " f32 needs " + std::to_string(want) +
                           " data bytes, got " + std::to_string(payload.size() - recordBytes));
  }
  return OkStatus();
}

}  // namespace

Status checkMatrixMessage(const char* what, int64_t rows, int64_t cols, size_t recordBytes) {
  COFAB_RETURN_IF_ERROR(checkShape(what, rows, cols));
  // rows, cols <= 2^24: the product of the three fits in 64 bits.
  const uint64_t bytes =
      static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * sizeof(float) + recordBytes;
  if (bytes > wire::kDefaultMaxPayload) {
    return InvalidArgument(std::string(what) + ": " + std::to_string(rows) + "x" +
                           std::to_string(cols) + " f32 is a " + std::to_string(bytes) +
                           "-byte message, over the transports' limit of " +
                           std::to_string(wire::kDefaultMaxPayload) + " bytes");
  }
  return OkStatus();
}

const char* codedOpName(uint8_t op) {
  switch (static_cast<CodedOp>(op)) {
    case CodedOp::kRegister:
      return "register";
    case CodedOp::kLoad:
      return "load";
    case CodedOp::kLoaded:
      return "loaded";
    case CodedOp::kCompute:
      return "compute";
    case CodedOp::kResult:
      return "result";
    case CodedOp::kCancel:
      return "cancel";
    case CodedOp::kCancelReport:
      return "cancel-report";
    case CodedOp::kTaskError:
      return "task-error";
    case CodedOp::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

const char* cancelStageName(CancelStage stage) {
  switch (stage) {
    case CancelStage::kQueued:
      return "queued";
    case CancelStage::kDelaying:
      return "delaying";
    case CancelStage::kComputing:
      return "computing";
    case CancelStage::kFinished:
      return "finished";
  }
  return "unknown";
}

wire::Header codedHeader(CodedOp op, uint32_t sender, uint64_t request, uint64_t payloadBytes) {
  wire::Header h;
  h.type = wire::MessageType::kData;
  h.opcode = static_cast<uint8_t>(op);
  h.senderRank = sender;
  h.sequence = request;
  h.payloadLength = payloadBytes;
  return h;
}

template <typename Record>
std::vector<uint8_t> packRecord(const Record& record, std::span<const float> data) {
  std::vector<uint8_t> out(sizeof(Record) + data.size_bytes());
  std::memcpy(out.data(), &record, sizeof(Record));
  if (!data.empty()) std::memcpy(out.data() + sizeof(Record), data.data(), data.size_bytes());
  return out;
}
template std::vector<uint8_t> packRecord(const LoadRecord&, std::span<const float>);
template std::vector<uint8_t> packRecord(const ComputeRecord&, std::span<const float>);
template std::vector<uint8_t> packRecord(const CancelRecord&, std::span<const float>);

StatusOr<LoadRecord> parseLoad(std::span<const uint8_t> payload, const float** data) {
  COFAB_ASSIGN_OR_RETURN(LoadRecord r, readRecord<LoadRecord>("coded load", payload));
  COFAB_RETURN_IF_ERROR(checkShape("coded load block", r.rows, r.cols));
  // Delays are written `!(x >= 0) || !isfinite(x)`: NaN fails every comparison, and NaN or +inf
  // would reach the worker's duration_cast (undefined behaviour).
  const auto badDelay = [](double ms) { return !(ms >= 0) || !std::isfinite(ms); };
  if (r.tasks <= 0 || r.rowBlock <= 0 || !(r.load > 0 && r.load <= 1) || badDelay(r.shiftMs) ||
      badDelay(r.tailMeanMs) || badDelay(r.rowBlockDelayMs)) {
    return InvalidArgument("coded load: bad parameters (tasks " + std::to_string(r.tasks) +
                           ", rowBlock " + std::to_string(r.rowBlock) + ", load " +
                           std::to_string(r.load) + ", delays must be finite and >= 0: shiftMs " +
                           std::to_string(r.shiftMs) + ", tailMeanMs " +
                           std::to_string(r.tailMeanMs) + ", rowBlockDelayMs " +
                           std::to_string(r.rowBlockDelayMs) + ")");
  }
  COFAB_RETURN_IF_ERROR(checkData("coded load", payload, sizeof(LoadRecord), r.rows, r.cols));
  *data = reinterpret_cast<const float*>(payload.data() + sizeof(LoadRecord));
  return r;
}

StatusOr<ComputeRecord> parseCompute(std::span<const uint8_t> payload, const float** data) {
  COFAB_ASSIGN_OR_RETURN(ComputeRecord r, readRecord<ComputeRecord>("coded compute", payload));
  COFAB_RETURN_IF_ERROR(checkShape("coded compute B", r.bRows, r.bCols));
  COFAB_RETURN_IF_ERROR(
      checkData("coded compute", payload, sizeof(ComputeRecord), r.bRows, r.bCols));
  *data = reinterpret_cast<const float*>(payload.data() + sizeof(ComputeRecord));
  return r;
}

StatusOr<CancelRecord> parseCancel(std::span<const uint8_t> payload) {
  COFAB_ASSIGN_OR_RETURN(CancelRecord r, readRecord<CancelRecord>("coded cancel report", payload));
  if (payload.size() != sizeof(CancelRecord) || r.stage < 0 || r.stage > 3 || r.rowBlocksDone < 0 ||
      r.rowBlocksDone > r.rowBlocksTotal) {
    return InvalidArgument("coded cancel report: malformed (stage " + std::to_string(r.stage) +
                           ", " + std::to_string(r.rowBlocksDone) + "/" +
                           std::to_string(r.rowBlocksTotal) + " row blocks)");
  }
  return r;
}

}  // namespace cofab::coded

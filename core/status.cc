#include "core/status.h"

#include <cstring>

namespace cofab {

std::string_view statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kRemoteError: return "RemoteError";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::toString() const {
  if (ok()) return "OK";
  std::string out(statusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::withContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

std::ostream& operator<<(std::ostream& os, const Status& status) {
  return os << status.toString();
}

Status errnoStatus(StatusCode code, std::string_view call, int err, std::string_view peer) {
  char buf[128];
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  std::string m(call);
  m += " failed: ";
  m += text;
  m += " (errno " + std::to_string(err) + ")";
  if (!peer.empty()) {
    m += " (peer ";
    m += peer;
    m += ")";
  }
  return Status(code, std::move(m));
}

}  // namespace cofab

// Status and StatusOr<T>: how every fallible cofab call reports its outcome (DESIGN.md §2).
//
// Library code never throws and never exits: it returns a Status whose message says what was
// wrong and what to do. Broken invariants are COFAB_CHECK (core/check.h), not Status.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "core/check.h"

namespace cofab {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,
  kFailedPrecondition,
  kUnavailable,
  kDeadlineExceeded,
  kCancelled,
  kAborted,
  kRemoteError,
  kIoError,
  kResourceExhausted,
  kDataLoss,
  kUnimplemented,
  kInternal,
};

std::string_view statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "DeadlineExceeded: waiting for key 'x'" — for logs and test failure output.
  std::string toString() const;

  // Returns a copy whose message is prefixed with `context: `, keeping the code.
  Status withContext(std::string_view context) const;

  // Explicitly discards a status where ignoring it is the right thing (best-effort cleanup).
  void ignoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status RemoteError(std::string m) { return {StatusCode::kRemoteError, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Wraps a failed C call: "<call> failed: <strerror(err)> (errno N)[ (peer)]" with `code`.
Status errnoStatus(StatusCode code, std::string_view call, int err, std::string_view peer = {});

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    COFAB_CHECK(!status_.ok()) << "StatusOr constructed from an OK Status without a value";
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    COFAB_CHECK(!status_.ok()) << "StatusOr constructed from an OK Status without a value";
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    COFAB_CHECK(ok()) << "value() on error: " << status_.toString();
    return *value_;
  }
  T& value() & {
    COFAB_CHECK(ok()) << "value() on error: " << status_.toString();
    return *value_;
  }
  T&& value() && {
    COFAB_CHECK(ok()) << "value() on error: " << status_.toString();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace cofab

#define COFAB_STATUS_CONCAT_INNER(a, b) a##b
#define COFAB_STATUS_CONCAT(a, b) COFAB_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define COFAB_RETURN_IF_ERROR(expr)                    \
  do {                                                 \
    ::cofab::Status cofab_status_ = (expr);            \
    if (!cofab_status_.ok()) return cofab_status_;     \
  } while (0)

// COFAB_ASSIGN_OR_RETURN(auto x, makeX()); — declares/assigns on success, returns on error.
#define COFAB_ASSIGN_OR_RETURN(lhs, expr) \
  COFAB_ASSIGN_OR_RETURN_IMPL(COFAB_STATUS_CONCAT(cofab_statusor_, __LINE__), lhs, expr)
#define COFAB_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

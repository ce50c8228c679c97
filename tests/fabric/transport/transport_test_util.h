// Helpers for the transport suites: a pair of contexts with a connected pair of connections,
// and completion recorders that check the callback contract (exactly once, never inline).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fabric/transport/registry.h"

namespace cofab::transport::testing {

// Set by a test while it is inside a transport call, so callbacks can detect inline calls.
inline thread_local bool tInsideCall = false;
struct InsideCall {
  InsideCall() { tInsideCall = true; }
  ~InsideCall() { tInsideCall = false; }
};

// Counts completions and remembers statuses; wait() blocks until `n` have arrived.
class Recorder {
 public:
  void record(const Status& s, const wire::Header& h = {}, size_t index = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (tInsideCall) ++inline_;
    statuses_.push_back(s);
    headers_.push_back(h);
    order_.push_back(index);
    cv_.notify_all();
  }
  SendCallback sendCb(size_t index = 0) {
    return [this, index](const Status& s) { record(s, {}, index); };
  }
  RecvCallback recvCb(size_t index = 0) {
    return [this, index](const Status& s, const wire::Header& h) { record(s, h, index); };
  }
  // True when `n` completions arrived before the timeout.
  bool wait(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return statuses_.size() >= n; });
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_.size();
  }
  int inlineCalls() {
    std::lock_guard<std::mutex> lock(mu_);
    return inline_;
  }
  std::vector<Status> statuses() {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_;
  }
  std::vector<wire::Header> headers() {
    std::lock_guard<std::mutex> lock(mu_);
    return headers_;
  }
  std::vector<size_t> order() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> statuses_;
  std::vector<wire::Header> headers_;
  std::vector<size_t> order_;
  int inline_ = 0;
};

struct ConnPair {
  std::shared_ptr<Connection> client;
  std::shared_ptr<Connection> server;
};

inline Deadline testDeadline() { return Deadline::afterMs(20000); }

// Deterministic byte pattern for payload checks.
inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

}  // namespace cofab::transport::testing

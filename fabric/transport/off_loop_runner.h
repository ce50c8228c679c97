// OffLoopRunner: runs a connection's callbacks when it has no I/O thread left to run them on (its
// context was closed and joined), keeping the Connection contract there: never inline, one at a
// time, in the order they were posted (connection.h).
//
// A job starts a short-lived thread only when none is running for this runner; that thread runs
// the jobs queued meanwhile, in order, and ends when the queue is empty. One runner per
// connection. Shared-owned: the thread keeps the runner alive until it is done.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace cofab::transport {

class OffLoopRunner : public std::enable_shared_from_this<OffLoopRunner> {
 public:
  // Queues `job`; a job may post further ones (they run after it, on the same thread).
  void post(std::function<void()> job);

 private:
  void drain();

  std::mutex mu_;
  std::deque<std::function<void()>> jobs_;  // under mu_
  bool running_ = false;                    // under mu_: a thread is draining jobs_
};

}  // namespace cofab::transport

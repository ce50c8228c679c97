// Worker: the loopback context's one thread, running posted tasks in order and timed tasks (the
// delayed deliveries of fault injection) at their time. Internal to fabric/transport/loopback.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "core/clock.h"

namespace cofab::transport::loopback {

class Worker {
 public:
  Worker();
  ~Worker();  // stop() + join()

  // False once stopped (the task will never run).
  bool post(std::function<void()> fn);
  bool postAt(Clock::time_point when, std::function<void()> fn);
  // Runs what is queued, drops timers not yet due, then exits.
  void stop();
  void join();
  bool inWorkerThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::deque<std::function<void()>> tasks_;
  std::multimap<Clock::time_point, std::function<void()>> timers_;
  std::thread thread_;
};

}  // namespace cofab::transport::loopback

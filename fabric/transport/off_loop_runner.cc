#include "fabric/transport/off_loop_runner.h"

#include <thread>
#include <utility>

namespace cofab::transport {

void OffLoopRunner::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    if (running_) return;  // the running thread takes it after the jobs before it
    running_ = true;
  }
  std::thread([self = shared_from_this()] { self->drain(); }).detach();
}

void OffLoopRunner::drain() {
  for (;;) {
    std::function<void()> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.empty()) {
        running_ = false;
        return;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace cofab::transport

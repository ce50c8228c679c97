#include "fabric/transport/loopback/worker.h"

#include "core/check.h"

namespace cofab::transport::loopback {

Worker::Worker() : thread_([this] { run(); }) {}

Worker::~Worker() {
  stop();
  join();
}

bool Worker::post(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return false;
  tasks_.push_back(std::move(fn));
  cv_.notify_one();
  return true;
}

bool Worker::postAt(Clock::time_point when, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return false;
  timers_.emplace(when, std::move(fn));
  cv_.notify_one();
  return true;
}

void Worker::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_one();
}

void Worker::join() {
  if (!thread_.joinable()) return;
  COFAB_CHECK(!inWorkerThread()) << "a loopback context was joined from its own callback";
  thread_.join();
}

void Worker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!tasks_.empty()) {
      auto fn = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      fn();
      fn = nullptr;  // destroy captures outside the lock
      lock.lock();
      continue;
    }
    if (stopping_) break;
    if (!timers_.empty()) {
      auto it = timers_.begin();
      if (it->first <= Clock::now()) {
        auto fn = std::move(it->second);
        timers_.erase(it);
        lock.unlock();
        fn();
        fn = nullptr;
        lock.lock();
        continue;
      }
      cv_.wait_until(lock, it->first);
    } else {
      cv_.wait(lock);
    }
  }
  stopped_ = true;
  auto timers = std::move(timers_);
  timers_.clear();
  lock.unlock();
  timers.clear();
}

}  // namespace cofab::transport::loopback

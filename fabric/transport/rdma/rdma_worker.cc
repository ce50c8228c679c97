#include "fabric/transport/rdma/rdma_worker.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace cofab::transport::rdma {

Worker::Worker() : thread_([this] { run(); }) {}

Worker::~Worker() {
  stop();
  join();
}

bool Worker::post(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exited_) return false;
  tasks_.push_back(std::move(fn));
  cv_.notify_one();
  return true;
}

void Worker::postOrDetach(std::function<void()> fn) {
  // `fn` is moved into post() only when it will run there; a refused post leaves it intact.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!exited_) {
      tasks_.push_back(std::move(fn));
      cv_.notify_one();
      return;
    }
  }
  offLoop_->post(std::move(fn));  // a thread per completion let them overlap and reorder
}

bool Worker::add(std::shared_ptr<Pollable> p) {
  return post([this, p = std::move(p)]() mutable {
    // Only a pollable added after stop()'s shutdown task ran must be shut down here. One added
    // before it (queued earlier) is shut down by that task, after the operations posted in
    // between have run: shutting it down here, merely because stop() was called meanwhile, made
    // a receive posted before the close fail as "posted after close" (FailedPrecondition)
    // instead of Cancelled.
    if (shutDown_) p->shutdown();
    pollables_.push_back(std::move(p));
  });
}

void Worker::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  stopping_ = true;
  // Shutting the endpoints down is itself a task, so it runs after what was already posted.
  tasks_.push_back([this] {
    shutDown_ = true;
    for (auto& p : pollables_) p->shutdown();
  });
  cv_.notify_one();
}

void Worker::setExitHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  exitHook_ = std::move(hook);
}

void Worker::join() {
  if (!thread_.joinable()) return;
  COFAB_CHECK(!inWorkerThread()) << "an rdma context was joined from its own callback";
  thread_.join();
}

void Worker::run() {
  // Idle back-off: busy-poll while traffic flows, then sleep in growing steps (bounded at 1 ms)
  // so an idle context does not burn a core; a posted task wakes it at once.
  int idleRounds = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    bool progress = false;
    while (!tasks_.empty()) {
      auto fn = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      fn();
      fn = nullptr;  // destroy captures outside the lock
      lock.lock();
      progress = true;
    }
    lock.unlock();
    for (auto& p : pollables_) progress |= p->poll();
    pollables_.erase(std::remove_if(pollables_.begin(), pollables_.end(),
                                    [](const auto& p) { return p->finished(); }),
                     pollables_.end());
    lock.lock();
    if (stopping_ && tasks_.empty() && pollables_.empty()) break;
    if (progress) {
      idleRounds = 0;
      continue;
    }
    if (++idleRounds < 64 || !tasks_.empty()) continue;
    const auto sleep = std::chrono::microseconds(std::min(1000, 10 * (idleRounds - 63)));
    cv_.wait_for(lock, sleep, [&] { return !tasks_.empty(); });
  }
  exited_ = true;
  auto leftovers = std::move(tasks_);
  auto hook = std::move(exitHook_);
  lock.unlock();
  // Tasks that raced with the exit still run (they complete callbacks exactly once).
  for (auto& fn : leftovers) fn();
  if (hook) hook();
}

}  // namespace cofab::transport::rdma

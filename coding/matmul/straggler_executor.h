// StragglerExecutor: runs a job's tasks on a thread pool with injected straggler delays, returns
// as soon as enough have finished, and cancels the rest.
//
// "Enough" is per group: every task belongs to a group (default: its own) and the run is
// complete once `neededGroups` distinct groups have one finished task each. That covers coded
// computation (n groups, need k), uncoded (n groups, need n) and r-fold replication (n/r groups
// of r replicas, need all groups).
//
// Each task first waits its delay (DelayModel, counted from the start of the run; interrupted by
// cancellation), then runs the task function unless cancelled meanwhile. Task functions may
// poll the CancelToken to stop early: returning Cancelled then counts the task as cancelled,
// not failed.
// run() returns after every task of the run has stopped, so the function may borrow caller
// memory; the time spent waiting for stragglers to stop is reported apart (drainMs), since a
// real deployment would not wait for it.
//
// Threads: the pool's threads are owned by the executor and joined by its destructor. run() is
// called from one thread at a time; task functions run on pool threads, concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "coding/matmul/delay_model.h"
#include "core/clock.h"
#include "core/status.h"

namespace cofab::coding {

class CancelToken {
 public:
  bool cancelled() const { return flag_->load(std::memory_order_acquire); }
  explicit CancelToken(const std::atomic<bool>* flag) : flag_(flag) {}

 private:
  const std::atomic<bool>* flag_;
};

using StragglerTask = std::function<Status(int task, const CancelToken& cancel)>;

// The most tasks one run takes (each has its own bookkeeping and output here): more is a
// mistake to refuse, not an allocation to attempt.
inline constexpr int kMaxStragglerTasks = 1 << 16;

struct StragglerRunSpec {
  int tasks = 0;            // 1 to kMaxStragglerTasks
  std::vector<int> groups;  // group id per task, in [0, tasks); empty = one group per task
  int neededGroups = 0;
  double load = 1.0;                  // passed to the delay model
  int64_t run = 0;                    // passed to the delay model
  const DelayModel* delay = nullptr;  // null = no delay; borrowed for the call
  // When the needed groups have not completed by then, the run is cancelled and reports
  // DeadlineExceeded (after the task functions already running have returned).
  Deadline deadline = Deadline::never();
};

struct StragglerReport {
  std::vector<int> used;         // tasks that completed a group, in arrival order
  std::vector<double> finishMs;  // per task: when it finished, or -1 (cancelled or failed)
  std::vector<double> delayMs;   // per task: the injected delay
  double completionMs = 0;       // when the last needed group completed
  double drainMs = 0;            // from completion until every task had stopped
  // Tasks not used: never ran, stopped early (returned Cancelled after the run was cancelled)
  // or finished late.
  int cancelled = 0;
  int failed = 0;  // tasks whose function returned any other error
};

struct StragglerExecutorOptions {
  // Tasks beyond this queue up, as on a cluster with fewer workers; a free thread takes the
  // queued task whose delay ends first.
  int threads = 16;
};

class StragglerExecutor {
 public:
  static StatusOr<std::unique_ptr<StragglerExecutor>> create(
      const StragglerExecutorOptions& options);
  ~StragglerExecutor();
  StragglerExecutor(const StragglerExecutor&) = delete;
  StragglerExecutor& operator=(const StragglerExecutor&) = delete;

  // Runs spec.tasks tasks of `fn`. DataLoss (naming the failed tasks and the first error) as
  // soon as too many tasks failed for the needed groups to complete, without waiting for the
  // others; DeadlineExceeded (naming the unfinished tasks) if spec.deadline passes first.
  StatusOr<StragglerReport> run(const StragglerRunSpec& spec, const StragglerTask& fn);

 private:
  explicit StragglerExecutor(int threads);
  void workerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace cofab::coding

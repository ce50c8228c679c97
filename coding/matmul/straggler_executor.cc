#include "coding/matmul/straggler_executor.h"

#include <algorithm>
#include <vector>

#include "core/clock.h"

namespace cofab::coding {

StatusOr<std::unique_ptr<StragglerExecutor>> StragglerExecutor::create(
    const StragglerExecutorOptions& options) {
  if (options.threads < 1 || options.threads > 1024) {
    return InvalidArgument("StragglerExecutor threads must be in [1, 1024], got " +
                           std::to_string(options.threads));
  }
  return std::unique_ptr<StragglerExecutor>(new StragglerExecutor(options.threads));
}

StragglerExecutor::StragglerExecutor(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { workerLoop(); });
}

StragglerExecutor::~StragglerExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void StragglerExecutor::workerLoop() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

namespace {

// Shared between run() and the run's tasks; run() waits for every task before returning.
struct RunState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> cancel{false};
  std::vector<bool> groupDone;
  std::vector<int> groupAlive;  // tasks of each group that have not failed
  std::vector<bool> taskFailed;
  int groupsDone = 0;
  // Distinct groups that are done or still have a task that may finish; below neededGroups,
  // the run is impossible.
  int groupsPossible = 0;
  bool impossible = false;
  int finishedOrFailed = 0;
  int stopped = 0;  // tasks that returned from their job, whatever happened
  int64_t completionNs = -1;
  Status firstError;
  StragglerReport report;
};

}  // namespace

StatusOr<StragglerReport> StragglerExecutor::run(const StragglerRunSpec& spec,
                                                 const StragglerTask& fn) {
  const int n = spec.tasks;
  if (n < 1 || n > kMaxStragglerTasks) {
    return InvalidArgument("straggler run: tasks must be in [1, " +
                           std::to_string(kMaxStragglerTasks) + "], got " + std::to_string(n));
  }
  if (!spec.groups.empty() && static_cast<int>(spec.groups.size()) != n) {
    return InvalidArgument("straggler run: groups has " + std::to_string(spec.groups.size()) +
                           " entries for " + std::to_string(n) + " tasks");
  }
  std::vector<int> groups = spec.groups;
  if (groups.empty()) {
    for (int i = 0; i < n; ++i) groups.push_back(i);
  }
  std::vector<bool> present(n, false);
  for (int g : groups) {
    if (g < 0 || g >= n) {
      return InvalidArgument("straggler run: group id " + std::to_string(g) + " outside [0, " +
                             std::to_string(n) + ")");
    }
    present[g] = true;
  }
  int distinct = 0;
  for (bool p : present) distinct += p;
  if (spec.neededGroups < 1 || spec.neededGroups > distinct) {
    return InvalidArgument("straggler run: neededGroups " + std::to_string(spec.neededGroups) +
                           " must be in [1, " + std::to_string(distinct) + "]");
  }

  auto st = std::make_shared<RunState>();
  st->groupDone.assign(n, false);
  st->groupAlive.assign(n, 0);
  for (int g : groups) ++st->groupAlive[g];
  st->taskFailed.assign(n, false);
  st->groupsPossible = distinct;
  st->report.finishMs.assign(n, -1.0);
  st->report.delayMs.assign(n, 0.0);
  std::vector<Duration> delays(static_cast<size_t>(n), Duration{0});
  for (int i = 0; i < n; ++i) {
    if (spec.delay != nullptr) {
      delays[i] = spec.delay->delay({.run = spec.run, .task = i, .tasks = n, .load = spec.load});
    }
    st->report.delayMs[i] = std::chrono::duration<double, std::milli>(delays[i]).count();
  }
  // The pool takes tasks in the order they become ready (earliest delay first, ties by index).
  // In index order a long straggler at the head of the queue held a pool thread through its
  // delay while tasks behind it, long ready, waited: with fewer threads than tasks a "never
  // finishes" one hung a run that enough others could have finished.
  std::vector<int> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return delays[a] < delays[b]; });
  const int64_t t0 = nowNs();
  for (int i : order) {
    const Duration delay = delays[i];
    auto job = [st, i, delay, t0, &fn, group = groups[i], needed = spec.neededGroups] {
      bool ran = false;
      Status result;
      {
        std::unique_lock<std::mutex> lock(st->mu);
        // The delay counts from the start of the run, as if the task had been sent then. A
        // delay too long to add (a "never finishes" straggler) waits for cancellation only.
        const Clock::time_point start{Duration(t0)};
        auto cancelled = [&] { return st->cancel.load(); };
        if (delay >= Clock::time_point::max() - start) {
          st->cv.wait(lock, cancelled);
        } else {
          st->cv.wait_until(lock, start + delay, cancelled);
        }
      }
      if (!st->cancel.load()) {
        ran = true;
        result = fn(i, CancelToken(&st->cancel));
      }
      std::lock_guard<std::mutex> lock(st->mu);
      ++st->stopped;
      if (ran && result.ok() && !st->cancel.load()) {
        st->report.finishMs[i] = (nowNs() - t0) / 1e6;
        if (!st->groupDone[group]) {
          st->groupDone[group] = true;
          ++st->groupsDone;
          st->report.used.push_back(i);
          if (st->groupsDone == needed) {
            st->completionNs = nowNs();
            st->cancel.store(true);
          }
        }
      } else if (ran && !result.ok() &&
                 !(result.code() == StatusCode::kCancelled && st->cancel.load())) {
        // A task that noticed its CancelToken and returned Cancelled stopped early: counted
        // as cancelled below, not as a failure (nor as the run's first error).
        ++st->report.failed;
        st->taskFailed[i] = true;
        if (st->firstError.ok()) st->firstError = result.withContext("task " + std::to_string(i));
        // The run stops as soon as failures alone decide it, not at the deadline (or never).
        if (--st->groupAlive[group] == 0 && !st->groupDone[group] &&
            --st->groupsPossible < needed && st->completionNs < 0) {
          st->impossible = true;
          st->cancel.store(true);
        }
      } else {
        ++st->report.cancelled;
      }
      st->cv.notify_all();
    };
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  std::unique_lock<std::mutex> lock(st->mu);
  auto done = [&] { return st->completionNs >= 0 || st->impossible || st->stopped == n; };
  bool expired = false;
  if (spec.deadline.isNever()) {
    st->cv.wait(lock, done);
  } else {
    expired = !st->cv.wait_until(lock, spec.deadline.when(), done);
  }
  st->cancel.store(true);
  st->cv.notify_all();
  // Cancellation interrupts every delay; only task functions already running are waited for.
  st->cv.wait(lock, [&] { return st->stopped == n; });
  const int64_t end = nowNs();
  // Who is missing: tasks that neither finished nor failed, and those that failed.
  std::string unfinished, failed;
  for (int i = 0; i < n; ++i) {
    std::string& list = st->taskFailed[i] ? failed : unfinished;
    if (st->taskFailed[i] || st->report.finishMs[i] < 0) {
      list += (list.empty() ? "" : ", ") + std::to_string(i);
    }
  }
  if (expired && st->completionNs < 0 && !st->impossible) {
    return DeadlineExceeded("straggler run: deadline passed with " +
                            std::to_string(st->groupsDone) + " of " +
                            std::to_string(spec.neededGroups) +
                            " needed groups complete; unfinished tasks: " + unfinished +
                            (failed.empty() ? "" : "; failed tasks: " + failed));
  }
  if (st->completionNs < 0) {
    return DataLoss("straggler run: only " + std::to_string(st->groupsDone) + " of " +
                    std::to_string(spec.neededGroups) + " needed groups can complete; " +
                    std::to_string(st->report.failed) + " task(s) failed (" + failed +
                    "), first: " + st->firstError.toString());
  }
  st->report.completionMs = (st->completionNs - t0) / 1e6;
  st->report.drainMs = (end - st->completionNs) / 1e6;
  return std::move(st->report);
}

}  // namespace cofab::coding

// StragglerExecutor and the three matmul strategies on it: correctness of C, which tasks were
// used, cancellation of stragglers, task failures, and the delay models.
#include "coding/matmul/straggler_executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "coding/matmul/straggler_matmul.h"

namespace cofab::coding {
namespace {

std::vector<float> randomVec(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double maxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

class StragglerMatmulTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ex = StragglerExecutor::create({.threads = 8});
    ASSERT_TRUE(ex.ok());
    executor_ = std::move(ex).value();
    a_ = randomVec(96 * 32, 1);
    b_ = randomVec(32 * 20, 2);
    want_.assign(96 * 20, 0);
    ASSERT_TRUE(gemmF32(a(), b(), {want_.data(), 96, 20, 0}).ok());
  }
  ConstMatrixView a() const { return {a_.data(), 96, 32, 0}; }
  ConstMatrixView b() const { return {b_.data(), 32, 20, 0}; }

  std::unique_ptr<StragglerExecutor> executor_;
  std::vector<float> a_, b_, want_;
};

TEST_F(StragglerMatmulTest, CodedSkipsTheSlowTasksAndDecodes) {
  auto cm = CodedMatmul::create({.n = 8, .k = 6});
  ASSERT_TRUE(cm.ok());
  auto enc = cm->encode(a());
  ASSERT_TRUE(enc.ok());
  // Tasks 1 and 4 straggle far beyond anything else: the run must finish without them and
  // cancel them (their wait is interrupted, so the test does not sleep 60 s).
  std::vector<double> trace(8, 0.0);
  trace[1] = trace[4] = 60000.0;
  auto delay = TraceDelay::fromMillis(trace);
  ASSERT_TRUE(delay.ok());
  std::vector<float> c(96 * 20);
  auto r = runCodedMatmul(*cm, *enc, b(), {c.data(), 96, 20, 0},
                          {.executor = executor_.get(), .delay = &*delay});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->decoded);
  EXPECT_EQ(r->exec.used.size(), 6u);
  for (int t : r->exec.used) EXPECT_TRUE(t != 1 && t != 4) << t;
  EXPECT_GE(r->exec.cancelled, 2);
  EXPECT_LT(r->exec.finishMs[1], 0);
  EXPECT_LE(maxRelDiff(c, want_), 1e-4);
}

TEST_F(StragglerMatmulTest, CodedWithoutDelaysIsExactWhenSystematicWin) {
  auto cm = CodedMatmul::create({.n = 6, .k = 4});
  auto enc = cm->encode(a());
  // Parity tasks straggle: the systematic four are used, no decode.
  auto delay = TraceDelay::fromMillis({0, 0, 0, 0, 60000, 60000});
  std::vector<float> c(96 * 20);
  auto r = runCodedMatmul(*cm, *enc, b(), {c.data(), 96, 20, 0},
                          {.executor = executor_.get(), .delay = &*delay});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->decoded);
  EXPECT_LE(maxRelDiff(c, want_), 1e-6);
}

TEST_F(StragglerMatmulTest, UncodedAndReplicatedGiveTheProduct) {
  auto delay = ShiftedExponentialDelay::create({.shiftMs = 0.1, .tailMeanMs = 1, .seed = 3});
  ASSERT_TRUE(delay.ok());
  for (int run = 0; run < 3; ++run) {
    std::vector<float> c1(96 * 20, NAN), c2(96 * 20, NAN);
    auto u = runUncodedMatmul(a(), b(), {c1.data(), 96, 20, 0}, 8,
                              {.executor = executor_.get(), .delay = &*delay, .run = run});
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_EQ(u->exec.used.size(), 8u);
    EXPECT_LE(maxRelDiff(c1, want_), 1e-6);
    auto rep = runReplicatedMatmul(a(), b(), {c2.data(), 96, 20, 0}, 8, 2,
                                   {.executor = executor_.get(), .delay = &*delay, .run = run});
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(rep->exec.used.size(), 4u);
    std::vector<bool> blocks(4, false);
    for (int t : rep->exec.used) blocks[t / 2] = true;
    EXPECT_EQ(blocks, std::vector<bool>(4, true));
    EXPECT_LE(maxRelDiff(c2, want_), 1e-6);
  }
  std::vector<float> c(96 * 20);
  EXPECT_EQ(
      runReplicatedMatmul(a(), b(), {c.data(), 96, 20, 0}, 7, 2, {.executor = executor_.get()})
          .status()
          .code(),
      StatusCode::kInvalidArgument);
  // 2^30 replicas of one block: refused before a product per worker is allocated (bad_alloc).
  EXPECT_EQ(runReplicatedMatmul(a(), b(), {c.data(), 96, 20, 0}, 1 << 30, 1 << 30,
                                {.executor = executor_.get()})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(runUncodedMatmul(a(), b(), {c.data(), 96, 20, 0}, 4, {}).status().code(),
            StatusCode::kInvalidArgument);
}

// C, A and B are checked before any task runs. A C shorter than A (here the first 48 of 96 rows
// of a buffer whose other rows hold a sentinel) used to be written past its end, by the uncoded
// tasks and by the replicated gather; a null A was read from address 0 + offset.
TEST_F(StragglerMatmulTest, ShapeAndViewErrorsAreRejectedBeforeAnythingIsWritten) {
  constexpr float kSentinel = 12345.0f;
  std::vector<float> buffer(96 * 20, kSentinel);
  const StragglerRunOptions opts{.executor = executor_.get()};
  auto untouched = [&] {
    return std::all_of(buffer.begin(), buffer.end(), [&](float x) { return x == kSentinel; });
  };
  auto expectRejected = [&](const std::string& what, ConstMatrixView av, ConstMatrixView bv,
                            MatrixView cv) {
    SCOPED_TRACE(what);
    auto u = runUncodedMatmul(av, bv, cv, 8, opts);
    EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument) << u.status();
    auto r = runReplicatedMatmul(av, bv, cv, 8, 2, opts);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(untouched()) << "C's buffer was written";
  };
  const MatrixView fullC{buffer.data(), 96, 20, 0};
  expectRejected("C has 48 of A's 96 rows", a(), b(), {buffer.data(), 48, 20, 0});
  expectRejected("C has 19 of B's 20 columns", a(), b(), {buffer.data(), 96, 19, 20});
  expectRejected("B has 31 rows, A 32 columns", a(), {b_.data(), 31, 20, 0}, fullC);
  expectRejected("A is null", {nullptr, 96, 32, 0}, b(), fullC);
  expectRejected("B is null", a(), {nullptr, 32, 20, 0}, fullC);
  expectRejected("C is null", a(), b(), {nullptr, 96, 20, 0});
  expectRejected("C's ld is below its columns", a(), b(), {buffer.data(), 96, 20, 10});
  // Views no memory could hold: the block sizes computed from them used to overflow int64
  // (undefined; the UBSan build of this suite checks) before any size check.
  expectRejected("A and C have INT64_MAX rows", {a_.data(), INT64_MAX, 32, 0}, b(),
                 {buffer.data(), INT64_MAX, 20, 0});

  // Coded: decode checked C already, but only after the tasks; now before them.
  auto cm = CodedMatmul::create({.n = 6, .k = 4});
  ASSERT_TRUE(cm.ok()) << cm.status();
  auto enc = cm->encode(a());
  ASSERT_TRUE(enc.ok()) << enc.status();
  auto coded = runCodedMatmul(*cm, *enc, b(), {buffer.data(), 48, 20, 0}, opts);
  EXPECT_EQ(coded.status().code(), StatusCode::kInvalidArgument) << coded.status();
  EXPECT_TRUE(untouched());
  // B without columns: every task used to run, then decode refused "C must be 96x0, got 96x0".
  auto none = runCodedMatmul(*cm, *enc, {b_.data(), 32, 0, 1}, {buffer.data(), 96, 0, 1}, opts);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status();
  EXPECT_NE(none.status().message().find("no columns"), std::string::npos) << none.status();
  // A matrix encoded for another (n, k): every task used to fail, giving DataLoss.
  auto other = CodedMatmul::create({.n = 5, .k = 4});
  ASSERT_TRUE(other.ok()) << other.status();
  auto foreign = runCodedMatmul(*other, *enc, b(), fullC, opts);
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument) << foreign.status();
  EXPECT_TRUE(untouched());

  // The well-formed call still computes the product.
  auto ok = runUncodedMatmul(a(), b(), fullC, 8, opts);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_LE(maxRelDiff(buffer, want_), 1e-6);
}

TEST(StragglerExecutorTest, TooManyFailuresIsDataLoss) {
  auto ex = StragglerExecutor::create({.threads = 4});
  ASSERT_TRUE(ex.ok());
  auto r = (*ex)->run({.tasks = 8, .neededGroups = 6}, [](int task, const CancelToken&) {
    return task % 3 == 0 ? Internal("injected failure") : OkStatus();
  });
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  auto ok = (*ex)->run({.tasks = 8, .neededGroups = 5}, [](int task, const CancelToken&) {
    return task % 3 == 0 ? Internal("injected failure") : OkStatus();
  });
  ASSERT_TRUE(ok.ok()) << ok.status();
  for (int t : ok->used) EXPECT_NE(t % 3, 0);
}

// Tasks 0 and 1 fail and task 3 never finishes: with task 2 done, at most 2 of the 3 needed
// groups can complete, so the run is over as soon as the second failure comes. It used to wait
// for the straggler (here until the deadline; with the default deadline, forever).
TEST(StragglerExecutorTest, FailuresThatDecideTheRunEndItWithoutWaitingForAStraggler) {
  auto ex = StragglerExecutor::create({.threads = 4});
  ASSERT_TRUE(ex.ok());
  auto never = TraceDelay::fromMillis({0, 0, 0, 1e16});
  ASSERT_TRUE(never.ok()) << never.status();
  auto r = (*ex)->run(
      {.tasks = 4, .neededGroups = 3, .delay = &*never, .deadline = Deadline::afterMs(30000)},
      [](int task, const CancelToken&) {
        return task < 2 ? Internal("injected failure") : OkStatus();
      });
  ASSERT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("failed (0, 1)"), std::string::npos) << r.status();
  // Replicas: groups {0,0,1,1}, both of group 0 fail -> one group possible of two needed.
  auto replicas = (*ex)->run({.tasks = 4,
                              .groups = {0, 0, 1, 1},
                              .neededGroups = 2,
                              .delay = &*never,
                              .deadline = Deadline::afterMs(30000)},
                             [](int task, const CancelToken&) {
                               return task < 2 ? Internal("injected failure") : OkStatus();
                             });
  EXPECT_EQ(replicas.status().code(), StatusCode::kDataLoss) << replicas.status();
  // One replica of each group failing leaves the run possible: it completes.
  auto survives = (*ex)->run({.tasks = 4, .groups = {0, 0, 1, 1}, .neededGroups = 2},
                             [](int task, const CancelToken&) {
                               return task % 2 == 0 ? Internal("injected failure") : OkStatus();
                             });
  ASSERT_TRUE(survives.ok()) << survives.status();
  std::vector<int> used = survives->used;
  std::sort(used.begin(), used.end());
  EXPECT_EQ(used, (std::vector<int>{1, 3}));
}

TEST(StragglerExecutorTest, DeadlineCancelsARunThatCannotFinishInTime) {
  auto ex = StragglerExecutor::create({.threads = 4});
  ASSERT_TRUE(ex.ok());
  // Every task straggles for a minute; the deadline interrupts the delays.
  auto delay = TraceDelay::fromMillis({60000.0});
  std::atomic<int> ran{0};
  auto r = (*ex)->run(
      {.tasks = 4, .neededGroups = 3, .delay = &*delay, .deadline = Deadline::afterMs(50)},
      [&](int, const CancelToken&) {
        ++ran;
        return OkStatus();
      });
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find("unfinished tasks: 0, 1, 2, 3"), std::string::npos)
      << r.status();
  EXPECT_EQ(ran.load(), 0) << "cancelled tasks must not run";
  // The executor is usable afterwards.
  auto ok = (*ex)->run({.tasks = 4, .neededGroups = 4, .deadline = Deadline::afterMs(60000)},
                       [](int, const CancelToken&) { return OkStatus(); });
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->used.size(), 4u);
}

// A task that notices the run no longer needs it and returns Cancelled stopped early: it counts
// as cancelled, not as a failure.
TEST(StragglerExecutorTest, ATaskReturningCancelledOnCancellationIsCancelledNotFailed) {
  auto ex = StragglerExecutor::create({.threads = 2});
  ASSERT_TRUE(ex.ok());
  std::atomic<bool> slowStarted{false};
  auto r = (*ex)->run({.tasks = 2, .neededGroups = 1}, [&](int task, const CancelToken& cancel) {
    // Every wait is bounded: a broken executor fails the test instead of hanging it.
    const Deadline giveUp = Deadline::afterMs(10000);
    if (task == 0) {
      // Finish only once task 1 is running, so that it is really stopped by cancellation.
      while (!slowStarted.load()) {
        if (giveUp.expired()) return DeadlineExceeded("task 1 never started");
        std::this_thread::yield();
      }
      return OkStatus();
    }
    slowStarted.store(true);
    while (!cancel.cancelled()) {
      if (giveUp.expired()) return DeadlineExceeded("task 1 was never cancelled");
      std::this_thread::yield();
    }
    return Cancelled("task 1 saw the cancellation");
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->used, std::vector<int>{0});
  EXPECT_EQ(r->cancelled, 1);
  EXPECT_EQ(r->failed, 0);
  EXPECT_LT(r->finishMs[1], 0);
}

// A "never finishes" delay (more than a Duration holds) saturates: the task waits for the run's
// cancellation. It used to overflow to a negative delay and run at once.
TEST(StragglerExecutorTest, ANeverFinishingStragglerWaitsForCancellation) {
  auto ex = StragglerExecutor::create({.threads = 2});
  ASSERT_TRUE(ex.ok());
  auto never = TraceDelay::fromMillis({0, 1e16});
  ASSERT_TRUE(never.ok()) << never.status();
  std::atomic<int> slowRan{0};
  auto r = (*ex)->run(
      {.tasks = 2, .neededGroups = 1, .delay = &*never, .deadline = Deadline::afterMs(10000)},
      [&](int task, const CancelToken&) {
        if (task == 1) {
          ++slowRan;
        }
        return OkStatus();
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->used, std::vector<int>{0});
  EXPECT_GT(r->delayMs[1], 0);
  EXPECT_EQ(slowRan.load(), 0) << "the straggler must not run";
  EXPECT_EQ(r->cancelled, 1);
}

// One pool thread, the never-finishing straggler first by index: the thread used to take it and
// wait out its delay while the two tasks that suffice stayed queued behind it, until the deadline.
TEST(StragglerExecutorTest, FewerThreadsThanTasksRunTheReadyTasksFirst) {
  auto ex = StragglerExecutor::create({.threads = 1});
  ASSERT_TRUE(ex.ok());
  auto delay = TraceDelay::fromMillis({1e16, 0, 0});
  ASSERT_TRUE(delay.ok()) << delay.status();
  std::atomic<int> neverRan{0};
  auto r = (*ex)->run(
      {.tasks = 3, .neededGroups = 2, .delay = &*delay, .deadline = Deadline::afterMs(20000)},
      [&](int task, const CancelToken&) {
        if (task == 0) ++neverRan;
        return OkStatus();
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->used, (std::vector<int>{1, 2}));
  EXPECT_EQ(neverRan.load(), 0);
  EXPECT_EQ(r->cancelled, 1);
}

TEST(StragglerExecutorTest, BadSpecs) {
  auto ex = StragglerExecutor::create({.threads = 2});
  ASSERT_TRUE(ex.ok());
  auto fn = [](int, const CancelToken&) { return OkStatus(); };
  EXPECT_EQ((*ex)->run({.tasks = 0, .neededGroups = 1}, fn).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*ex)->run({.tasks = 4, .neededGroups = 5}, fn).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*ex)->run({.tasks = 4, .groups = {0, 0, 1}, .neededGroups = 1}, fn).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*ex)->run({.tasks = 4, .groups = {0, 0, 1, 1}, .neededGroups = 3}, fn).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(StragglerExecutor::create({.threads = 0}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DelayModelTest, ShiftedExponentialIsDeterministicAndHasTheRightMean) {
  auto d = ShiftedExponentialDelay::create({.shiftMs = 2, .tailMeanMs = 5, .seed = 9});
  ASSERT_TRUE(d.ok());
  auto ms = [&](int64_t run, int task, double load) {
    return std::chrono::duration<double, std::milli>(
               d->delay({.run = run, .task = task, .tasks = 8, .load = load}))
        .count();
  };
  EXPECT_EQ(ms(3, 4, 0.5), ms(3, 4, 0.5));
  EXPECT_NE(ms(3, 4, 1), ms(4, 4, 1));
  EXPECT_NEAR(ms(3, 4, 0.25) * 4, ms(3, 4, 1), 1e-3);
  double sum = 0;
  const int samples = 20000;
  for (int i = 0; i < samples; ++i) {
    const double v = ms(i / 8, i % 8, 1);
    EXPECT_GE(v, 2.0 - 1e-6);
    sum += v;
  }
  // Mean 7 ms; the standard error of 20000 exponential samples of mean 5 is 0.035 ms.
  EXPECT_NEAR(sum / samples, 7.0, 0.2);
  EXPECT_EQ(ShiftedExponentialDelay::create({.shiftMs = -1}).status().code(),
            StatusCode::kInvalidArgument);
}

// Delays beyond what int64 nanoseconds hold (~9.2e12 ms) saturate to Duration::max() instead of
// overflowing (undefined; INT64_MIN on x86).
TEST(DelayModelTest, HugeDelaysSaturate) {
  auto t = TraceDelay::fromMillis({1e16, 9.3e12, 9.2e12, 1.5});
  ASSERT_TRUE(t.ok()) << t.status();
  auto at = [&](int task) { return t->delay({.task = task, .tasks = 4}).count(); };
  EXPECT_EQ(at(0), Duration::max().count());
  EXPECT_EQ(at(1), Duration::max().count());
  EXPECT_GT(at(2), 0);
  EXPECT_LT(at(2), Duration::max().count());
  EXPECT_EQ(at(3), 1500000);
  auto huge = ShiftedExponentialDelay::create({.shiftMs = 1e300, .tailMeanMs = 1});
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_EQ(huge->delay({.task = 0}).count(), Duration::max().count());
}

TEST(DelayModelTest, TraceFileIsReplayedAndValidated) {
  const std::string path = ::testing::TempDir() + "/cofab_delay_trace.txt";
  {
    std::ofstream f(path);
    f << "# measured delays\n1.5\n\n  2.5  # second\n0\n";
  }
  auto t = TraceDelay::load(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 3u);
  auto ms = [&](int64_t run, int task) {
    return std::chrono::duration<double, std::milli>(
               t->delay({.run = run, .task = task, .tasks = 2}))
        .count();
  };
  EXPECT_DOUBLE_EQ(ms(0, 0), 1.5);
  EXPECT_DOUBLE_EQ(ms(0, 1), 2.5);
  EXPECT_DOUBLE_EQ(ms(1, 0), 0.0);
  EXPECT_DOUBLE_EQ(ms(1, 1), 1.5);
  {
    std::ofstream f(path);
    f << "1.0\nfast\n";
  }
  EXPECT_EQ(TraceDelay::load(path).status().code(), StatusCode::kInvalidArgument);
  {
    std::ofstream f(path);
    f << "-3\n";
  }
  EXPECT_EQ(TraceDelay::load(path).status().code(), StatusCode::kInvalidArgument);
  std::remove(path.c_str());
  EXPECT_EQ(TraceDelay::load(path).status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace cofab::coding

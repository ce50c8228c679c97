// StragglerExecutor and the three matmul strategies on it: correctness of C, which tasks were
// used, cancellation of stragglers, task failures, and the delay models.
#include "coding/matmul/straggler_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

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
  EXPECT_EQ(runUncodedMatmul(a(), b(), {c.data(), 96, 20, 0}, 4, {}).status().code(),
            StatusCode::kInvalidArgument);
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
  EXPECT_EQ(ran.load(), 0) << "cancelled tasks must not run";
  // The executor is usable afterwards.
  auto ok = (*ex)->run({.tasks = 4, .neededGroups = 4, .deadline = Deadline::afterMs(60000)},
                       [](int, const CancelToken&) { return OkStatus(); });
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->used.size(), 4u);
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

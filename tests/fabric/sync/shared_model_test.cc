#include "fabric/sync/shared_model.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace cofab::sync {
namespace {

// Hogwild threads adding into one model concurrently lose no update (atomic adds), and a reader
// running meanwhile sees only values that some prefix of the adds produced (no torn floats).
TEST(SharedModelTest, ConcurrentAddsLoseNothing) {
  constexpr size_t kN = 1000;
  constexpr int kThreads = 4, kRounds = 200;
  SharedModel model(std::vector<float>(kN, 0.0f));
  std::vector<float> ones(kN, 1.0f);
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    std::vector<float> snap(kN);
    while (!stop.load()) {
      model.read(snap);
      for (float v : snap) {
        ASSERT_GE(v, 0.0f);
        ASSERT_LE(v, float(kThreads * kRounds));
        ASSERT_EQ(v, float(int(v)));  // a whole number of adds of 1
      }
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) model.add(ones, 1.0f);
    });
  }
  for (auto& t : threads) t.join();
  stop = true;
  reader.join();
  std::vector<float> out(kN);
  model.read(out);
  for (float v : out) EXPECT_EQ(v, float(kThreads * kRounds));
}

// The single-thread model (plain floats) gives exactly what the concurrent one gives for the
// same writes and adds at offsets.
TEST(SharedModelTest, SingleThreadAccessMatchesConcurrent) {
  std::vector<float> init(37);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.25f * float(i) - 3.0f;
  SharedModel shared(init), owned(init, SharedModel::Access::kSingleThread);
  EXPECT_EQ(shared.access(), SharedModel::Access::kConcurrent);
  EXPECT_EQ(owned.access(), SharedModel::Access::kSingleThread);
  std::vector<float> delta(13);
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = 1.5f - 0.125f * float(i);
  for (SharedModel* m : {&shared, &owned}) {
    m->add(delta, -0.5f);
    m->add(20, delta, 2.0f);
    m->write(5, std::vector<float>(4, 9.0f));
  }
  std::vector<float> a(init.size()), b(init.size()), part(6);
  shared.read(a);
  owned.read(b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(b[0], init[0] - 0.5f * delta[0]);
  EXPECT_EQ(b[5], 9.0f);
  EXPECT_EQ(b[20], init[20] + 2.0f * delta[0]);
  EXPECT_EQ(b[36], init[36]);
  owned.read(31, part);
  EXPECT_EQ(part, std::vector<float>(b.begin() + 31, b.end()));
}

// Out-of-range spans are refused the same way in both modes, before any memory is touched.
TEST(SharedModelDeathTest, BothModesRefuseSpansPastTheEnd) {
  std::vector<float> part(6), delta(13);
  for (auto access : {SharedModel::Access::kConcurrent, SharedModel::Access::kSingleThread}) {
    SharedModel m(std::vector<float>(37, 0.0f), access);
    EXPECT_DEATH(m.read(32, part), "COFAB_CHECK\\(offset \\+ out.size\\(\\) <= size_\\) failed");
    EXPECT_DEATH(m.write(32, part),
                 "COFAB_CHECK\\(offset \\+ values.size\\(\\) <= size_\\) failed");
    EXPECT_DEATH(m.add(30, delta, 1.0f),
                 "COFAB_CHECK\\(offset \\+ delta.size\\(\\) <= size_\\) failed");
  }
}

TEST(MomentumTest, AccumulatesVelocity) {
  Momentum m(2, 0.5f);
  std::vector<float> g{1.0f, -2.0f};
  auto v = m.update(g);
  EXPECT_FLOAT_EQ(v[0], 1.0f);
  v = m.update(g);
  EXPECT_FLOAT_EQ(v[0], 1.5f);
  EXPECT_FLOAT_EQ(v[1], -3.0f);
}

TEST(MomentumTest, NesterovReturnsTheLookAheadStep) {
  Momentum m(2, 0.5f), plain(2, 0.5f);
  std::vector<float> g{1.0f, -2.0f};
  auto s = m.nesterovUpdate(g);  // v = g, step = g + 0.5 v
  EXPECT_FLOAT_EQ(s[0], 1.5f);
  EXPECT_FLOAT_EQ(s[1], -3.0f);
  s = m.nesterovUpdate(g);  // v = 1.5 g, step = g + 0.75 g
  EXPECT_FLOAT_EQ(s[0], 1.75f);
  EXPECT_FLOAT_EQ(s[1], -3.5f);
  // The velocity itself evolves exactly as with update().
  plain.update(g);
  auto v = plain.update(g);
  EXPECT_FLOAT_EQ(m.update(g)[0], 0.5f * v[0] + g[0]);
}

TEST(MomentumTest, UpdateScaledWritesTheScaledVelocityAndKeepsItsState) {
  Momentum m(2, 0.5f), plain(2, 0.5f);
  std::vector<float> g{1.0f, -2.0f};
  std::vector<float> out(2);
  for (int step = 0; step < 3; ++step) {
    m.updateScaled(g, -0.1f, out);
    auto v = plain.update(g);
    EXPECT_FLOAT_EQ(out[0], -0.1f * v[0]) << "step " << step;
    EXPECT_FLOAT_EQ(out[1], -0.1f * v[1]) << "step " << step;
  }
  EXPECT_FLOAT_EQ(m.update(g)[1], plain.update(g)[1]);
}

}  // namespace
}  // namespace cofab::sync

// Fractional-repetition gradient coding: the full gradient sum under every straggler set of size
// <= s, in any arrival order; failure beyond s; bad arguments.
#include "coding/gradient/fractional_repetition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <random>

namespace cofab::coding {
namespace {

TEST(GradientCodeTest, EveryStragglerSetUpToSDecodesTheFullSum) {
  const std::pair<int, int> shapes[] = {{1, 0}, {2, 1},  {4, 1},  {6, 2}, {8, 3},
                                        {9, 2}, {12, 3}, {12, 5}, {10, 1}};
  std::mt19937 rng(5);
  for (auto [n, s] : shapes) {
    SCOPED_TRACE("n=" + std::to_string(n) + " s=" + std::to_string(s));
    auto code = FractionalRepetitionCode::create({.workers = n, .stragglers = s});
    ASSERT_TRUE(code.ok()) << code.status();
    const size_t elems = 33;
    // Small integers: every sum is exact in f32, so the comparison can be exact.
    std::vector<std::vector<float>> parts(n, std::vector<float>(elems));
    std::vector<float> want(elems, 0);
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < elems; ++i) {
        parts[p][i] = static_cast<float>(static_cast<int>(rng() % 201) - 100);
        want[i] += parts[p][i];
      }
    }
    std::vector<std::vector<float>> messages(n, std::vector<float>(elems));
    for (int w = 0; w < n; ++w) {
      std::vector<std::span<const float>> mine;
      for (int p : code->partitionsOf(w)) mine.push_back(parts[p]);
      ASSERT_TRUE(code->encode(w, mine, messages[w]).ok());
    }
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      if (std::popcount(mask) > s) continue;
      std::vector<int> order;
      for (int w = 0; w < n; ++w) {
        if (!(mask & (1u << w))) order.push_back(w);
      }
      std::shuffle(order.begin(), order.end(), rng);
      GradientDecoder dec(*code, elems);
      for (int w : order) ASSERT_TRUE(dec.add(w, messages[w]).ok());
      ASSERT_TRUE(dec.complete()) << "stragglers mask " << mask;
      EXPECT_EQ(static_cast<int>(dec.usedWorkers().size()), code->groups());
      std::vector<float> got(elems);
      ASSERT_TRUE(dec.finish(got).ok());
      ASSERT_EQ(got, want) << "stragglers mask " << mask;
    }
  }
}

TEST(GradientCodeTest, AWholeGroupMissingIsReported) {
  auto code = FractionalRepetitionCode::create({.workers = 6, .stragglers = 1});
  ASSERT_TRUE(code.ok());
  GradientDecoder dec(*code, 4);
  std::vector<float> m(4, 1.0f), out(4);
  for (int w : {0, 1, 4}) ASSERT_TRUE(dec.add(w, m).ok());  // group 1 (workers 2, 3) straggles
  EXPECT_FALSE(dec.complete());
  Status st = dec.finish(out);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("group(s) 1"), std::string::npos) << st;
  auto used = dec.add(5, m);
  ASSERT_TRUE(used.ok());
  EXPECT_FALSE(*used) << "worker 5's group was already decoded by worker 4";
}

TEST(GradientCodeTest, BadArguments) {
  for (auto [n, s] : std::vector<std::pair<int, int>>{{0, 0}, {5, 1}, {4, 4}, {4, -1}}) {
    EXPECT_EQ(FractionalRepetitionCode::create({.workers = n, .stragglers = s}).status().code(),
              StatusCode::kInvalidArgument)
        << n << "," << s;
  }
  auto code = FractionalRepetitionCode::create({.workers = 4, .stragglers = 1});
  GradientDecoder dec(*code, 3);
  std::vector<float> m(3), shortMsg(2);
  EXPECT_EQ(dec.add(4, m).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dec.add(0, shortMsg).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(dec.add(0, m).ok());
  EXPECT_EQ(dec.add(0, m).status().code(), StatusCode::kInvalidArgument);
  std::vector<float> out(3);
  std::vector<std::span<const float>> one = {m};
  EXPECT_EQ(code->encode(0, one, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(code->encode(9, one, out).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cofab::coding

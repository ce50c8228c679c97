// The reducer against the independent serial reference: every dtype, sum and average, sizes
// around the block boundary, and order sensitivity (rank order, not arrival order, decides).
#include "aggregator/reducer.h"

#include <gtest/gtest.h>

#include "tests/aggregator/test_data.h"

namespace cofab::testing {
namespace {

TEST(Reducer, MatchesSerialReferenceForEveryDtypeAndSize) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    for (size_t count : {size_t{1}, size_t{2047}, size_t{2048}, size_t{2049}, size_t{10000}}) {
      for (bool average : {false, true}) {
        for (int n : {1, 2, 5}) {
          std::vector<std::vector<uint8_t>> inputs;
          std::vector<const uint8_t*> ptrs;
          for (int r = 0; r < n; ++r) inputs.push_back(makeTensor(dtype, count, r, 9, 1));
          for (auto& in : inputs) ptrs.push_back(in.data());
          std::vector<uint8_t> out(inputs[0].size());
          aggregator::reduceInRankOrder(dtype, average, ptrs, count, out.data());
          EXPECT_EQ(out, referenceReduce(dtype, average, inputs))
              << dtypeName(dtype) << " count " << count << " n " << n << " avg " << average;
        }
      }
    }
  }
}

TEST(Reducer, RankOrderIsPartOfTheResult) {
  // 1e8 + 1 - 1e8 in f32 depends on the order; the reducer must follow rank order exactly.
  std::vector<float> a{1e8f}, b{1.0f}, c{-1e8f};
  std::vector<const uint8_t*> abc{reinterpret_cast<const uint8_t*>(a.data()),
                                  reinterpret_cast<const uint8_t*>(b.data()),
                                  reinterpret_cast<const uint8_t*>(c.data())};
  std::vector<const uint8_t*> acb{abc[0], abc[2], abc[1]};
  float r1 = 0, r2 = 0;
  aggregator::reduceInRankOrder(DType::kF32, false, abc, 1, reinterpret_cast<uint8_t*>(&r1));
  aggregator::reduceInRankOrder(DType::kF32, false, acb, 1, reinterpret_cast<uint8_t*>(&r2));
  EXPECT_EQ(r1, (1e8f + 1.0f) + -1e8f);
  EXPECT_EQ(r2, (1e8f + -1e8f) + 1.0f);
  EXPECT_NE(r1, r2);
}

}  // namespace
}  // namespace cofab::testing

namespace cofab::testing {
namespace {

TEST(Reducer, OutputMayBeTheFirstContribution) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    std::vector<std::vector<uint8_t>> inputs;
    for (int r = 0; r < 3; ++r) inputs.push_back(makeTensor(dtype, 5000, r, 4, 2));
    const auto expected = referenceReduce(dtype, true, inputs);
    std::vector<const uint8_t*> ptrs{inputs[0].data(), inputs[1].data(), inputs[2].data()};
    aggregator::reduceInRankOrder(dtype, true, ptrs, 5000, inputs[0].data());
    EXPECT_EQ(inputs[0], expected) << dtypeName(dtype);
  }
}

}  // namespace
}  // namespace cofab::testing

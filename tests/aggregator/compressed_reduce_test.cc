// The daemon's compressed reduction (aggregator/compressed_reduce.h) as a pure function: the
// reply is the recompression of the f32 rank-order average of the decoded contributions; with
// a residual (reply feedback) the replies summed over rounds track the true aggregates summed
// over rounds within one residual (so the relative error falls like 1/rounds), without one the
// 1-bit reply's bias accumulates round after round.
#include "aggregator/compressed_reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "fabric/ps/ps_protocol.h"

namespace cofab::testing {
namespace {

using compress::Compression;
using Payload = std::shared_ptr<std::vector<uint8_t>>;

constexpr size_t kCount = 1000, kBlock = 100;
constexpr int kWorkers = 4;

// Worker r's 1-bit contribution for one round: per-element magnitudes spread over two orders
// within every block (what makes a single per-block scale biased), signs mostly fixed per
// element, plus noise.
Payload contribution(std::mt19937& rng, int r) {
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<float> x(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const float magnitude = 0.01f + static_cast<float>(i % 37) / 36.0f;
    const float sign = (i * 7 + static_cast<size_t>(r)) % 5 == 0 ? -1.0f : 1.0f;
    x[i] = sign * magnitude + noise(rng);
  }
  auto enc = std::make_shared<std::vector<uint8_t>>(
      compress::compressedBytes(Compression::kOneBit, kCount, kBlock));
  compress::compress(Compression::kOneBit, x.data(), kCount, kBlock, nullptr, enc->data());
  return enc;
}

std::vector<float> decode(const Payload& p) {
  std::vector<float> out(kCount);
  EXPECT_TRUE(
      compress::decompress(Compression::kOneBit, p->data(), p->size(), kCount, out.data()).ok());
  return out;
}

// max over elements of |sum of true averages - sum of decoded replies| after `rounds` rounds.
double cumulativeError(int rounds, std::vector<float>* residual, double* maxAggregate) {
  std::mt19937 rng(7);
  std::vector<double> trueSum(kCount, 0.0), replySum(kCount, 0.0);
  *maxAggregate = 0;
  for (int t = 0; t < rounds; ++t) {
    std::vector<Payload> in;
    for (int r = 0; r < kWorkers; ++r) in.push_back(contribution(rng, r));
    std::vector<float> avg(kCount, 0.0f);
    for (const auto& p : in) {
      const auto d = decode(p);
      for (size_t i = 0; i < kCount; ++i) avg[i] += d[i];
    }
    const Payload reply =
        aggregator::compressedReduce(Compression::kOneBit, /*average=*/true, in, kCount, kBlock,
                                     residual ? residual->data() : nullptr);
    const auto got = decode(reply);
    for (size_t i = 0; i < kCount; ++i) {
      avg[i] /= kWorkers;
      trueSum[i] += avg[i];
      replySum[i] += got[i];
      *maxAggregate = std::max(*maxAggregate, std::fabs(double(avg[i])));
    }
  }
  double worst = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const double err = trueSum[i] - replySum[i];
    if (residual) {
      // The invariant of error feedback: what was not sent yet is exactly the residual.
      EXPECT_NEAR(err, (*residual)[i], 1e-3 * (1 + std::fabs(trueSum[i]))) << "element " << i;
    }
    worst = std::max(worst, std::fabs(err));
  }
  return worst;
}

TEST(CompressedReduce, ReplyFeedbackTracksTheTrueAggregatesOverRounds) {
  double maxAgg = 0;
  std::vector<float> residual(kCount, 0.0f);
  const double fed100 = cumulativeError(100, &residual, &maxAgg);
  residual.assign(kCount, 0.0f);
  const double fed400 = cumulativeError(400, &residual, &maxAgg);
  // Bounded by a few aggregates' worth however many rounds ran: relative to the rounds it
  // shrinks (fed400 / 400 < fed100 / 100 by about 4x).
  EXPECT_LT(fed100, 8 * maxAgg);
  EXPECT_LT(fed400, 8 * maxAgg);
  EXPECT_LT(fed400 / 400, 0.5 * fed100 / 100);
  // Without a residual the per-block scale's bias piles up with the rounds.
  double maxAggPlain = 0;
  const double plain100 = cumulativeError(100, nullptr, &maxAggPlain);
  const double plain400 = cumulativeError(400, nullptr, &maxAggPlain);
  EXPECT_GT(plain400, 3 * plain100) << "the stateless reply's error should grow with the rounds";
  EXPECT_GT(plain400, 4 * fed400);
}

TEST(CompressedReduce, ReplyIsTheRecompressedRankOrderAverage) {
  std::mt19937 rng(3);
  std::vector<Payload> in;
  for (int r = 0; r < kWorkers; ++r) in.push_back(contribution(rng, r));
  std::vector<float> sum(kCount, 0.0f);
  for (const auto& p : in) {
    const auto d = decode(p);
    for (size_t i = 0; i < kCount; ++i) sum[i] += d[i];
  }
  std::vector<uint8_t> want(compress::compressedBytes(Compression::kOneBit, kCount, kBlock));
  compress::compress(Compression::kOneBit, sum.data(), kCount, kBlock, nullptr, want.data());
  EXPECT_EQ(*aggregator::compressedReduce(Compression::kOneBit, false, in, kCount, kBlock, nullptr),
            want);
  // Stateless: the same round again gives the same bytes; with a residual it moves on.
  EXPECT_EQ(*aggregator::compressedReduce(Compression::kOneBit, false, in, kCount, kBlock, nullptr),
            want);
  std::vector<float> residual(kCount, 0.0f);
  const auto first = *aggregator::compressedReduce(Compression::kOneBit, false, in, kCount, kBlock,
                                                   residual.data());
  EXPECT_EQ(first, want) << "a zero residual changes nothing in the first round";
  const auto second = *aggregator::compressedReduce(Compression::kOneBit, false, in, kCount, kBlock,
                                                    residual.data());
  EXPECT_NE(second, want) << "the residual of round 1 must show in round 2";
}

// One worker's overflowing round (its block 0 scale is +Inf, as a 1-bit encoder that did not
// check for it would send) with reply feedback: that round's reply carries NaN in block 0 for
// every worker (the overflow stays visible, as the f32 sum would be), the slot's residual stays
// finite with block 0 reset to 0, and the next round's reply is finite, block 0 exactly the
// stateless reply (it used to be NaN in every later round).
TEST(CompressedReduce, ANonFiniteContributionPoisonsOneRoundNotTheReplyResidual) {
  std::mt19937 rng(11);
  std::vector<Payload> in;
  for (int r = 0; r < kWorkers; ++r) in.push_back(contribution(rng, r));
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(in[1]->data() + compress::kPrefixBytes, &inf, sizeof(inf));  // block 0's scale
  std::vector<float> residual(kCount, 0.0f);
  const auto bad = decode(aggregator::compressedReduce(Compression::kOneBit, /*average=*/true, in,
                                                       kCount, kBlock, residual.data()));
  for (size_t i = 0; i < kBlock; ++i) {
    EXPECT_TRUE(std::isnan(bad[i])) << "element " << i << " of the overflowing block";
    EXPECT_EQ(residual[i], 0.0f) << "element " << i << " of the overflowing block";
  }
  for (size_t i = kBlock; i < kCount; ++i) {
    EXPECT_TRUE(std::isfinite(bad[i])) << "element " << i;
    EXPECT_TRUE(std::isfinite(residual[i])) << "element " << i;
  }

  std::vector<Payload> next;
  for (int r = 0; r < kWorkers; ++r) next.push_back(contribution(rng, r));
  const auto fed = decode(aggregator::compressedReduce(Compression::kOneBit, true, next, kCount,
                                                       kBlock, residual.data()));
  const auto stateless = decode(
      aggregator::compressedReduce(Compression::kOneBit, true, next, kCount, kBlock, nullptr));
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(std::isfinite(fed[i])) << "element " << i << " of the round after";
    ASSERT_TRUE(std::isfinite(residual[i])) << "element " << i << " of the round after";
  }
  for (size_t i = 0; i < kBlock; ++i) {
    EXPECT_EQ(fed[i], stateless[i]) << "block 0 starts again from a zero residual, element " << i;
  }
}

TEST(CompressedReduce, OpcodeNamesTheCodecAndReplyFeedbackNeedsOneBit) {
  EXPECT_EQ(*aggregator::compressionOfPush(0), Compression::kNone);
  EXPECT_EQ(*aggregator::compressionOfPush(ps::kPushOneBit | ps::kPushReplyFeedback),
            Compression::kOneBit);
  EXPECT_FALSE(aggregator::compressionOfPush(ps::kPushInt8 | ps::kPushOneBit).ok());
  EXPECT_FALSE(aggregator::compressionOfPush(ps::kPushInt8 | ps::kPushReplyFeedback).ok());
  EXPECT_FALSE(aggregator::compressionOfPush(ps::kPushReplyFeedback).ok());
}

}  // namespace
}  // namespace cofab::testing

// Coded shuffling: every worker decodes exactly its new batch from its cache and the multicasts;
// the plan's structure and byte counts are checked independently against the placement and the
// formula rows (1 - alpha) / (1 + n alpha).
#include "coding/shuffle/coded_shuffle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "coding/shuffle/xor_bytes.h"
#include "tests/support/random_bytes.h"

namespace cofab::coding {
namespace {

using cofab::testing::randomBytes;

int64_t binom(int n, int k) {
  int64_t c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return c;
}

// Encodes, decodes at every worker, and checks the plan against first principles.
void roundTrip(const CodedShuffle& s, int64_t epoch, size_t rowBytes) {
  const int n = s.workers();
  const auto data = randomBytes(s.rows() * rowBytes, epoch * 7 + rowBytes);
  auto plan = s.planEpoch(epoch, rowBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();

  // The batches partition the rows, and have equal sizes to within one row.
  std::vector<int> owner(s.rows(), -1);
  size_t minBatch = SIZE_MAX, maxBatch = 0;
  int64_t needed = 0;
  for (int w = 0; w < n; ++w) {
    minBatch = std::min(minBatch, plan->batch[w].size());
    maxBatch = std::max(maxBatch, plan->batch[w].size());
    for (int64_t r : plan->batch[w]) {
      ASSERT_EQ(owner[r], -1) << "row " << r << " assigned twice";
      owner[r] = w;
      needed += !s.caches(w, r);
    }
  }
  for (int64_t r = 0; r < s.rows(); ++r) ASSERT_NE(owner[r], -1) << "row " << r << " unassigned";
  EXPECT_LE(maxBatch - minBatch, 1u);

  // Every message serves distinct workers, each of which can cancel the others' rows.
  for (const auto& m : plan->messages) {
    std::set<int> ws(m.workers.begin(), m.workers.end());
    ASSERT_EQ(ws.size(), m.workers.size());
    ASSERT_LE(static_cast<int>(m.workers.size()), s.cachedBy() + 1);
    for (size_t i = 0; i < m.rows.size(); ++i) {
      ASSERT_EQ(owner[m.rows[i]], m.workers[i]);
      ASSERT_FALSE(s.caches(m.workers[i], m.rows[i]));
      for (size_t j = 0; j < m.rows.size(); ++j) {
        if (i != j) {
          ASSERT_TRUE(s.caches(m.workers[j], m.rows[i]));
        }
      }
    }
  }
  const ShuffleAccounting& a = plan->accounting;
  EXPECT_EQ(a.neededRows, needed);
  EXPECT_EQ(a.localRows, s.rows() - needed);
  EXPECT_EQ(a.messages, static_cast<int64_t>(plan->messages.size()));
  EXPECT_EQ(a.codedBytes, a.messages * static_cast<int64_t>(rowBytes));
  EXPECT_EQ(a.uncodedBytes, needed * static_cast<int64_t>(rowBytes));

  std::vector<uint8_t> wire(plan->messages.size() * rowBytes);
  ASSERT_TRUE(s.encode(*plan, data, rowBytes, wire).ok());
  for (int w = 0; w < n; ++w) {
    auto cache = s.buildCache(w, data, rowBytes);
    ASSERT_TRUE(cache.ok()) << cache.status();
    std::vector<uint8_t> batch(plan->batch[w].size() * rowBytes);
    Status st = s.decode(*plan, *cache, wire, batch);
    ASSERT_TRUE(st.ok()) << st;
    for (size_t i = 0; i < plan->batch[w].size(); ++i) {
      ASSERT_EQ(0, std::memcmp(batch.data() + i * rowBytes,
                               data.data() + plan->batch[w][i] * rowBytes, rowBytes))
          << "worker " << w << " row " << plan->batch[w][i];
    }
  }
}

TEST(CodedShuffleTest, EveryWorkerDecodesItsBatchExactly) {
  for (int n : {4, 8}) {
    for (double alpha : {0.0, 0.25, 0.5, 1.0}) {
      for (auto assignment : {ShuffleAssignment::kStratified, ShuffleAssignment::kUniform}) {
        const int t = static_cast<int>(alpha * n);
        SCOPED_TRACE("n=" + std::to_string(n) + " alpha=" + std::to_string(alpha) +
                     (assignment == ShuffleAssignment::kUniform ? " uniform" : " stratified"));
        auto s = CodedShuffle::create({.workers = n,
                                       .cacheFraction = alpha,
                                       .rows = 3 * n * binom(n, t) + 5,
                                       .seed = 17,
                                       .assignment = assignment});
        ASSERT_TRUE(s.ok()) << s.status();
        for (int64_t epoch : {0, 1}) {
          roundTrip(*s, epoch, 37);  // odd: the portable XOR path
          roundTrip(*s, epoch, 64);  // 32-byte multiples: ISA-L's xor_gen where aligned
        }
      }
    }
  }
}

TEST(CodedShuffleTest, StratifiedCountMeetsTheFormula) {
  for (int n : {4, 8, 16}) {
    for (double alpha : {0.25, 0.5}) {
      const int t = static_cast<int>(alpha * n);
      const int64_t groups = binom(n, t);
      SCOPED_TRACE("n=" + std::to_string(n) + " alpha=" + std::to_string(alpha));
      // Divisible: every list L(U, w) has the same length, so the count is the formula exactly.
      const int64_t rows = n * groups * (n <= 8 ? 3 : 1);
      auto s = CodedShuffle::create({.workers = n, .cacheFraction = alpha, .rows = rows});
      ASSERT_TRUE(s.ok()) << s.status();
      auto plan = s->planEpoch(3, 100);
      ASSERT_TRUE(plan.ok());
      const double theoryRows = rows * (1 - alpha) / (1 + t);
      EXPECT_EQ(plan->accounting.neededRows, std::llround(rows * (1 - alpha)));
      EXPECT_EQ(plan->accounting.messages, std::llround(theoryRows));
      EXPECT_NEAR(plan->accounting.theoryBytes, theoryRows * 100, 1e-6);
      EXPECT_NEAR(plan->accounting.reduction(), 1 + t, 1e-9);
    }
  }
  // Not divisible: padding costs at most one message per subset U, a few percent here.
  auto s = CodedShuffle::create({.workers = 8, .cacheFraction = 0.25, .rows = 10007});
  auto plan = s->planEpoch(0, 1);
  ASSERT_TRUE(plan.ok());
  EXPECT_LE(plan->accounting.messages, plan->accounting.theoryBytes * 1.05);
  EXPECT_GE(plan->accounting.messages, plan->accounting.theoryBytes * 0.95);
}

TEST(CodedShuffleTest, CachesHoldTheirFraction) {
  auto s = CodedShuffle::create({.workers = 8, .cacheFraction = 0.5, .rows = 8 * 70 * 2});
  ASSERT_TRUE(s.ok());
  const auto data = randomBytes(s->rows() * 4, 1);
  for (int w = 0; w < 8; ++w) {
    auto c = s->buildCache(w, data, 4);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->rowCount(), static_cast<size_t>(s->rows() / 2));
    int64_t counted = 0;
    for (int64_t r = 0; r < s->rows(); ++r) counted += s->caches(w, r);
    EXPECT_EQ(counted, static_cast<int64_t>(c->rowCount()));
  }
}

TEST(CodedShuffleTest, BadArguments) {
  EXPECT_EQ(CodedShuffle::create({.workers = 0, .cacheFraction = 0, .rows = 4}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CodedShuffle::create({.workers = 8, .cacheFraction = 0.3, .rows = 4}).status().code(),
            StatusCode::kInvalidArgument);
  // Past any memory: an error, not an exception (rows 2^62 used to throw length_error, and
  // i * rows / groups overflowed past 2^43).
  EXPECT_EQ(CodedShuffle::create({.workers = 4, .cacheFraction = 0.5, .rows = int64_t{1} << 62})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CodedShuffle::create({.workers = 4, .cacheFraction = 0.5, .rows = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CodedShuffle::create({.workers = 30, .cacheFraction = 0.5, .rows = 9}).status().code(),
            StatusCode::kInvalidArgument);
  auto s = CodedShuffle::create({.workers = 4, .cacheFraction = 0.5, .rows = 48});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->planEpoch(0, 0).status().code(), StatusCode::kInvalidArgument);
  auto plan = s->planEpoch(0, 8);
  const auto data = randomBytes(48 * 8, 2);
  std::vector<uint8_t> wire(plan->messages.size() * 8);
  EXPECT_EQ(s->encode(*plan, std::span(data).first(40), 8, wire).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s->encode(*plan, data, 8, std::span(wire).first(8)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s->buildCache(4, data, 8).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->encode(*plan, data, 8, wire).ok());
  // A cache from another placement lacks rows the plan relies on.
  auto other = CodedShuffle::create({.workers = 4, .cacheFraction = 0.5, .rows = 48, .seed = 99});
  auto wrongCache = other->buildCache(0, data, 8);
  std::vector<uint8_t> batch(plan->batch[0].size() * 8);
  EXPECT_EQ(s->decode(*plan, *wrongCache, wire, batch).code(), StatusCode::kFailedPrecondition);
  auto cache = s->buildCache(0, data, 8);
  EXPECT_EQ(s->decode(*plan, *cache, std::span(wire).first(8), batch).code(),
            StatusCode::kInvalidArgument);
  // A plan that does not hold together (ShufflePlan is a plain struct a caller may build or
  // change): refused, where decode() read past the plan's vectors.
  ASSERT_TRUE(s->decode(*plan, *cache, wire, batch).ok());
  size_t needed = 0;  // a row worker 0 takes from a message
  while (needed < plan->source[0].size() && plan->source[0][needed] < 0) ++needed;
  ASSERT_LT(needed, plan->source[0].size());
  auto badMessage = *plan;
  badMessage.source[0][needed] = static_cast<int64_t>(plan->messages.size());
  EXPECT_EQ(s->decode(badMessage, *cache, wire, batch).code(), StatusCode::kInvalidArgument);
  auto shortSource = *plan;
  shortSource.source[0].pop_back();
  EXPECT_EQ(s->decode(shortSource, *cache, wire, batch).code(), StatusCode::kInvalidArgument);
  auto shortWorkers = *plan;
  shortWorkers.messages[static_cast<size_t>(plan->source[0][needed])].workers.clear();
  EXPECT_EQ(s->decode(shortWorkers, *cache, wire, batch).code(), StatusCode::kInvalidArgument);
}

// rows x rowBytes past what a size can hold: refused, not wrapped. encode() and buildCache() used
// to compare buffer sizes against a product that wrapped to 0, then read and write far past the
// (empty) buffers; planEpoch's byte counts overflowed int64.
TEST(CodedShuffleTest, RowsTimesRowBytesThatOverflowAreRefused) {
  auto s = CodedShuffle::create({.workers = 4, .cacheFraction = 0.5, .rows = 48});
  ASSERT_TRUE(s.ok());
  for (const size_t rowBytes : {size_t{1} << 62, SIZE_MAX / 3, SIZE_MAX}) {
    SCOPED_TRACE(rowBytes);
    EXPECT_EQ(s->planEpoch(0, rowBytes).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s->buildCache(0, {}, rowBytes).status().code(), StatusCode::kInvalidArgument);
  }
  auto plan = s->planEpoch(0, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 2 rows x 2^63 bytes wraps to 0 in 64 bits: an empty `data` passed the wrapped check.
  auto two = CodedShuffle::create({.workers = 2, .cacheFraction = 0.5, .rows = 2});
  ASSERT_TRUE(two.ok());
  auto twoPlan = two->planEpoch(0, 8);
  ASSERT_TRUE(twoPlan.ok());
  std::vector<uint8_t> none;
  std::vector<uint8_t> out(twoPlan->messages.size() * 8);
  EXPECT_EQ(two->encode(*twoPlan, none, size_t{1} << 63, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(two->buildCache(0, none, size_t{1} << 63).status().code(),
            StatusCode::kInvalidArgument);
  auto ok = s->planEpoch(0, size_t{1} << 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->accounting.codedBytes,
            static_cast<int64_t>(ok->messages.size()) * (int64_t{1} << 20));
}

TEST(XorBytesTest, MatchesBytewiseXorAlignedOrNot) {
  for (size_t bytes : {1, 7, 8, 31, 32, 64, 100, 4096}) {
    for (size_t offset : {0, 1, 5}) {
      for (size_t count : {1, 2, 3, 5}) {
        std::vector<std::vector<uint8_t>> srcs;
        alignas(64) static uint8_t pool[6][4096 + 64];
        std::vector<const uint8_t*> ptrs;
        for (size_t j = 0; j < count; ++j) {
          auto v = randomBytes(bytes, bytes * 31 + j);
          std::memcpy(pool[j] + offset, v.data(), bytes);
          ptrs.push_back(pool[j] + offset);
          srcs.push_back(v);
        }
        std::vector<uint8_t> want(bytes, 0);
        for (const auto& v : srcs) {
          for (size_t b = 0; b < bytes; ++b) want[b] ^= v[b];
        }
        uint8_t* dst = pool[5] + offset;
        xorOf(dst, ptrs, bytes);
        ASSERT_EQ(0, std::memcmp(dst, want.data(), bytes))
            << bytes << " " << offset << " " << count;
      }
    }
  }
}

// The header lets dst be one of the sources (an in-place fold): whichever one, aligned (ISA-L)
// or not (the word loop), and also a source listed twice (x ^ x cancels).
TEST(XorBytesTest, DstMayBeAnyOfTheSources) {
  for (size_t bytes : {33, 64, 4096}) {
    for (size_t offset : {0, 3}) {
      for (size_t alias : {0, 1, 2}) {
        for (bool twice : {false, true}) {
          alignas(64) static uint8_t pool[3][4096 + 64];
          std::vector<std::vector<uint8_t>> values;
          std::vector<size_t> listed = {0, 1, 2};
          if (twice) listed.push_back(alias);
          std::vector<const uint8_t*> ptrs;
          std::vector<uint8_t> want(bytes, 0);
          for (size_t j = 0; j < 3; ++j) {
            values.push_back(randomBytes(bytes, bytes * 7 + j + 100));
            std::memcpy(pool[j] + offset, values[j].data(), bytes);
          }
          for (size_t j : listed) {
            ptrs.push_back(pool[j] + offset);
            for (size_t b = 0; b < bytes; ++b) want[b] ^= values[j][b];
          }
          uint8_t* dst = pool[alias] + offset;
          xorOf(dst, ptrs, bytes);
          ASSERT_EQ(0, std::memcmp(dst, want.data(), bytes))
              << bytes << " bytes, offset " << offset << ", dst = source " << alias
              << (twice ? " (listed twice)" : "");
        }
      }
    }
  }
}

}  // namespace
}  // namespace cofab::coding

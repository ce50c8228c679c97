// ReedSolomon against the portable reference codec, over every erasure pattern of small codes and
// seeded random patterns of large ones; unaligned buffers; interop with raw ISA-L calls; bad
// arguments.
#include "coding/erasure/reed_solomon.h"

#include <gtest/gtest.h>

#include <climits>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include "coding/erasure/gf256.h"
#include "core/config.h"

#if COFAB_HAVE_ISAL
#include <isa-l/erasure_code.h>
#endif

namespace cofab::coding {
namespace {

// k + m shards of `bytes` each, starting `offset` bytes into their allocation so that pointers
// are deliberately misaligned.
struct Shards {
  Shards(int total, size_t bytes, size_t offset = 0) : bytes(bytes) {
    storage.resize(total);
    for (auto& s : storage) s.assign(bytes + offset + 8, 0);
    for (auto& s : storage) ptrs.push_back(s.data() + offset);
  }
  void fillData(int k, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < k; ++i) {
      for (size_t b = 0; b < bytes; ++b) ptrs[i][b] = static_cast<uint8_t>(rng());
    }
  }
  std::vector<const uint8_t*> data(int k) const { return {ptrs.begin(), ptrs.begin() + k}; }
  std::vector<uint8_t*> parity(int k) const { return {ptrs.begin() + k, ptrs.end()}; }
  std::vector<uint8_t> copy(int i) const { return {ptrs[i], ptrs[i] + bytes}; }

  size_t bytes;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<uint8_t*> ptrs;
};

ReedSolomon makeRs(int k, int m, RsBackend backend = RsBackend::kAuto) {
  auto rs = ReedSolomon::create({.dataShards = k, .parityShards = m, .backend = backend});
  EXPECT_TRUE(rs.ok()) << rs.status();
  return std::move(rs).value();
}

// Every subset of {0..n-1} with size <= maxSize, in lexicographic order of bitmasks.
std::vector<std::vector<int>> subsetsUpTo(int n, int maxSize) {
  std::vector<std::vector<int>> out;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    if (std::popcount(mask) > maxSize) continue;
    std::vector<int> s;
    for (int i = 0; i < n; ++i) {
      if (mask & (1u << i)) s.push_back(i);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Encodes with `rs`, checks the parity against the reference codec, then erases and decodes each
// pattern and checks every shard is back.
void checkPatterns(const ReedSolomon& rs, const std::vector<std::vector<int>>& patterns,
                   size_t bytes, size_t offset, uint64_t seed) {
  const int k = rs.dataShards(), m = rs.parityShards();
  Shards shards(k + m, bytes, offset);
  shards.fillData(k, seed);
  ASSERT_TRUE(rs.encode(shards.data(k), shards.parity(k), bytes).ok());

  // The reference, computed with the plain GF(2^8) kernel from the generator.
  Shards ref(k + m, bytes);
  for (int i = 0; i < k; ++i) std::copy_n(shards.ptrs[i], bytes, ref.ptrs[i]);
  std::vector<uint8_t> parityRows(rs.generator().begin() + k * k, rs.generator().end());
  gf256::mulAdd(parityRows, k, m, ref.data(k).data(), ref.parity(k).data(), bytes);
  for (int i = k; i < k + m; ++i) ASSERT_EQ(shards.copy(i), ref.copy(i)) << "parity " << i;

  std::vector<std::vector<uint8_t>> original;
  for (int i = 0; i < k + m; ++i) original.push_back(shards.copy(i));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (const auto& erasures : patterns) {
    for (int e : erasures) {
      for (size_t b = 0; b < bytes; ++b) shards.ptrs[e][b] = static_cast<uint8_t>(rng());
    }
    Status st = rs.decode(shards.ptrs, erasures, bytes);
    ASSERT_TRUE(st.ok()) << st;
    for (int i = 0; i < k + m; ++i) {
      ASSERT_EQ(shards.copy(i), original[i])
          << "shard " << i << " after erasing " << erasures.size();
    }
  }
}

class RsBackendTest : public ::testing::TestWithParam<RsBackend> {};

TEST_P(RsBackendTest, EveryErasurePatternOfSmallCodes) {
  const std::pair<int, int> codes[] = {{1, 1}, {2, 1}, {2, 2},  {3, 2}, {4, 3},
                                       {6, 3}, {8, 3}, {10, 4}, {5, 5}};
  for (auto [k, m] : codes) {
    SCOPED_TRACE("k=" + std::to_string(k) + " m=" + std::to_string(m));
    ReedSolomon rs = makeRs(k, m, GetParam());
    checkPatterns(rs, subsetsUpTo(k + m, m), 67, 0, 1000 + k * 31 + m);
  }
}

TEST_P(RsBackendTest, SeededRandomPatternsOfLargeCodes) {
  const std::pair<int, int> codes[] = {{20, 4}, {32, 8}, {100, 28}, {200, 56}, {255, 1}};
  std::mt19937 rng(7);
  for (auto [k, m] : codes) {
    SCOPED_TRACE("k=" + std::to_string(k) + " m=" + std::to_string(m));
    ReedSolomon rs = makeRs(k, m, GetParam());
    std::vector<std::vector<int>> patterns;
    std::vector<int> all(k + m);
    std::iota(all.begin(), all.end(), 0);
    for (int t = 0; t < 12; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      const int count = 1 + static_cast<int>(rng() % m);
      patterns.emplace_back(all.begin(), all.begin() + count);
    }
    patterns.emplace_back(all.begin(), all.begin() + m);  // always one maximal pattern
    checkPatterns(rs, patterns, 300 + rng() % 200, rng() % 8, 99 + k);
  }
}

TEST_P(RsBackendTest, UnalignedPointersAndOddLengths) {
  ReedSolomon rs = makeRs(10, 4, GetParam());
  const std::vector<std::vector<int>> patterns = {
      {0}, {3, 11}, {0, 1, 2, 3}, {10, 11, 12, 13}, {1, 5, 9, 12}};
  for (size_t bytes : {1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 127, 255, 1000, 4097}) {
    for (size_t offset : {0, 1, 3, 7}) {
      SCOPED_TRACE("bytes=" + std::to_string(bytes) + " offset=" + std::to_string(offset));
      checkPatterns(rs, patterns, bytes, offset, bytes * 13 + offset);
    }
  }
}

TEST_P(RsBackendTest, IncrementalEncodeInAnyOrderMatchesEncode) {
  ReedSolomon rs = makeRs(10, 4, GetParam());
  const size_t bytes = 1031;
  Shards full(14, bytes, 1), inc(14, bytes, 3);
  full.fillData(10, 5);
  for (int i = 0; i < 10; ++i) std::copy_n(full.ptrs[i], bytes, inc.ptrs[i]);
  ASSERT_TRUE(rs.encode(full.data(10), full.parity(10), bytes).ok());

  std::vector<int> order(10);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 10; i < 14; ++i) std::fill_n(inc.ptrs[i], bytes, 0xa5);  // begin must zero
    auto enc = RsIncrementalEncoder::begin(rs, inc.parity(10), bytes);
    ASSERT_TRUE(enc.ok()) << enc.status();
    for (int idx : order) {
      EXPECT_FALSE(enc->complete());
      ASSERT_TRUE(enc->add(idx, inc.ptrs[idx]).ok());
    }
    EXPECT_TRUE(enc->complete());
    for (int i = 10; i < 14; ++i) EXPECT_EQ(inc.copy(i), full.copy(i)) << "parity " << i;
    EXPECT_EQ(enc->add(order[0], inc.ptrs[order[0]]).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(enc->add(10, inc.ptrs[0]).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(enc->add(-1, inc.ptrs[0]).code(), StatusCode::kInvalidArgument);
  }
}

// A shard written by the call sharing memory with another shard it reads or writes used to give
// wrong shards with OK: two rebuilt shards in one scratch buffer (the later one won), a parity
// over a data shard (zeroed or overwritten before it was read). Refused now, nothing written;
// sources may still share memory, and shards merely adjacent are fine.
TEST_P(RsBackendTest, WrittenShardsSharingMemoryAreRefused) {
  ReedSolomon rs = makeRs(4, 2, GetParam());
  const size_t bytes = 64;
  Shards shards(6, bytes);
  shards.fillData(4, 3);
  ASSERT_TRUE(rs.encode(shards.data(4), shards.parity(4), bytes).ok());
  std::vector<std::vector<uint8_t>> before;
  for (int i = 0; i < 6; ++i) before.push_back(shards.copy(i));
  const auto untouched = [&] {
    for (int i = 0; i < 6; ++i) EXPECT_EQ(shards.copy(i), before[i]) << "shard " << i;
  };

  std::vector<uint8_t*> oneScratch = shards.ptrs;
  oneScratch[4] = oneScratch[1];  // shards 1 and 4 erased, rebuilt into the same buffer
  Status st = rs.decode(oneScratch, std::vector<int>{1, 4}, bytes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("shards 1 and 4 share memory"), std::string::npos) << st;
  untouched();
  // A rebuilt shard half over a survivor it reads.
  std::vector<uint8_t*> straddle = shards.ptrs;
  straddle[0] = shards.ptrs[2] + bytes / 2;
  EXPECT_EQ(rs.decode(straddle, std::vector<int>{0}, bytes).code(), StatusCode::kInvalidArgument);
  untouched();

  std::vector<uint8_t*> parity = shards.parity(4);
  parity[0] = shards.ptrs[3];
  st = rs.encode(shards.data(4), parity, bytes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("shards 3 and 4"), std::string::npos) << st;
  untouched();
  std::vector<uint8_t*> sameParity = {shards.ptrs[4], shards.ptrs[4]};
  EXPECT_EQ(RsIncrementalEncoder::begin(rs, sameParity, bytes).status().code(),
            StatusCode::kInvalidArgument);
  auto inc = RsIncrementalEncoder::begin(rs, shards.parity(4), bytes);
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_EQ(inc->add(0, shards.ptrs[5]).code(), StatusCode::kInvalidArgument);

  // Sources sharing memory, and shards packed back to back in one buffer: allowed.
  std::vector<uint8_t> packed(6 * bytes);
  std::vector<const uint8_t*> data = {packed.data(), packed.data(), packed.data() + bytes,
                                      packed.data() + 2 * bytes};
  std::vector<uint8_t*> packedParity = {packed.data() + 4 * bytes, packed.data() + 5 * bytes};
  EXPECT_TRUE(rs.encode(data, packedParity, bytes).ok());
}

TEST_P(RsBackendTest, ConcurrentDecodesShareTheCache) {
  ReedSolomon rs = makeRs(8, 3, GetParam());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Shards s(11, 513, t);
      s.fillData(8, 100 + t);
      if (!rs.encode(s.data(8), s.parity(8), 513).ok()) ++failures;
      std::vector<std::vector<uint8_t>> orig;
      for (int i = 0; i < 11; ++i) orig.push_back(s.copy(i));
      for (int round = 0; round < 50; ++round) {
        std::vector<int> er = {round % 11, (round + 3 + t) % 11};
        if (er[0] == er[1]) er.pop_back();
        for (int e : er) std::fill_n(s.ptrs[e], 513, 0);
        if (!rs.decode(s.ptrs, er, 513).ok()) ++failures;
        for (int i = 0; i < 11; ++i) {
          if (s.copy(i) != orig[i]) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(rs.cachedDecodePatterns(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, RsBackendTest,
                         ::testing::Values(RsBackend::kAuto, RsBackend::kReference),
                         [](const auto& info) { return std::string(rsBackendName(info.param)); });

TEST(ReedSolomonTest, RejectsBadShapes) {
  for (auto [k, m] :
       std::vector<std::pair<int, int>>{{0, 1},
                                        {1, 0},
                                        {-1, 2},
                                        {250, 7},
                                        {1, 256},
                                        {200, INT_MAX},  // k + m overflowed past the bound
                                        {INT_MAX, 1}}) {
    auto rs = ReedSolomon::create({.dataShards = k, .parityShards = m});
    EXPECT_EQ(rs.status().code(), StatusCode::kInvalidArgument) << k << "+" << m;
  }
  EXPECT_TRUE(ReedSolomon::create({.dataShards = 200, .parityShards = 56}).ok());
}

TEST(ReedSolomonTest, BadArgumentsAreInvalidArgumentAndTooManyErasuresDataLoss) {
  ReedSolomon rs = makeRs(4, 2);
  Shards s(6, 64);
  s.fillData(4, 1);
  auto data = s.data(4);
  auto parity = s.parity(4);
  ASSERT_TRUE(rs.encode(data, parity, 64).ok());
  auto code = [](const Status& st) { return st.code(); };
  EXPECT_EQ(code(rs.encode(data, parity, 0)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(rs.encode(std::span(data).first(3), parity, 64)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(rs.encode(data, std::span(parity).first(1), 64)), StatusCode::kInvalidArgument);
  auto nullData = data;
  nullData[2] = nullptr;
  EXPECT_EQ(code(rs.encode(nullData, parity, 64)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(rs.encode(data, parity, size_t{1} << 32)), StatusCode::kInvalidArgument);

  std::vector<int> dup = {1, 1}, outOfRange = {6}, negative = {-1}, tooMany = {0, 1, 5};
  EXPECT_EQ(code(rs.decode(s.ptrs, dup, 64)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(rs.decode(s.ptrs, outOfRange, 64)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(rs.decode(s.ptrs, negative, 64)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(rs.decode(s.ptrs, tooMany, 64)), StatusCode::kDataLoss);
  EXPECT_EQ(code(rs.decode(std::span(s.ptrs).first(5), std::vector<int>{0}, 64)),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(rs.decode(s.ptrs, std::vector<int>{}, 64).ok());
  auto enc = RsIncrementalEncoder::begin(rs, std::span(parity).first(1), 64);
  EXPECT_EQ(enc.status().code(), StatusCode::kInvalidArgument);
}

TEST(ReedSolomonTest, DecodeTablesAreCachedPerPattern) {
  ReedSolomon rs = makeRs(6, 3);
  Shards s(9, 100);
  s.fillData(6, 2);
  ASSERT_TRUE(rs.encode(s.data(6), s.parity(6), 100).ok());
  EXPECT_EQ(rs.cachedDecodePatterns(), 0u);
  ASSERT_TRUE(rs.decode(s.ptrs, std::vector<int>{1, 7}, 100).ok());
  ASSERT_TRUE(rs.decode(s.ptrs, std::vector<int>{7, 1}, 100).ok());  // same pattern, any order
  EXPECT_EQ(rs.cachedDecodePatterns(), 1u);
  ASSERT_TRUE(rs.decode(s.ptrs, std::vector<int>{2}, 100).ok());
  EXPECT_EQ(rs.cachedDecodePatterns(), 2u);
}

TEST(Gf256Test, InverseTimesMatrixIsIdentity) {
  std::mt19937 rng(3);
  for (int n : {1, 2, 5, 12}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint8_t> a(n * n), inv(n * n);
      for (auto& x : a) x = static_cast<uint8_t>(rng());
      if (!gf256::invertMatrix(a, inv, n)) continue;  // random singular matrices happen
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          uint8_t s = 0;
          for (int t = 0; t < n; ++t) s ^= gf256::mul(a[i * n + t], inv[t * n + j]);
          ASSERT_EQ(s, i == j ? 1 : 0);
        }
      }
    }
  }
  std::vector<uint8_t> singular = {1, 2, 1, 2}, out(4);
  EXPECT_FALSE(gf256::invertMatrix(singular, out, 2));
}

#if COFAB_HAVE_ISAL

TEST(IsalInteropTest, FieldAndGeneratorMatchIsal) {
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      ASSERT_EQ(gf256::mul(a, b), gf_mul(a, b)) << a << "*" << b;
    }
    ASSERT_EQ(gf256::inv(a), gf_inv(a));
  }
  for (auto [k, m] : std::vector<std::pair<int, int>>{{10, 4}, {8, 3}, {20, 4}, {200, 56}}) {
    std::vector<uint8_t> isal((k + m) * k);
    gf_gen_cauchy1_matrix(isal.data(), k + m, k);
    EXPECT_EQ(gf256::cauchyGenerator(k, m), isal);
  }
}

// Raw ISA-L decode, written the way ISA-L's own ec_simple_example does it.
void isalDecode(int k, int m, std::vector<uint8_t*>& shards, const std::vector<int>& erasures,
                int len) {
  std::vector<uint8_t> enc((k + m) * k), b(k * k), inv(k * k), dec(k * m), tbls(32 * k * m);
  gf_gen_cauchy1_matrix(enc.data(), k + m, k);
  std::vector<bool> err(k + m);
  for (int e : erasures) err[e] = true;
  std::vector<uint8_t*> srcs;
  for (int i = 0, r = 0; i < k; ++i, ++r) {
    while (err[r]) ++r;
    std::copy_n(&enc[k * r], k, &b[k * i]);
    srcs.push_back(shards[r]);
  }
  ASSERT_EQ(gf_invert_matrix(b.data(), inv.data(), k), 0);
  std::vector<uint8_t*> outs;
  for (size_t p = 0; p < erasures.size(); ++p) {
    const int e = erasures[p];
    for (int i = 0; i < k; ++i) {
      if (e < k) {
        dec[k * p + i] = inv[k * e + i];
      } else {
        uint8_t s = 0;
        for (int j = 0; j < k; ++j) s ^= gf_mul(inv[j * k + i], enc[k * e + j]);
        dec[k * p + i] = s;
      }
    }
    outs.push_back(shards[e]);
  }
  ec_init_tables(k, static_cast<int>(erasures.size()), dec.data(), tbls.data());
  ec_encode_data(len, k, static_cast<int>(erasures.size()), tbls.data(), srcs.data(), outs.data());
}

TEST(IsalInteropTest, CofabEncodesRawIsalDecodes) {
  for (auto backend : {RsBackend::kIsal, RsBackend::kReference}) {
    ReedSolomon rs = makeRs(10, 4, backend);
    const int len = 777;
    Shards s(14, len, 1);
    s.fillData(10, 42);
    ASSERT_TRUE(rs.encode(s.data(10), s.parity(10), len).ok());
    std::vector<std::vector<uint8_t>> orig;
    for (int i = 0; i < 14; ++i) orig.push_back(s.copy(i));
    for (const auto& er : std::vector<std::vector<int>>{{0, 1, 2, 3}, {2, 9, 10, 13}, {5}}) {
      for (int e : er) std::fill_n(s.ptrs[e], len, 0);
      isalDecode(10, 4, s.ptrs, er, len);
      for (int i = 0; i < 14; ++i) ASSERT_EQ(s.copy(i), orig[i]);
    }
  }
}

TEST(IsalInteropTest, RawIsalEncodesCofabDecodes) {
  const int k = 8, m = 3, len = 4099;
  std::vector<uint8_t> enc((k + m) * k), tbls(32 * k * m);
  gf_gen_cauchy1_matrix(enc.data(), k + m, k);
  ec_init_tables(k, m, &enc[k * k], tbls.data());
  Shards s(k + m, len, 5);
  s.fillData(k, 77);
  std::vector<uint8_t*> data(s.ptrs.begin(), s.ptrs.begin() + k),
      parity(s.ptrs.begin() + k, s.ptrs.end());
  ec_encode_data(len, k, m, tbls.data(), data.data(), parity.data());
  std::vector<std::vector<uint8_t>> orig;
  for (int i = 0; i < k + m; ++i) orig.push_back(s.copy(i));
  for (auto backend : {RsBackend::kIsal, RsBackend::kReference}) {
    ReedSolomon rs = makeRs(k, m, backend);
    for (const auto& er : subsetsUpTo(k + m, m)) {
      for (int e : er) std::fill_n(s.ptrs[e], len, 0x5a);
      ASSERT_TRUE(rs.decode(s.ptrs, er, len).ok());
      for (int i = 0; i < k + m; ++i) ASSERT_EQ(s.copy(i), orig[i]);
    }
  }
}

#else

TEST(IsalInteropTest, IsalBackendIsUnavailableWithoutIsal) {
  auto rs = ReedSolomon::create({.dataShards = 4, .parityShards = 2, .backend = RsBackend::kIsal});
  EXPECT_EQ(rs.status().code(), StatusCode::kUnavailable) << rs.status();
}

#endif

}  // namespace
}  // namespace cofab::coding

// CodedMatmul against plain GEMM: bit-exact on the systematic path, within 1e-4 relative
// Frobenius error (the bound for n <= 12, n - k <= 3) for every erasure pattern.
#include "coding/matmul/coded_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "gpu/device.h"

namespace cofab::coding {
namespace {

struct Dense {
  Dense(int64_t r, int64_t c) : rows(r), cols(c), v(r * c) {}
  void randomise(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : v) x = u(rng);
  }
  ConstMatrixView view() const { return {v.data(), rows, cols, 0}; }
  MatrixView mut() { return {v.data(), rows, cols, 0}; }
  int64_t rows, cols;
  std::vector<float> v;
};

// FP64 reference product, written out: the thing under test uses BLAS.
std::vector<double> referenceProduct(const Dense& a, const Dense& b) {
  std::vector<double> c(a.rows * b.cols, 0.0);
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t t = 0; t < a.cols; ++t) {
      const double x = a.v[i * a.cols + t];
      for (int64_t j = 0; j < b.cols; ++j) c[i * b.cols + j] += x * b.v[t * b.cols + j];
    }
  }
  return c;
}

double relError(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

std::vector<std::vector<int>> kSubsets(int n, int k) {
  std::vector<std::vector<int>> out;
  std::vector<int> rows(k);
  std::iota(rows.begin(), rows.end(), 0);
  while (true) {
    out.push_back(rows);
    int i = k - 1;
    while (i >= 0 && rows[i] == n - k + i) --i;
    if (i < 0) break;
    ++rows[i];
    for (int j = i + 1; j < k; ++j) rows[j] = rows[j - 1] + 1;
  }
  return out;
}

TEST(CodedMatmulTest, EveryErasurePatternWithinBoundAndSystematicPathBitExact) {
  const std::pair<int, int> shapes[] = {{4, 3}, {6, 4}, {8, 6}, {10, 8}, {12, 9}, {12, 11}};
  for (auto [n, k] : shapes) {
    SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k));
    auto cm = CodedMatmul::create({.n = n, .k = k});
    ASSERT_TRUE(cm.ok()) << cm.status();
    Dense a(101, 40), b(40, 23);  // 101 rows: not a multiple of k, exercises the padding
    a.randomise(n * 100 + k);
    b.randomise(n * 100 + k + 1);
    const std::vector<double> want = referenceProduct(a, b);
    auto enc = cm->encode(a.view());
    ASSERT_TRUE(enc.ok()) << enc.status();
    const int64_t br = enc->blockRows();
    std::vector<std::vector<float>> outs(n, std::vector<float>(br * b.cols));
    for (int t = 0; t < n; ++t) {
      ASSERT_TRUE(cm->multiplyTask(*enc, t, b.view(), {outs[t].data(), br, b.cols, 0}).ok());
    }
    // Uncoded block products with the same block shapes (A zero-padded to k * br rows: BLAS
    // may round differently for another row count), for the bit-exact check.
    Dense padded(k * br, a.cols), uncodedPadded(k * br, b.cols);
    std::copy(a.v.begin(), a.v.end(), padded.v.begin());
    for (int j = 0; j < k; ++j) {
      ASSERT_TRUE(gemmF32({padded.v.data() + j * br * a.cols, br, a.cols, 0}, b.view(),
                          {uncodedPadded.v.data() + j * br * b.cols, br, b.cols, 0})
                      .ok());
    }
    Dense uncoded(a.rows, b.cols);
    std::copy_n(uncodedPadded.v.begin(), uncoded.v.size(), uncoded.v.begin());
    double worst = 0;
    for (const auto& used : kSubsets(n, k)) {
      std::vector<TaskResult> results;
      for (int t : used) results.push_back({t, outs[t].data()});
      Dense c(a.rows, b.cols);
      auto report = cm->decode(*enc, results, b.cols, c.mut());
      ASSERT_TRUE(report.ok()) << report.status();
      const bool systematic = used.back() < k;
      EXPECT_EQ(report->decoded, !systematic);
      if (systematic) {
        EXPECT_EQ(report->condition, 0.0) << "nothing solved";
      } else {
        // The 1-norm condition number of the system solved: >= 1, and within a factor k of the
        // 2-norm one, which the code's survey bounds.
        EXPECT_GE(report->condition, 1.0 - 1e-9);
        EXPECT_LE(report->condition, k * cm->code().worstCondition() * (1 + 1e-9));
      }
      if (systematic) {
        ASSERT_EQ(c.v, uncoded.v) << "systematic results must be used as they are";
      }
      worst = std::max(worst, relError(c.v, want));
    }
    EXPECT_LE(worst, 1e-4) << "worst condition " << cm->code().worstCondition();
  }
}

TEST(CodedMatmulTest, PrefersSystematicResultsWhenMoreThanKArrive) {
  auto cm = CodedMatmul::create({.n = 6, .k = 4});
  ASSERT_TRUE(cm.ok());
  Dense a(16, 8), b(8, 5);
  a.randomise(1);
  b.randomise(2);
  auto enc = cm->encode(a.view());
  std::vector<std::vector<float>> outs(6, std::vector<float>(enc->blockRows() * 5));
  std::vector<TaskResult> results;
  for (int t : {5, 4, 0, 1, 2, 3}) {
    ASSERT_TRUE(cm->multiplyTask(*enc, t, b.view(), {outs[t].data(), enc->blockRows(), 5, 0}).ok());
    results.push_back({t, outs[t].data()});
  }
  Dense c(16, 5);
  auto report = cm->decode(*enc, results, 5, c.mut());
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->decoded);
  EXPECT_EQ(report->used, (std::vector<int>{0, 1, 2, 3}));
}

TEST(CodedMatmulTest, BadArguments) {
  auto cm = CodedMatmul::create({.n = 5, .k = 3});
  ASSERT_TRUE(cm.ok());
  Dense a(9, 4), b(4, 2), c(9, 2);
  a.randomise(3);
  b.randomise(4);
  EXPECT_EQ(cm->encode({nullptr, 3, 3, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cm->encode({a.v.data(), 0, 4, 0}).status().code(), StatusCode::kInvalidArgument);
  // Rows near INT64_MAX: the block size used to overflow into a tiny encoding, then a memcpy of
  // every row wrote past it.
  EXPECT_EQ(cm->encode({a.v.data(), INT64_MAX, 2, 0}).status().code(),
            StatusCode::kInvalidArgument);
  auto enc = cm->encode(a.view());
  ASSERT_TRUE(enc.ok());
  std::vector<float> out(enc->blockRows() * 2);
  EXPECT_EQ(cm->multiplyTask(*enc, 5, b.view(), {out.data(), enc->blockRows(), 2, 0}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      cm->multiplyTask(*enc, 0, {b.v.data(), 3, 2, 0}, {out.data(), enc->blockRows(), 2, 0}).code(),
      StatusCode::kInvalidArgument);
  std::vector<TaskResult> two = {{0, out.data()}, {4, out.data()}};
  EXPECT_EQ(cm->decode(*enc, two, 2, c.mut()).status().code(), StatusCode::kDataLoss);
  std::vector<TaskResult> dup = {{0, out.data()}, {0, out.data()}, {1, out.data()}};
  EXPECT_EQ(cm->decode(*enc, dup, 2, c.mut()).status().code(), StatusCode::kInvalidArgument);
  std::vector<TaskResult> range = {{0, out.data()}, {7, out.data()}, {1, out.data()}};
  EXPECT_EQ(cm->decode(*enc, range, 2, c.mut()).status().code(), StatusCode::kInvalidArgument);
  std::vector<TaskResult> nul = {{0, out.data()}, {2, nullptr}, {1, out.data()}};
  EXPECT_EQ(cm->decode(*enc, nul, 2, c.mut()).status().code(), StatusCode::kInvalidArgument);
  std::vector<TaskResult> good = {{0, out.data()}, {2, out.data()}, {1, out.data()}};
  Dense wrong(8, 2);
  EXPECT_EQ(cm->decode(*enc, good, 2, wrong.mut()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gemmF32(a.view(), {b.v.data(), 2, 4, 0}, c.mut()).code(), StatusCode::kInvalidArgument);
}

// Two codes of one (n, k) from other families (or seeds far apart): one's encoding used to decode
// with the other into a wrong C, returning OK. Now the matrix remembers its code and the other
// refuses it.
TEST(CodedMatmulTest, AMatrixEncodedByAnotherCodeOfTheSameShapeIsRefused) {
  auto one = CodedMatmul::create({.n = 6, .k = 4});
  auto two = CodedMatmul::create({.n = 6, .k = 4, .family = MdsFamily::kCauchyChebyshev});
  ASSERT_TRUE(one.ok() && two.ok());
  Dense a(8, 3), b(3, 2), c(8, 2);
  a.randomise(5);
  b.randomise(6);
  auto enc = one->encode(a.view());
  ASSERT_TRUE(enc.ok());
  std::vector<float> outs(enc->blockRows() * 2 * 6);
  std::vector<TaskResult> parity;
  for (int t = 2; t < 6; ++t) {  // two systematic tasks lost: decoding needs the parity
    float* o = outs.data() + t * enc->blockRows() * 2;
    ASSERT_TRUE(one->multiplyTask(*enc, t, b.view(), {o, enc->blockRows(), 2, 0}).ok());
    parity.push_back({t, o});
  }
  auto wrong = two->decode(*enc, parity, 2, c.mut());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status();
  EXPECT_EQ(two->multiplyTask(*enc, 0, b.view(), {outs.data(), enc->blockRows(), 2, 0}).code(),
            StatusCode::kInvalidArgument);
  // Its own code decodes it.
  ASSERT_TRUE(one->decode(*enc, parity, 2, c.mut()).ok());
  EXPECT_LT(relError(c.v, referenceProduct(a, b)), 1e-4);
}

TEST(CodedMatmulTest, RawBlockEntryPointsMatchAndValidate) {
  auto cm = CodedMatmul::create({.n = 6, .k = 4});
  ASSERT_TRUE(cm.ok());
  Dense a(40, 8), b(8, 3);
  a.randomise(7);
  b.randomise(8);
  auto enc = cm->encode(a.view());
  ASSERT_TRUE(enc.ok());
  const size_t be = enc->blockRows() * 8;
  std::vector<float> blocks(enc->block(0).data, enc->block(0).data + 6 * be);
  std::fill(blocks.begin() + 4 * be, blocks.end(), -1.0f);
  ASSERT_TRUE(cm->encodeParity(blocks.data(), be).ok());
  EXPECT_TRUE(std::equal(blocks.begin(), blocks.end(), enc->block(0).data));
  EXPECT_EQ(cm->encodeParity(nullptr, be).code(), StatusCode::kInvalidArgument);

  const size_t oe = enc->blockRows() * 3;
  std::vector<std::vector<float>> outs(6, std::vector<float>(oe));
  for (int t = 0; t < 6; ++t) {
    ASSERT_TRUE(cm->multiplyTask(*enc, t, b.view(), {outs[t].data(), enc->blockRows(), 3, 0}).ok());
  }
  std::vector<TaskResult> results = {
      {1, outs[1].data()}, {3, outs[3].data()}, {4, outs[4].data()}, {5, outs[5].data()}};
  std::vector<int> missing = {0, 2};
  std::vector<float> r0(oe), r2(oe);
  std::vector<float*> rebuilt = {r0.data(), r2.data()};
  ASSERT_TRUE(cm->decodeBlocks(results, missing, rebuilt, oe).ok());
  for (size_t i = 0; i < oe; ++i) {
    EXPECT_NEAR(r0[i], outs[0][i], 1e-4);
    EXPECT_NEAR(r2[i], outs[2][i], 1e-4);
  }
  EXPECT_EQ(cm->decodeBlocks(std::span(results).first(3), missing, rebuilt, oe).code(),
            StatusCode::kDataLoss);
  // More than k results is the caller's mistake (decode picks k; decodeBlocks takes exactly k).
  std::vector<TaskResult> five = results;
  five.push_back({0, outs[0].data()});
  EXPECT_EQ(cm->decodeBlocks(five, missing, rebuilt, oe).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cm->decodeBlocks(results, missing, std::span(rebuilt).first(1), oe).code(),
            StatusCode::kInvalidArgument);
}

// encode / decode asked to run on a GPU where none is usable: Unavailable (gpu/'s reason), never
// a quiet CPU computation. Where a GPU exists tests/gpu compares the two paths instead.
TEST(CodedMatmul, DeviceEncodeAndDecodeWithoutAGpuAreUnavailable) {
  if (auto gpus = gpu::deviceCount(); gpus.ok()) {
    GTEST_SKIP() << "a GPU is usable here: tests/gpu checks the device path";
  }
  auto cm = CodedMatmul::create({.n = 5, .k = 3});
  ASSERT_TRUE(cm.ok());
  Dense a(12, 4), b(4, 2), c(12, 2);
  a.randomise(1);
  b.randomise(2);
  EXPECT_EQ(cm->encode(a.view(), Device::cuda(0)).status().code(), StatusCode::kUnavailable);
  auto enc = cm->encode(a.view());
  ASSERT_TRUE(enc.ok());
  const size_t oe = enc->blockRows() * 2;
  std::vector<std::vector<float>> outs(5, std::vector<float>(oe));
  std::vector<TaskResult> results;
  for (int t : {1, 3, 4}) {  // block 0 and 2 missing: a real decode
    ASSERT_TRUE(cm->multiplyTask(*enc, t, b.view(), {outs[t].data(), enc->blockRows(), 2, 0}).ok());
    results.push_back({t, outs[t].data()});
  }
  EXPECT_EQ(cm->decode(*enc, results, 2, c.mut(), Device::cuda(0)).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace cofab::coding

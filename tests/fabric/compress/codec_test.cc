// The codecs against their definitions (fabric/compress/codec.h): int8 error within half a
// quantisation step, 1-bit keeps sign and per-block mean |x|, error feedback keeps the running
// sum of what was sent within a bounded distance of the running sum of the inputs, and every
// malformed encoding is refused with a reason.
#include "fabric/compress/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

namespace cofab::compress {
namespace {

std::vector<float> randomVector(size_t n, uint32_t seed, float spread = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> encode(Compression c, const std::vector<float>& x, size_t block,
                            float* residual = nullptr) {
  std::vector<uint8_t> out(compressedBytes(c, x.size(), block));
  compress(c, x.data(), x.size(), block, residual, out.data());
  return out;
}

std::vector<float> decode(Compression c, const std::vector<uint8_t>& enc, size_t count) {
  std::vector<float> out(count);
  const Status st = decompress(c, enc.data(), enc.size(), count, out.data());
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

float readF32(const std::vector<uint8_t>& b, size_t off) {
  float v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

TEST(Codec, Int8ErrorIsAtMostHalfAStepPerElement) {
  for (size_t count : {1u, 7u, 255u, 256u, 257u, 1000u, 4099u}) {
    for (size_t block : {1u, 16u, 256u, 1000u}) {
      auto x = randomVector(count, static_cast<uint32_t>(count * 31 + block), 3.0f);
      const auto enc = encode(Compression::kInt8, x, block);
      ASSERT_EQ(enc.size() % 4, 0u);
      const auto y = decode(Compression::kInt8, enc, count);
      size_t off = kPrefixBytes;
      for (size_t base = 0; base < count; base += block) {
        const size_t n = std::min(block, count - base);
        const float lo = readF32(enc, off);
        const float scale = readF32(enc, off + 4);
        float hi = x[base];
        for (size_t j = 0; j < n; ++j) hi = std::max(hi, x[base + j]);
        EXPECT_NEAR(scale, (hi - lo) / 255.0f, 1e-6f * std::fabs(hi - lo));
        for (size_t j = 0; j < n; ++j) {
          // Half a step, plus the rounding of min + q * scale in f32.
          const float bound = scale / 2 + 4e-7f * (std::fabs(lo) + std::fabs(hi));
          ASSERT_LE(std::fabs(y[base + j] - x[base + j]), bound)
              << "count " << count << " block " << block << " element " << base + j;
        }
        off += 8 + n;
      }
    }
  }
}

TEST(Codec, Int8ConstantBlockIsExact) {
  std::vector<float> x(300, -2.5f);
  EXPECT_EQ(decode(Compression::kInt8, encode(Compression::kInt8, x, 256), x.size()), x);
}

TEST(Codec, OneBitKeepsSignsAndTheBlockMeanMagnitude) {
  const size_t count = 1000, block = 256;
  auto x = randomVector(count, 7);
  const auto y = decode(Compression::kOneBit, encode(Compression::kOneBit, x, block), count);
  for (size_t base = 0; base < count; base += block) {
    const size_t n = std::min(block, count - base);
    double mean = 0;
    for (size_t j = 0; j < n; ++j) mean += std::fabs(x[base + j]);
    mean /= static_cast<double>(n);
    for (size_t j = 0; j < n; ++j) {
      EXPECT_NEAR(std::fabs(y[base + j]), mean, 1e-5 * mean);
      EXPECT_EQ(y[base + j] >= 0, x[base + j] >= 0) << "element " << base + j;
    }
  }
}

TEST(Codec, OneBitCutsBytesMoreThan20xAtTheDefaultBlock) {
  const size_t count = 1 << 20;
  EXPECT_GE(static_cast<double>(count * 4) /
                static_cast<double>(compressedBytes(Compression::kOneBit, count, kDefaultBlock)),
            28.0);
  EXPECT_GE(static_cast<double>(count * 4) /
                static_cast<double>(compressedBytes(Compression::kInt8, count, kDefaultBlock)),
            3.8);
}

// Error feedback: after t steps, sum(inputs) - sum(decoded) equals the residual, which stays
// bounded; without feedback the gap grows with t.
TEST(Codec, ErrorFeedbackKeepsTheRunningSumOnTrack) {
  const size_t count = 512, block = 64;
  const int steps = 400;
  std::vector<float> residual(count, 0.0f);
  std::vector<double> sumIn(count, 0), sumFed(count, 0), sumPlain(count, 0);
  double worstFed = 0;
  float maxAbsInput = 0;
  for (int t = 0; t < steps; ++t) {
    // A biased gradient (mean 0.3) with noise: 1-bit without feedback loses the bias per block.
    auto g = randomVector(count, 1000 + static_cast<uint32_t>(t));
    for (size_t i = 0; i < count; ++i) {
      g[i] = 0.3f * static_cast<float>(i % 7) / 7.0f + 0.5f * g[i];
      maxAbsInput = std::max(maxAbsInput, std::fabs(g[i]));
    }
    const auto fed = decode(Compression::kOneBit,
                            encode(Compression::kOneBit, g, block, residual.data()), count);
    const auto plain = decode(Compression::kOneBit, encode(Compression::kOneBit, g, block), count);
    for (size_t i = 0; i < count; ++i) {
      sumIn[i] += g[i];
      sumFed[i] += fed[i];
      sumPlain[i] += plain[i];
      // The identity that error feedback maintains.
      ASSERT_NEAR(sumIn[i] - sumFed[i], residual[i], 1e-3 * (1 + std::fabs(sumIn[i])));
      worstFed = std::max(worstFed, std::fabs(sumIn[i] - sumFed[i]));
    }
  }
  double worstPlain = 0;
  for (size_t i = 0; i < count; ++i) {
    worstPlain = std::max(worstPlain, std::fabs(sumIn[i] - sumPlain[i]));
  }
  std::printf(
      "error feedback: worst |sum(in) - sum(sent)| %.3f with feedback, %.3f without, max |g| "
      "%.3f\n",
      worstFed, worstPlain, maxAbsInput);
  // Bounded: a few inputs' worth, independent of the number of steps.
  EXPECT_LT(worstFed, 8.0 * maxAbsInput) << "residual grew over " << steps << " steps";
  EXPECT_GT(worstPlain, 4 * worstFed) << "without feedback the sum should drift";
}

TEST(Codec, MalformedEncodingsAreRefusedWithAReason) {
  auto x = randomVector(1000, 3);
  for (Compression c : {Compression::kInt8, Compression::kOneBit}) {
    auto enc = encode(c, x, 256);
    std::vector<float> out(1000);
    auto shorter = enc;
    shorter.resize(enc.size() - 4);
    Status st = decompress(c, shorter.data(), shorter.size(), 1000, out.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("take"), std::string::npos) << st;
    auto longer = enc;
    longer.resize(enc.size() + 4);
    EXPECT_FALSE(decompress(c, longer.data(), longer.size(), 1000, out.data()).ok());
    EXPECT_FALSE(decompress(c, enc.data(), 4, 1000, out.data()).ok());
    EXPECT_FALSE(decompress(c, enc.data(), enc.size(), 999, out.data()).ok()) << "wrong count";
    auto zeroBlock = enc;
    std::memset(zeroBlock.data() + 4, 0, 4);
    st = decompress(c, zeroBlock.data(), zeroBlock.size(), 1000, out.data());
    EXPECT_NE(st.message().find("block size"), std::string::npos) << st;
    EXPECT_TRUE(decompress(c, enc.data(), enc.size(), 1000, out.data()).ok());
  }
  EXPECT_FALSE(inspect(Compression::kNone, nullptr, 0).ok());
}

// An Inf or a NaN in a block (an fp16 loss-scaling overflow step) decodes to NaN across that
// block, so the overflow stays visible, but it leaves a zero residual behind: the next, finite
// step decodes exactly as if the key had no history in that block (it used to be NaN forever).
TEST(Codec, OneBitErrorFeedbackRecoversAfterANonFiniteBlock) {
  const size_t count = 128, block = 64;
  const float bad[] = {std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()};
  for (float b : bad) {
    ErrorFeedback fb;
    std::vector<float> x(count, 1.0f);
    x[0] = b;
    for (size_t i = block; i < count; ++i) x[i] = 0.5f + 0.01f * static_cast<float>(i % 9);
    std::vector<uint8_t> enc(compressedBytes(Compression::kOneBit, count, block));
    EXPECT_EQ(
        compress(Compression::kOneBit, x.data(), count, block, fb.residual(7, count), enc.data()),
        1u)
        << "one non-finite block reported, input " << b;
    const auto first = decode(Compression::kOneBit, enc, count);
    for (size_t i = 0; i < block; ++i) {
      EXPECT_TRUE(std::isnan(first[i])) << "element " << i << " of the bad block, input " << b;
    }
    for (size_t i = block; i < count; ++i) {
      EXPECT_TRUE(std::isfinite(first[i])) << "element " << i << " of the good block";
    }
    const float* r = fb.residual(7, count);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(std::isfinite(r[i])) << "residual " << i << ", input " << b;
    }
    for (size_t i = 0; i < block; ++i) {
      EXPECT_EQ(r[i], 0.0f) << "the bad block's residual is reset, element " << i;
    }

    // The next step is finite: block 0 (ones, zero residual) decodes to exactly 1.
    std::vector<float> y(count, 1.0f);
    EXPECT_EQ(
        compress(Compression::kOneBit, y.data(), count, block, fb.residual(7, count), enc.data()),
        0u);
    const auto second = decode(Compression::kOneBit, enc, count);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(std::isfinite(second[i])) << "element " << i << " after input " << b;
    }
    for (size_t i = 0; i < block; ++i) {
      EXPECT_EQ(second[i], 1.0f) << "element " << i << " after input " << b;
    }
  }
}

// int8 with an Inf (anywhere in the block) or a NaN (which min/max comparisons skip): no
// float-to-int conversion of a non-finite or out-of-range value (UBSan runs this), the block
// decodes to NaN, the other blocks as usual, and the residual of the bad blocks is reset.
TEST(Codec, Int8NonFiniteBlocksDecodeToNaNWithoutUndefinedBehaviour) {
  const size_t count = 96, block = 32;
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(i % 11) - 5.0f;
  x[3] = std::numeric_limits<float>::infinity();
  x[32 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> residual(count, 0.0f);
  std::vector<uint8_t> enc(compressedBytes(Compression::kInt8, count, block));
  EXPECT_EQ(compress(Compression::kInt8, x.data(), count, block, residual.data(), enc.data()), 2u);
  const auto y = decode(Compression::kInt8, enc, count);
  for (size_t i = 0; i < 2 * block; ++i) {
    EXPECT_TRUE(std::isnan(y[i])) << "element " << i << " of a non-finite block";
    EXPECT_EQ(residual[i], 0.0f) << "element " << i;
  }
  for (size_t i = 2 * block; i < count; ++i) {
    // Values -5..5 in steps of 1: within half a step of 10 / 255.
    EXPECT_NEAR(y[i], x[i], 10.0f / 255.0f) << "element " << i;
    EXPECT_TRUE(std::isfinite(residual[i])) << "element " << i;
  }
  // The next, finite step is not affected by the bad one.
  std::vector<float> z(count, 2.0f);
  EXPECT_EQ(compress(Compression::kInt8, z.data(), count, block, residual.data(), enc.data()), 0u);
  const auto w = decode(Compression::kInt8, enc, count);
  for (size_t i = 0; i < 2 * block; ++i) {
    EXPECT_EQ(w[i], 2.0f) << "element " << i;
  }
  for (size_t i = 0; i < count; ++i) {
    EXPECT_TRUE(std::isfinite(w[i])) << "element " << i;
  }
  // Without a residual: the same, and -Inf alone in a block.
  std::vector<float> v(block, 1.0f);
  v[block - 1] = -std::numeric_limits<float>::infinity();
  const auto u = decode(Compression::kInt8, encode(Compression::kInt8, v, block), block);
  for (size_t i = 0; i < block; ++i) {
    EXPECT_TRUE(std::isnan(u[i])) << "element " << i;
  }
}

// Finite values whose range exceeds FLT_MAX: the int8 scale would be +Inf (and the block all
// NaN); it saturates instead, every element decodes to a finite value in order, and the
// minimum exactly.
TEST(Codec, Int8BlockWiderThanTheFloatRangeStaysFinite) {
  const std::vector<float> x = {-3e38f, 3e38f, 0.0f, 1.0f, -1e38f, 2e38f};
  const auto enc = encode(Compression::kInt8, x, x.size());
  EXPECT_EQ(readF32(enc, kPrefixBytes), -3e38f);
  EXPECT_EQ(readF32(enc, kPrefixBytes + 4), 0x1p120f) << "the largest scale that stays finite";
  const auto y = decode(Compression::kInt8, enc, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << "element " << i;
  }
  EXPECT_EQ(y[0], -3e38f);
  EXPECT_LE(y[4], y[2]);
  EXPECT_LE(y[2], y[3]);
  EXPECT_LE(y[3], y[5]);
  EXPECT_LE(y[5], y[1]);
  EXPECT_NEAR(y[4], -1e38f, 0x1p120f) << "in range: within half a step, plus rounding";
  // With error feedback the excess goes to a finite residual.
  std::vector<float> residual(x.size(), 0.0f);
  std::vector<uint8_t> out(compressedBytes(Compression::kInt8, x.size(), x.size()));
  EXPECT_EQ(compress(Compression::kInt8, x.data(), x.size(), x.size(), residual.data(), out.data()),
            0u);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(std::isfinite(residual[i])) << "element " << i;
  }
}

// The block's max at FLT_MAX: lo + 255 * scale rounded past it to +Inf, so a finite block decoded
// to Inf and left a -Inf residual, which turned the next finite step into a NaN block.
TEST(Codec, Int8BlockReachingFloatMaxDecodesFinite) {
  const float kMax = std::numeric_limits<float>::max();
  const std::vector<float> x = {1.3e37f, kMax};
  const auto y = decode(Compression::kInt8, encode(Compression::kInt8, x, 2), 2);
  EXPECT_TRUE(std::isfinite(y[0]));
  EXPECT_EQ(y[1], kMax);
  std::vector<float> residual(2, 0.0f);
  std::vector<uint8_t> out(compressedBytes(Compression::kInt8, 2, 2));
  EXPECT_EQ(compress(Compression::kInt8, x.data(), 2, 2, residual.data(), out.data()), 0u);
  EXPECT_TRUE(std::isfinite(residual[0]) && std::isfinite(residual[1]));
  const std::vector<float> zero = {0.0f, 0.0f};
  EXPECT_EQ(compress(Compression::kInt8, zero.data(), 2, 2, residual.data(), out.data()), 0u)
      << "the next finite step must not be an invalid block";
}

// A saturated block spanning [-FLT_MAX, FLT_MAX]: x - decoded overflowed, an Inf residual.
TEST(Codec, Int8ResidualOfABlockSpanningTheWholeFloatRangeStaysFinite) {
  const float kMax = std::numeric_limits<float>::max();
  const std::vector<float> x = {-kMax, kMax};
  std::vector<float> residual(2, 0.0f);
  std::vector<uint8_t> out(compressedBytes(Compression::kInt8, 2, 2));
  EXPECT_EQ(compress(Compression::kInt8, x.data(), 2, 2, residual.data(), out.data()), 0u);
  EXPECT_TRUE(std::isfinite(residual[0])) << residual[0];
  EXPECT_TRUE(std::isfinite(residual[1])) << residual[1];
  EXPECT_GT(residual[1], 0.0f) << "the excess, clamped, not dropped altogether";
}

// Bytes from a peer may carry a negative 1-bit scale: groups of 8 used |scale| with the sign from
// the bit and the tail used scale as it was, so one block decoded two ways.
TEST(Codec, OneBitNegativeScaleDecodesTheSameInEveryPartOfTheBlock) {
  std::vector<uint8_t> enc(compressedBytes(Compression::kOneBit, 9, 9));
  const uint32_t count = 9, block = 9;
  const float scale = -1.0f;
  std::memcpy(enc.data(), &count, 4);
  std::memcpy(enc.data() + 4, &block, 4);
  std::memcpy(enc.data() + 8, &scale, 4);
  enc[12] = 0xff;
  enc[13] = 0x01;
  const auto y = decode(Compression::kOneBit, enc, 9);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(y[i], y[0]) << "element " << i;
}

// A tiny but non-constant int8 block: the scale would be subnormal with an infinite inverse
// ((x - min) * inv = 0 * Inf = NaN for the minimum); it is kept at FLT_MIN.
TEST(Codec, Int8TinyRangeBlockDecodesNearTheInput) {
  const std::vector<float> x = {1e-40f, 2e-40f, 0.0f, 3e-40f};
  const auto y = decode(Compression::kInt8, encode(Compression::kInt8, x, x.size()), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << "element " << i;
    EXPECT_NEAR(y[i], x[i], std::numeric_limits<float>::min()) << "element " << i;
  }
  EXPECT_EQ(y[2], 0.0f);
}

// 1-bit: finite values whose sum of |x| overflows still get their mean |x| as the scale.
TEST(Codec, OneBitBlockWhoseSumOverflowsKeepsItsMeanMagnitude) {
  const std::vector<float> x = {3e38f, -3e38f, 3e38f, 3e38f, -3e38f, 3e38f, 3e38f, 3e38f};
  std::vector<float> residual(x.size(), 0.0f);
  std::vector<uint8_t> enc(compressedBytes(Compression::kOneBit, x.size(), x.size()));
  EXPECT_EQ(
      compress(Compression::kOneBit, x.data(), x.size(), x.size(), residual.data(), enc.data()),
      0u);
  const auto y = decode(Compression::kOneBit, enc, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_FLOAT_EQ(y[i], x[i]) << "element " << i;
    EXPECT_TRUE(std::isfinite(residual[i])) << "element " << i;
  }
}

TEST(Codec, ErrorFeedbackStoreKeepsOneResidualPerKey) {
  ErrorFeedback fb;
  float* a = fb.residual(1, 10);
  a[3] = 2.0f;
  EXPECT_EQ(fb.residual(1, 10)[3], 2.0f);
  EXPECT_EQ(fb.residual(2, 10)[3], 0.0f);
  EXPECT_EQ(fb.residual(1, 12)[3], 0.0f) << "a new size starts a fresh residual";
}

}  // namespace
}  // namespace cofab::compress

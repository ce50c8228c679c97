#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/half.h"

namespace cofab {
namespace {

TEST(DTypeTest, SizesNamesAndParsingRoundTrip) {
  const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
  int i = 0;
  for (DType t : kAllDTypes) {
    EXPECT_EQ(dtypeSize(t), sizes[i++]);
    auto parsed = parseDType(dtypeName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
    EXPECT_TRUE(isValidDType(static_cast<uint8_t>(t)));
  }
  EXPECT_EQ(*parseDType("bfloat16"), DType::kBF16);
  EXPECT_FALSE(isValidDType(0));
  EXPECT_FALSE(isValidDType(8));
  auto bad = parseDType("f8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'f8'"), std::string::npos);
}

// Every f16 bit pattern converts to float and back unchanged (NaNs stay NaN).
TEST(HalfTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(f))));
      continue;
    }
    ASSERT_EQ(floatToHalf(f), h) << "half 0x" << std::hex << h;
  }
}

// float -> f16 agrees with the compiler's own _Float16 conversion (round to nearest even),
// including subnormals, ties and overflow.
TEST(HalfTest, FloatToHalfMatchesCompilerConversion) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t u = bits(rng);
    // Concentrate half of the samples on the f16 range, where rounding matters.
    if (i % 2 == 0) u = (u & 0x807fffffu) | ((100u + (u >> 24) % 45u) << 23);
    float f = bitsFloat(u);
    if (std::isnan(f)) continue;
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t refBits;
    memcpy(&refBits, &ref, 2);
    ASSERT_EQ(floatToHalf(f), refBits) << "float bits 0x" << std::hex << u;
  }
}

TEST(HalfTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f)), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16ToFloat(floatToBf16(3.4e38f * 2))));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1e6f, 1e6f);
  for (int i = 0; i < 100000; ++i) {
    float f = d(rng);
    float back = bf16ToFloat(floatToBf16(f));
    EXPECT_LE(std::fabs(back - f), std::fabs(f) * (1.0f / 256)) << f;
  }
}

}  // namespace
}  // namespace cofab

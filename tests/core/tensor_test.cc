#include "core/tensor.h"

#include <gtest/gtest.h>

namespace cofab {
namespace {

TEST(TensorViewTest, BytesSliceAndValidation) {
  float data[10] = {};
  TensorView v(data, 10, DType::kF32);
  EXPECT_EQ(v.bytes(), 40u);
  TensorView s = v.slice(2, 3);
  EXPECT_EQ(s.as<float>(), data + 2);
  EXPECT_EQ(s.count, 3u);
  EXPECT_TRUE(v.validate("input").ok());
  TensorView null(nullptr, 4, DType::kF16);
  Status st = null.validate("output");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("output"), std::string::npos);
  EXPECT_TRUE(TensorView(nullptr, 0, DType::kF16).validate("empty").ok());
}

TEST(TensorViewTest, ShapeMismatchNamesBoth) {
  float a[4];
  double b[4];
  Status s = checkSameShape(TensorView(a, 4, DType::kF32), TensorView(b, 4, DType::kF64), "allreduce");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("f32[4]@cpu vs f64[4]@cpu"), std::string::npos) << s.message();
  EXPECT_EQ(Device::cuda(1).toString(), "cuda:1");
}

// Overlap is about shared bytes: an empty view shares none, even inside another one (it used
// to count as overlapping when it lay strictly inside).
TEST(TensorViewTest, OverlapCountsSharedBytesOnly) {
  float data[8] = {};
  TensorView all(data, 8, DType::kF32);
  EXPECT_TRUE(overlaps(all, TensorView(data + 7, 1, DType::kF32)));
  EXPECT_FALSE(overlaps(TensorView(data, 4, DType::kF32), TensorView(data + 4, 4, DType::kF32)));
  EXPECT_FALSE(overlaps(all, TensorView(data + 3, 0, DType::kF32)));
  EXPECT_FALSE(overlaps(TensorView(data + 3, 0, DType::kF32), all));
  EXPECT_TRUE(bytesOverlap(data, 32, data + 7, 1));
  EXPECT_FALSE(bytesOverlap(data, 28, data + 7, 4));
  // A saturated length (a size that overflowed) reaches the top of the address space.
  EXPECT_TRUE(bytesOverlap(data, SIZE_MAX, data + 7, 4));
  EXPECT_FALSE(bytesOverlap(data + 7, SIZE_MAX, data, 28));
}

}  // namespace
}  // namespace cofab

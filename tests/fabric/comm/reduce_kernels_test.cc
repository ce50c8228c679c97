// The vectorised reduction kernels against a scalar reference, element by element, for every
// dtype and op, lengths around the vector widths, aliasing, and f16/bf16 special values.
#include "fabric/comm/reduce_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.h"
#include "tests/fabric/comm/comm_test_util.h"

namespace cofab::comm {
namespace {

using testing::getElement;
using testing::makeBuffer;
using testing::setElement;

// The per-element definition the kernels implement: combine in the accumulation type (f32 for
// 16-bit floats), divide for the final avg step, round once to the dtype.
double scalar(DType dtype, ReduceOp op, int divisor, double a, double b) {
  const bool wide = dtype == DType::kF64 || dtype == DType::kI64 || dtype == DType::kI32;
  double r = 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: r = wide ? a + b : static_cast<double>(static_cast<float>(a) + static_cast<float>(b)); break;
    case ReduceOp::kMin: r = std::min(a, b); break;
    case ReduceOp::kMax: r = std::max(a, b); break;
  }
  if (op == ReduceOp::kAvg && divisor > 1) {
    if (dtype == DType::kI32 || dtype == DType::kI64) {
      r = static_cast<double>(static_cast<int64_t>(r) / divisor);
    } else if (dtype == DType::kF64) {
      r = r / divisor;
    } else {
      r = static_cast<double>(static_cast<float>(r) / static_cast<float>(divisor));
    }
  }
  return testing::roundTo(dtype, r);
}

TEST(ReduceKernels, MatchScalarReferenceForEveryDtypeOpAndLength) {
  for (DType dtype : testing::kReduceDTypes) {
    for (ReduceOp op : testing::kReduceOps) {
      for (int divisor : {1, 3}) {
        for (size_t n : {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 1000}) {
          auto a = makeBuffer(dtype, n), b = makeBuffer(dtype, n), d = makeBuffer(dtype, n);
          for (size_t i = 0; i < n; ++i) {
            setElement(dtype, a.data(), i, testing::inputValue(1, 0, i) * 100);
            setElement(dtype, b.data(), i, testing::inputValue(1, 1, i) * 100);
          }
          reduceFinal(dtype, op, divisor, d.data(), a.data(), b.data(), n);
          for (size_t i = 0; i < n; ++i) {
            const double want = scalar(dtype, op, divisor, getElement(dtype, a.data(), i),
                                       getElement(dtype, b.data(), i));
            ASSERT_EQ(getElement(dtype, d.data(), i), want)
                << dtypeName(dtype) << " " << reduceOpName(op) << " div " << divisor << " n "
                << n << " element " << i;
          }
          // In place (dst aliases a) gives the same bits.
          reduceFinal(dtype, op, divisor, a.data(), a.data(), b.data(), n);
          ASSERT_EQ(std::memcmp(a.data(), d.data(), n * dtypeSize(dtype)), 0);
        }
      }
    }
  }
}

TEST(ReduceKernels, IntegerSumsWrapAround) {
  int32_t a[2] = {std::numeric_limits<int32_t>::max(), -5};
  int32_t b[2] = {1, 2};
  int32_t d[2];
  reduce(DType::kI32, ReduceOp::kSum, d, a, b, 2);
  EXPECT_EQ(d[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(d[1], -3);
}

TEST(ReduceKernels, HalfSpecialValuesMatchThePortableConversions) {
  // Every f16 bit pattern against one fixed operand, through the (possibly F16C) kernel.
  std::vector<uint16_t> a(65536), b(65536), d(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    a[i] = static_cast<uint16_t>(i);
    b[i] = floatToHalf(0.5f);
  }
  reduce(DType::kF16, ReduceOp::kSum, d.data(), a.data(), b.data(), a.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t want = floatToHalf(halfToFloat(a[i]) + 0.5f);
    const bool bothNan = std::isnan(halfToFloat(want)) && std::isnan(halfToFloat(d[i]));
    ASSERT_TRUE(bothNan || want == d[i]) << "f16 pattern 0x" << std::hex << i;
  }
  std::vector<uint16_t> bf(65536), bd(65536), bz(65536, 0);
  for (uint32_t i = 0; i < 65536; ++i) bf[i] = static_cast<uint16_t>(i);
  reduce(DType::kBF16, ReduceOp::kSum, bd.data(), bf.data(), bz.data(), bf.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t want = floatToBf16(bf16ToFloat(bf[i]) + 0.0f);
    const bool bothNan = std::isnan(bf16ToFloat(want)) && std::isnan(bf16ToFloat(bd[i]));
    ASSERT_TRUE(bothNan || want == bd[i]) << "bf16 pattern 0x" << std::hex << i;
  }
}

// min and max give NaN wherever either operand is NaN, in the vector body and the tail alike
// (before, only a NaN in the first operand survived).
TEST(ReduceKernels, MinAndMaxPropagateANanFromEitherOperand) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      const size_t n = 37;  // past several 8- and 16-wide vectors, with a tail
      auto a = makeBuffer(dtype, n), b = makeBuffer(dtype, n), d = makeBuffer(dtype, n);
      for (size_t i = 0; i < n; ++i) {
        setElement(dtype, a.data(), i, i % 3 == 0 ? nan : 1.0 + static_cast<double>(i));
        setElement(dtype, b.data(), i, i % 3 == 1 ? nan : 2.0);
      }
      reduce(dtype, op, d.data(), a.data(), b.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const double got = getElement(dtype, d.data(), i);
        if (i % 3 != 2) {
          ASSERT_TRUE(std::isnan(got)) << dtypeName(dtype) << " " << reduceOpName(op)
                                       << " element " << i << " (NaN in "
                                       << (i % 3 == 0 ? "a" : "b") << ") is " << got;
        } else {
          const double x = 1.0 + static_cast<double>(i);
          const double want = testing::roundTo(
              dtype, op == ReduceOp::kMin ? std::min(testing::roundTo(dtype, x), 2.0)
                                          : std::max(testing::roundTo(dtype, x), 2.0));
          ASSERT_EQ(got, want) << dtypeName(dtype) << " " << reduceOpName(op) << " element " << i;
        }
      }
    }
  }
}

TEST(ReduceKernels, RejectsU8AndNamesTheIsa) {
  EXPECT_EQ(checkReducible(DType::kU8, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(checkReducible(DType::kBF16, ReduceOp::kMax).ok());
  EXPECT_FALSE(reduceIsa().empty());
  EXPECT_EQ(*parseReduceOp("avg"), ReduceOp::kAvg);
  EXPECT_FALSE(parseReduceOp("prod").ok());
}

}  // namespace
}  // namespace cofab::comm

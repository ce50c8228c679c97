// The CPU twins of the GPU kernels, against references written out here: reductions (f32, f16,
// bf16, sum and average, in place), XOR, GEMM and the FP64 linear combination; argument checks;
// and CUDA tensors without a usable GPU reporting Unavailable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/half.h"
#include "gpu/device.h"
#include "gpu/linear_combine.h"
#include "gpu/reduce.h"
#include "gpu/stream.h"
#include "gpu/xor.h"

namespace cofab::gpu {
namespace {

std::vector<float> randomFloats(size_t n, uint64_t seed, float lo = -4, float hi = 4) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(ReduceCpuTest, F32SumAndAverageMatchAnF32Accumulation) {
  const size_t n = 1001;
  std::vector<std::vector<float>> ins;
  for (int j = 0; j < 5; ++j) ins.push_back(randomFloats(n, j));
  std::vector<TensorView> views;
  for (auto& v : ins) views.push_back(TensorView::of(v.data(), n, DType::kF32));
  for (auto op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    std::vector<float> out(n);
    ASSERT_TRUE(
        reduce({.inputs = views, .output = TensorView::of(out.data(), n, DType::kF32), .op = op})
            .ok());
    for (size_t i = 0; i < n; ++i) {
      float acc = 0;
      for (auto& v : ins) acc += v[i];
      if (op == ReduceOp::kAverage) acc *= 1.0f / 5.0f;
      ASSERT_EQ(out[i], acc) << i;
    }
  }
}

TEST(ReduceCpuTest, HalfAndBfloatAccumulateInF32AndRoundOnce) {
  const size_t n = 513;
  for (DType t : {DType::kF16, DType::kBF16}) {
    auto toBits = [t](float f) { return t == DType::kF16 ? floatToHalf(f) : floatToBf16(f); };
    auto toFloat = [t](uint16_t h) { return t == DType::kF16 ? halfToFloat(h) : bf16ToFloat(h); };
    std::vector<std::vector<uint16_t>> ins(4, std::vector<uint16_t>(n));
    for (int j = 0; j < 4; ++j) {
      auto f = randomFloats(n, 10 + j);
      for (size_t i = 0; i < n; ++i) ins[j][i] = toBits(f[i]);
    }
    std::vector<TensorView> views;
    for (auto& v : ins) views.push_back(TensorView::of(v.data(), n, t));
    std::vector<uint16_t> out(n);
    ASSERT_TRUE(
        reduce(
            {.inputs = views, .output = TensorView::of(out.data(), n, t), .op = ReduceOp::kAverage})
            .ok());
    for (size_t i = 0; i < n; ++i) {
      float acc = 0;
      for (auto& v : ins) acc += toFloat(v[i]);
      ASSERT_EQ(out[i], toBits(acc * 0.25f)) << dtypeName(t) << " element " << i;
    }
    // In place: the output is input 0.
    std::vector<uint16_t> first = ins[0];
    ASSERT_TRUE(reduce({.inputs = views, .output = views[0]}).ok());
    for (size_t i = 0; i < n; ++i) {
      float acc = toFloat(first[i]);
      for (int j = 1; j < 4; ++j) acc += toFloat(ins[j][i]);
      ASSERT_EQ(ins[0][i], toBits(acc)) << i;
    }
  }
}

TEST(ReduceCpuTest, BadArguments) {
  std::vector<float> a(8), b(7);
  std::vector<int32_t> ints(8);
  TensorView va = TensorView::of(a.data(), 8, DType::kF32);
  std::vector<TensorView> one = {va};
  std::vector<TensorView> none;
  std::vector<TensorView> mismatched = {TensorView::of(b.data(), 7, DType::kF32)};
  std::vector<TensorView> intsView = {TensorView::of(ints.data(), 8, DType::kI32)};
  std::vector<TensorView> tooMany(65, va);
  EXPECT_EQ(reduce({.inputs = none, .output = va}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce({.inputs = mismatched, .output = va}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce({.inputs = intsView, .output = intsView[0]}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(reduce({.inputs = tooMany, .output = va}).code(), StatusCode::kInvalidArgument);
  std::vector<TensorView> nullIn = {TensorView(nullptr, 8, DType::kF32)};
  EXPECT_EQ(reduce({.inputs = nullIn, .output = va}).code(), StatusCode::kInvalidArgument);
  std::vector<TensorView> onGpu = {TensorView::of(a.data(), 8, DType::kF32, Device::cuda(0))};
  EXPECT_EQ(reduce({.inputs = onGpu, .output = va}).code(), StatusCode::kInvalidArgument)
      << "inputs and output on different devices";
  // An output one element past its input: refused, and nothing written (it used to give
  // {1, 1, 1, 1}, each result landing on the next input before it was read).
  std::vector<float> shifted = {1, 2, 3, 4, 5};
  std::vector<TensorView> head = {TensorView::of(shifted.data(), 4, DType::kF32)};
  auto s = reduce({.inputs = head, .output = TensorView::of(shifted.data() + 1, 4, DType::kF32)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(shifted, (std::vector<float>{1, 2, 3, 4, 5}));
  // In place is still fine.
  ASSERT_TRUE(reduce({.inputs = head, .output = head[0]}).ok());
}

TEST(XorCpuTest, MatchesBytewiseXorInPlaceAndUnaligned) {
  for (size_t bytes : {0, 1, 7, 8, 9, 100, 4096}) {
    for (size_t offset : {0, 3}) {
      std::vector<std::vector<uint8_t>> srcs(3, std::vector<uint8_t>(bytes + 8));
      std::mt19937 rng(bytes + offset);
      for (auto& s : srcs) {
        for (auto& x : s) x = static_cast<uint8_t>(rng());
      }
      std::vector<uint8_t> want(bytes);
      for (size_t i = 0; i < bytes; ++i)
        want[i] = srcs[0][offset + i] ^ srcs[1][offset + i] ^ srcs[2][offset + i];
      std::vector<const void*> ptrs = {srcs[0].data() + offset, srcs[1].data() + offset,
                                       srcs[2].data() + offset};
      // dst = source 0: in place.
      ASSERT_TRUE(xorBuffers({.srcs = ptrs, .dst = srcs[0].data() + offset, .bytes = bytes}).ok());
      ASSERT_EQ(std::vector<uint8_t>(srcs[0].begin() + offset, srcs[0].begin() + offset + bytes),
                want);
    }
  }
  std::vector<const void*> none;
  uint8_t x = 0;
  EXPECT_EQ(xorBuffers({.srcs = none, .dst = &x, .bytes = 1}).code(), StatusCode::kInvalidArgument);
  // dst straddling a source is refused, and nothing written.
  std::vector<uint8_t> buf = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<uint8_t> before = buf;
  std::vector<const void*> src = {buf.data()};
  EXPECT_EQ(xorBuffers({.srcs = src, .dst = buf.data() + 1, .bytes = 8}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(buf, before);
}

TEST(BlasCpuTest, GemmAndLinearCombineMatchFp64References) {
  const int64_t m = 13, k = 17, n = 11;
  auto a = randomFloats(m * k, 1), b = randomFloats(k * n, 2);
  std::vector<float> c(m * n);
  ASSERT_TRUE(gemmF32({.a = a.data(), .b = b.data(), .c = c.data(), .m = m, .n = n, .k = k}).ok());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t) s += double(a[i * k + t]) * b[t * n + j];
      ASSERT_NEAR(c[i * n + j], s, 1e-4 * (1 + std::fabs(s)));
    }
  }
  const size_t e = 257;
  std::vector<std::vector<float>> ins;
  for (int j = 0; j < 3; ++j) ins.push_back(randomFloats(e, 20 + j));
  std::vector<double> coeffs = {0.5, -1.25, 3.0, 1e-3, 2.0, -0.75};
  std::vector<std::vector<float>> outs(2, std::vector<float>(e));
  std::vector<const float*> inPtrs = {ins[0].data(), ins[1].data(), ins[2].data()};
  std::vector<float*> outPtrs = {outs[0].data(), outs[1].data()};
  ASSERT_TRUE(
      linearCombine({.coeffs = coeffs, .inputs = inPtrs, .outputs = outPtrs, .elements = e}).ok());
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < e; ++i) {
      double s = 0;
      for (int j = 0; j < 3; ++j) s += coeffs[r * 3 + j] * double(ins[j][i]);
      ASSERT_EQ(outs[r][i], static_cast<float>(s)) << "FP64 accumulation, one rounding";
    }
  }
  std::vector<double> wrong(5);
  EXPECT_EQ(
      linearCombine({.coeffs = wrong, .inputs = inPtrs, .outputs = outPtrs, .elements = e}).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(gemmF32({.a = a.data(), .b = nullptr, .c = c.data(), .m = m, .n = n, .k = k}).code(),
            StatusCode::kInvalidArgument);
}

// BLAS writes C in blocks while still reading A and B, so C = A x C returned garbage with OK
// (OpenBLAS here, cuBLAS alike). C may share no byte with A or B, and no two outputs of
// linearCombine may overlap; an output over an input stays allowed (inputs are read first).
TEST(BlasCpuTest, AnOutputOverlappingWhatItIsComputedFromIsRefused) {
  const int64_t n = 64;
  auto a = randomFloats(n * n, 1), x = randomFloats(n * n, 2);
  const std::vector<float> before = x;
  for (auto [b, c] : {std::pair{x.data(), x.data()}, {x.data(), x.data() + n}}) {
    Status st = gemmF32({.a = a.data(), .b = b, .c = c, .m = n, .n = n, .k = n});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("C overlaps B"), std::string::npos) << st;
  }
  // C (2 x 1) at A's second element: A is 2 x n there, B n x 1.
  Status overA = gemmF32({.a = x.data(), .b = a.data(), .c = x.data() + 1, .m = 2, .n = 1, .k = n});
  EXPECT_NE(overA.message().find("C overlaps A"), std::string::npos) << overA;
  EXPECT_EQ(overA.code(), StatusCode::kInvalidArgument) << overA;
  EXPECT_EQ(x, before) << "nothing may be written";
  // Adjacent but disjoint: A is rows 0..n-1 of one buffer, C row n.
  std::vector<float> ac(n * n + n, 1.0f), b(n * n, 1.0f);
  ASSERT_TRUE(
      gemmF32({.a = ac.data(), .b = b.data(), .c = ac.data() + n * n, .m = 1, .n = n, .k = n})
          .ok());
  EXPECT_EQ(ac[n * n], static_cast<float>(n));

  const size_t e = 100;
  std::vector<float> in(e, 1.0f), shared(e + 10, 0.0f);
  std::vector<const float*> ins = {in.data()};
  std::vector<double> coeffs = {2.0, 3.0};
  std::vector<float*> clash = {shared.data(), shared.data() + 10};
  Status combine =
      linearCombine({.coeffs = coeffs, .inputs = ins, .outputs = clash, .elements = e});
  EXPECT_EQ(combine.code(), StatusCode::kInvalidArgument) << combine;
  EXPECT_NE(combine.message().find("outputs 0 and 1 overlap"), std::string::npos) << combine;
  std::vector<float*> overInput = {in.data(), shared.data()};
  ASSERT_TRUE(
      linearCombine({.coeffs = coeffs, .inputs = ins, .outputs = overInput, .elements = e}).ok());
  EXPECT_EQ(in[0], 2.0f);
  EXPECT_EQ(shared[0], 3.0f);
}

// BLAS takes 32-bit leading dimensions. A larger one used to be truncated on the CPU path
// (2^32 + 1 becomes 1, below the row length), OpenBLAS's xerbla rejected it and returned without
// computing, and gemmF32 said OK on an untouched C. Every matrix here has one row, so a leading
// dimension is never used to reach a second one: only the first row's bytes could be touched.
TEST(BlasCpuTest, GemmRejectsLeadingDimensionsBeyondInt32) {
  const int64_t huge = (int64_t{1} << 32) + 1;
  std::vector<float> a = {1, 2}, b = {1, 2, 3, 4, 5, 6}, c = {-7, -7, -7};
  const std::vector<float> before = c;
  const GemmArgs cases[] = {
      // A 1x2, B 2x3, C 1x3
      {.a = a.data(), .b = b.data(), .c = c.data(), .m = 1, .n = 3, .k = 2, .lda = huge},
      // A 1x1, B 1x3, C 1x3
      {.a = a.data(), .b = b.data(), .c = c.data(), .m = 1, .n = 3, .k = 1, .ldb = huge},
      // A 1x2, B 2x3, C 1x3
      {.a = a.data(), .b = b.data(), .c = c.data(), .m = 1, .n = 3, .k = 2, .ldc = huge},
  };
  const char* const names[] = {"lda", "ldb", "ldc"};
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    Status st = gemmF32(cases[i]);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(names[i]), std::string::npos) << st;
    Status twin = gemmF32Cpu(cases[i]);
    EXPECT_EQ(twin.code(), StatusCode::kInvalidArgument) << twin;
    EXPECT_EQ(c, before) << "C must be untouched";
  }
  // The same product with dense leading dimensions: C = [9, 12, 15].
  ASSERT_TRUE(gemmF32({.a = a.data(), .b = b.data(), .c = c.data(), .m = 1, .n = 3, .k = 2}).ok());
  EXPECT_EQ(c, (std::vector<float>{9, 12, 15}));
}

TEST(GpuAvailabilityTest, CudaTensorsWithoutAGpuAreUnavailable) {
  auto count = deviceCount();
  if (count.ok()) GTEST_SKIP() << "a GPU is present: covered by gpu_kernel_tests";
  float x = 1;
  std::vector<TensorView> in = {TensorView::of(&x, 1, DType::kF32, Device::cuda(0))};
  Status st = reduce({.inputs = in, .output = in[0]});
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_EQ(Stream::create(0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(DeviceBuffer::allocate(64, 0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(DeviceBuffer::allocateOn(64, Stream::borrow(nullptr, 0)).status().code(),
            StatusCode::kUnavailable);
}

TEST(GpuAvailabilityTest, BorrowedHandlesAreNotOwned) {
  int dummy = 0;
  DeviceBuffer b = DeviceBuffer::borrow(&dummy, 4, 0);
  EXPECT_FALSE(b.owned());
  DeviceBuffer moved = std::move(b);
  EXPECT_EQ(moved.data(), &dummy);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT: moved-from is empty by contract
  Stream s = Stream::borrow(nullptr, 0);
  EXPECT_FALSE(s.owned());
}

}  // namespace
}  // namespace cofab::gpu

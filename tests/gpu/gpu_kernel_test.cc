// The CUDA kernels against their CPU twins, on a real GPU: bit-identical reductions and XOR (same
// per-element functors), GEMM and FP64 combination within rounding, TF32 really off, and a coded
// matmul run on the device matching the CPU CodedMatmul. Skips, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <thread>

#include "coding/matmul/coded_matmul.h"
#include "core/config.h"
#include "core/half.h"
#include "gpu/device.h"
#include "gpu/linear_combine.h"
#include "gpu/reduce.h"
#include "gpu/stream.h"
#include "gpu/xor.h"

#if COFAB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cofab::gpu {
namespace {

using coding::TaskResult;

class GpuKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto count = deviceCount();
    if (!count.ok()) GTEST_SKIP() << count.status().message();
    auto s = Stream::create(0);
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::make_unique<Stream>(std::move(s).value());
  }

  // Copies host bytes to a new device buffer.
  DeviceBuffer upload(const void* src, size_t bytes) {
    auto b = DeviceBuffer::allocate(bytes, 0);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->copyFromHost(src, bytes, *stream_).ok());
    EXPECT_TRUE(stream_->synchronize().ok());
    return std::move(b).value();
  }
  template <typename T>
  std::vector<T> download(const DeviceBuffer& b, size_t count) {
    std::vector<T> out(count);
    EXPECT_TRUE(b.copyToHost(out.data(), count * sizeof(T), *stream_).ok());
    EXPECT_TRUE(stream_->synchronize().ok());
    return out;
  }

  std::unique_ptr<Stream> stream_;
};

std::vector<float> randomFloats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// ||got - want|| / ||want|| (Frobenius), accumulated in FP64.
double relativeError(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// Three inputs of n random elements of type t, as bytes.
std::vector<std::vector<uint8_t>> randomTensors(DType t, size_t n) {
  const size_t es = dtypeSize(t);
  std::vector<std::vector<uint8_t>> host(3, std::vector<uint8_t>(n * es));
  for (int j = 0; j < 3; ++j) {
    auto f = randomFloats(n, 5 + j);
    for (size_t i = 0; i < n; ++i) {
      if (t == DType::kF32) {
        std::memcpy(&host[j][i * 4], &f[i], 4);
      } else {
        uint16_t h = t == DType::kF16 ? floatToHalf(f[i]) : floatToBf16(f[i]);
        std::memcpy(&host[j][i * 2], &h, 2);
      }
    }
  }
  return host;
}

// Where the reduction runs on the device: `offset` elements into each buffer (1 leaves 16-byte
// alignment, so the scalar kernel does everything), and into a separate output or in place.
struct ReducePlacement {
  size_t offset = 0;
  bool inPlace = false;
};

class GpuReduceTest : public GpuKernelTest {
 protected:
  void expectBitIdentical(DType t, ReduceOp op, ReducePlacement where) {
    const size_t n = 100003;  // not a multiple of any vector width: the scalar kernel ends it
    const size_t es = dtypeSize(t);
    auto host = randomTensors(t, n);
    std::vector<TensorView> cpuIn, gpuIn;
    std::vector<DeviceBuffer> dev;
    for (auto& h : host) {
      cpuIn.emplace_back(h.data(), n, t);
      auto b = DeviceBuffer::allocate((n + where.offset) * es, 0);
      ASSERT_TRUE(b.ok()) << b.status();
      auto* at = static_cast<uint8_t*>(b->data()) + where.offset * es;
      ASSERT_TRUE(
          DeviceBuffer::borrow(at, n * es, 0).copyFromHost(h.data(), n * es, *stream_).ok());
      dev.push_back(std::move(b).value());
      gpuIn.emplace_back(at, n, t, Device::cuda(0));
    }
    std::vector<uint8_t> cpuOut(n * es);
    ASSERT_TRUE(
        reduce({.inputs = cpuIn, .output = TensorView(cpuOut.data(), n, t), .op = op}).ok());
    auto out = DeviceBuffer::allocate((n + where.offset) * es, 0);
    ASSERT_TRUE(out.ok());
    void* outAt =
        where.inPlace ? gpuIn[0].data : static_cast<uint8_t*>(out->data()) + where.offset * es;
    Status st = reduce({.inputs = gpuIn,
                        .output = TensorView(outAt, n, t, Device::cuda(0)),
                        .op = op,
                        .stream = stream_->handle()});
    ASSERT_TRUE(st.ok()) << st;
    std::vector<uint8_t> got(n * es);
    ASSERT_TRUE(
        DeviceBuffer::borrow(outAt, n * es, 0).copyToHost(got.data(), got.size(), *stream_).ok());
    ASSERT_TRUE(stream_->synchronize().ok());
    EXPECT_EQ(got, cpuOut) << dtypeName(t) << " offset " << where.offset
                           << (where.inPlace ? " in place" : "");
  }
};

TEST_F(GpuReduceTest, ReductionsAreBitIdenticalToTheCpuTwin) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAverage}) expectBitIdentical(t, op, {});
  }
}

// The vector kernel needs every pointer 16-byte aligned; otherwise the scalar one does it all.
// In place, the output overwrites input 0 lane by lane after reading it: still the same bits.
TEST_F(GpuReduceTest, UnalignedAndInPlaceReductionsAreBitIdenticalToo) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    expectBitIdentical(t, ReduceOp::kSum, {.offset = 1});
    expectBitIdentical(t, ReduceOp::kAverage, {.offset = 1, .inPlace = true});
    expectBitIdentical(t, ReduceOp::kSum, {.inPlace = true});
  }
}

TEST_F(GpuKernelTest, XorMatchesTheCpuTwin) {
  const size_t bytes = 65543;  // odd: the byte kernel finishes after the word kernel
  std::vector<std::vector<uint8_t>> host(4, std::vector<uint8_t>(bytes));
  std::mt19937 rng(1);
  for (auto& h : host) {
    for (auto& b : h) b = static_cast<uint8_t>(rng());
  }
  std::vector<DeviceBuffer> dev;
  std::vector<const void*> gpuSrcs, cpuSrcs;
  for (auto& h : host) {
    dev.push_back(upload(h.data(), bytes));
    gpuSrcs.push_back(dev.back().data());
    cpuSrcs.push_back(h.data());
  }
  std::vector<uint8_t> want(bytes);
  ASSERT_TRUE(xorBuffers({.srcs = cpuSrcs, .dst = want.data(), .bytes = bytes}).ok());
  auto out = DeviceBuffer::allocate(bytes, 0);
  ASSERT_TRUE(xorBuffers({.srcs = gpuSrcs,
                          .dst = out->data(),
                          .bytes = bytes,
                          .device = Device::cuda(0),
                          .stream = stream_->handle()})
                  .ok());
  EXPECT_EQ(download<uint8_t>(*out, bytes), want);
}

TEST_F(GpuKernelTest, GemmHasNoTf32Error) {
  // TF32 keeps 10 mantissa bits: relative errors ~1e-3 on these products. FP32 gives ~1e-6.
  const int64_t m = 64, k = 512, n = 48;
  auto a = randomFloats(m * k, 1), b = randomFloats(k * n, 2);
  std::vector<float> cpu(m * n);
  ASSERT_TRUE(
      gemmF32({.a = a.data(), .b = b.data(), .c = cpu.data(), .m = m, .n = n, .k = k}).ok());
  DeviceBuffer da = upload(a.data(), a.size() * 4), db = upload(b.data(), b.size() * 4);
  auto dc = DeviceBuffer::allocate(m * n * 4, 0);
  Status st = gemmF32({.a = static_cast<float*>(da.data()),
                       .b = static_cast<float*>(db.data()),
                       .c = static_cast<float*>(dc->data()),
                       .m = m,
                       .n = n,
                       .k = k,
                       .device = Device::cuda(0),
                       .stream = stream_->handle()});
  ASSERT_TRUE(st.ok()) << st;
  auto gpu = download<float>(*dc, m * n);
  EXPECT_LT(relativeError(gpu, cpu), 1e-5);
}

// A host buffer labelled as a CUDA tensor is refused before any kernel runs: a kernel reading it
// would fault, and a device fault loses the process's CUDA context for every later call. (Where
// the GPU can read pageable memory, HMM or ATS, the call is allowed and must then be right.)
TEST_F(GpuKernelTest, HostMemoryLabelledAsCudaIsRefusedAndTheContextSurvives) {
  const size_t n = 4096;
  std::vector<float> hostA(n, 1.5f), hostB(n, 2.0f), hostOut(n, 0.0f);
  auto out = DeviceBuffer::allocate(n * 4, 0);
  ASSERT_TRUE(out.ok());
  std::vector<TensorView> in = {TensorView::of(hostA.data(), n, DType::kF32, Device::cuda(0)),
                                TensorView::of(hostB.data(), n, DType::kF32, Device::cuda(0))};
  Status st = reduce({.inputs = in,
                      .output = TensorView(out->data(), n, DType::kF32, Device::cuda(0)),
                      .stream = stream_->handle()});
  if (st.ok()) {
    auto got = download<float>(*out, n);
    EXPECT_EQ(got, std::vector<float>(n, 3.5f))
        << "the GPU read pageable memory: sum must be right";
  } else {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("reduce input 0 is host memory"), std::string::npos) << st;
    Status g = gemmF32({.a = hostA.data(),
                        .b = static_cast<float*>(out->data()) + 1,  // not C: that is refused too
                        .c = static_cast<float*>(out->data()),
                        .m = 1,
                        .n = 1,
                        .k = 1,
                        .device = Device::cuda(0),
                        .stream = stream_->handle()});
    EXPECT_EQ(g.code(), StatusCode::kInvalidArgument) << g;
    EXPECT_NE(g.message().find("gemm A"), std::string::npos) << g;
    const void* src = out->data();
    Status x = xorBuffers({.srcs = std::span<const void* const>(&src, 1),
                           .dst = hostOut.data(),
                           .bytes = n * 4,
                           .device = Device::cuda(0),
                           .stream = stream_->handle()});
    EXPECT_EQ(x.code(), StatusCode::kInvalidArgument) << x;
    EXPECT_NE(x.message().find("xor dst"), std::string::npos) << x;
  }
  // Nothing faulted: the same device still computes.
  DeviceBuffer a = upload(hostA.data(), n * 4), b = upload(hostB.data(), n * 4);
  std::vector<TensorView> dev = {TensorView(a.data(), n, DType::kF32, Device::cuda(0)),
                                 TensorView(b.data(), n, DType::kF32, Device::cuda(0))};
  ASSERT_TRUE(reduce({.inputs = dev,
                      .output = TensorView(out->data(), n, DType::kF32, Device::cuda(0)),
                      .stream = stream_->handle()})
                  .ok());
  EXPECT_EQ(download<float>(*out, n), std::vector<float>(n, 3.5f));
}

// allocateOn's buffers go back to the pool in stream order: destroyed while the work that writes
// and reads them is still queued, they stay valid for it (memcheck would see a use after free),
// and a buffer taken again right after may reuse the memory without disturbing that work.
TEST_F(GpuKernelTest, StreamOrderedBuffersOutliveTheWorkQueuedBeforeTheirRelease) {
  const size_t n = 1 << 20;
  std::vector<float> a(n, 1.25f), b(n, 2.5f), got(n, 0.0f);
  auto out = DeviceBuffer::allocate(n * 4, 0);
  ASSERT_TRUE(out.ok());
  for (int round = 0; round < 3; ++round) {
    auto da = DeviceBuffer::allocateOn(n * 4, *stream_);
    auto db = DeviceBuffer::allocateOn(n * 4, *stream_);
    ASSERT_TRUE(da.ok() && db.ok()) << da.status() << db.status();
    EXPECT_TRUE(da->owned());
    ASSERT_TRUE(da->copyFromHost(a.data(), n * 4, *stream_).ok());
    ASSERT_TRUE(db->copyFromHost(b.data(), n * 4, *stream_).ok());
    std::vector<TensorView> in = {TensorView(da->data(), n, DType::kF32, Device::cuda(0)),
                                  TensorView(db->data(), n, DType::kF32, Device::cuda(0))};
    ASSERT_TRUE(reduce({.inputs = in,
                        .output = TensorView(out->data(), n, DType::kF32, Device::cuda(0)),
                        .stream = stream_->handle()})
                    .ok());
    // da and db are released here, before the stream has run the copies and the reduction.
  }
  ASSERT_TRUE(out->copyToHost(got.data(), n * 4, *stream_).ok());
  ASSERT_TRUE(stream_->synchronize().ok());
  EXPECT_EQ(got, std::vector<float>(n, 3.75f));
}

// A device index past the machine's GPUs is the caller's mistake: InvalidArgument saying how
// many there are, from every entry point that takes one.
TEST_F(GpuKernelTest, ADeviceIndexPastTheGpusIsInvalidAndSaysHowManyThereAre) {
  const int count = *deviceCount();
  const std::string many = std::to_string(count) + " CUDA device(s)";
  auto buf = DeviceBuffer::allocate(64, count);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), StatusCode::kInvalidArgument) << buf.status();
  EXPECT_NE(buf.status().message().find(many), std::string::npos) << buf.status();
  auto s = Stream::create(count);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
  auto negative = Stream::create(-1);
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument) << negative.status();
  EXPECT_NE(negative.status().message().find(many), std::string::npos) << negative.status();
  float x = 0;
  std::vector<TensorView> in = {TensorView::of(&x, 1, DType::kF32, Device::cuda(count))};
  Status st = reduce({.inputs = in, .output = in[0]});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(many), std::string::npos) << st;
  // The refusals leave nothing behind: the next kernel launch on a real device is not blamed for
  // them (CUDA keeps the last error per thread until someone reads it).
  std::vector<float> ones(1024, 1.0f);
  DeviceBuffer d = upload(ones.data(), ones.size() * 4);
  std::vector<TensorView> good = {TensorView(d.data(), ones.size(), DType::kF32, Device::cuda(0))};
  Status ok = reduce({.inputs = good, .output = good[0], .stream = stream_->handle()});
  EXPECT_TRUE(ok.ok()) << ok;
}

// An error the application left unread on the thread (a failed CUDA call of its own that it
// ignored) is not blamed on cofab's launches: reduce, XOR and linearCombine used to check their
// launches with cudaGetLastError, got that error, and failed although their kernels were queued
// and went on to write the output.
TEST_F(GpuKernelTest, AnErrorTheCallerLeftUnreadIsNotBlamedOnTheLaunch) {
#if COFAB_HAVE_CUDA
  const int count = *deviceCount();
  const auto leaveAnErrorUnread = [&] {
    (void)cudaSetDevice(count);  // no such device: the error stays on the thread
    ASSERT_NE(cudaPeekAtLastError(), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  };
  const size_t n = 1000;
  std::vector<float> ones(n, 1.0f);
  DeviceBuffer d = upload(ones.data(), n * 4);
  std::vector<TensorView> twice = {TensorView(d.data(), n, DType::kF32, Device::cuda(0)),
                                   TensorView(d.data(), n, DType::kF32, Device::cuda(0))};
  leaveAnErrorUnread();
  Status st = reduce({.inputs = twice, .output = twice[0], .stream = stream_->handle()});
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(download<float>(d, n), std::vector<float>(n, 2.0f));

  DeviceBuffer x = upload(ones.data(), n * 4);
  const void* src = d.data();
  leaveAnErrorUnread();
  st = xorBuffers({.srcs = std::span<const void* const>(&src, 1),
                   .dst = x.data(),
                   .bytes = n * 4,
                   .device = Device::cuda(0),
                   .stream = stream_->handle()});
  ASSERT_TRUE(st.ok()) << st;

  auto out = DeviceBuffer::allocate(n * 4, 0);
  ASSERT_TRUE(out.ok());
  const float* in = static_cast<const float*>(d.data());
  float* o = static_cast<float*>(out->data());
  const double coeff = 3.0;
  leaveAnErrorUnread();
  st = linearCombine({.coeffs = std::span(&coeff, 1),
                      .inputs = std::span(&in, 1),
                      .outputs = std::span(&o, 1),
                      .elements = n,
                      .device = Device::cuda(0),
                      .stream = stream_->handle()});
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(download<float>(*out, n), std::vector<float>(n, 6.0f));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Each thread keeps its own cuBLAS handle (gpu/cuda/blas_kernels.cu): four threads, each on its
// own stream, run GEMMs at once, again and again, and every product matches the CPU's.
TEST_F(GpuKernelTest, GemmsFromSeveralThreadsAtOnceAreAllRight) {
  const int64_t m = 96, k = 128, n = 80;
  std::vector<std::thread> threads;
  std::atomic<int> checked{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto s = Stream::create(0);
      ASSERT_TRUE(s.ok()) << s.status();
      for (int round = 0; round < 5; ++round) {
        auto a = randomFloats(m * k, 100 * t + round), b = randomFloats(k * n, 7 + round);
        std::vector<float> cpu(m * n), gpu(m * n);
        ASSERT_TRUE(
            gemmF32({.a = a.data(), .b = b.data(), .c = cpu.data(), .m = m, .n = n, .k = k}).ok());
        auto da = DeviceBuffer::allocate(a.size() * 4, 0),
             db = DeviceBuffer::allocate(b.size() * 4, 0),
             dc = DeviceBuffer::allocate(gpu.size() * 4, 0);
        ASSERT_TRUE(da.ok() && db.ok() && dc.ok());
        ASSERT_TRUE(da->copyFromHost(a.data(), a.size() * 4, *s).ok());
        ASSERT_TRUE(db->copyFromHost(b.data(), b.size() * 4, *s).ok());
        Status st = gemmF32({.a = static_cast<float*>(da->data()),
                             .b = static_cast<float*>(db->data()),
                             .c = static_cast<float*>(dc->data()),
                             .m = m,
                             .n = n,
                             .k = k,
                             .device = Device::cuda(0),
                             .stream = s->handle()});
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_TRUE(dc->copyToHost(gpu.data(), gpu.size() * 4, *s).ok());
        ASSERT_TRUE(s->synchronize().ok());
        EXPECT_LT(relativeError(gpu, cpu), 1e-5) << "thread " << t << " round " << round;
        ++checked;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(checked.load(), 20);
}

TEST_F(GpuKernelTest, CodedMatmulOnTheDeviceMatchesTheCpu) {
  auto cm = coding::CodedMatmul::create({.n = 8, .k = 6});
  ASSERT_TRUE(cm.ok());
  const int64_t rows = 120, inner = 64, cols = 40;
  auto a = randomFloats(rows * inner, 3), b = randomFloats(inner * cols, 4);
  auto enc = cm->encode({a.data(), rows, inner, 0});  // the host encoding, for comparison
  ASSERT_TRUE(enc.ok());
  const int64_t br = enc->blockRows();
  const size_t blockElems = static_cast<size_t>(br * inner);
  // Encode on the device: parity (2 x blockElems) = P (2 x 6) x systematic blocks (6 x blockElems).
  DeviceBuffer dblocks = upload(enc->block(0).data, 8 * blockElems * 4);
  auto* blocks = static_cast<float*>(dblocks.data());
  Status enc2 = cm->encodeParity(blocks, blockElems, Device::cuda(0), stream_->handle());
  ASSERT_TRUE(enc2.ok()) << enc2;
  auto parity = download<float>(dblocks, 8 * blockElems);
  for (size_t i = 6 * blockElems; i < 8 * blockElems; ++i) {
    ASSERT_NEAR(parity[i], enc->block(0).data[i], 1e-5f * (1 + std::fabs(parity[i]))) << i;
  }
  DeviceBuffer db = upload(b.data(), b.size() * 4);
  std::vector<DeviceBuffer> outs;
  for (int t = 0; t < 8; ++t) {
    auto out = DeviceBuffer::allocate(br * cols * 4, 0);
    ASSERT_TRUE(gemmF32({.a = blocks + t * blockElems,
                         .b = static_cast<float*>(db.data()),
                         .c = static_cast<float*>(out->data()),
                         .m = br,
                         .n = cols,
                         .k = inner,
                         .device = Device::cuda(0),
                         .stream = stream_->handle()})
                    .ok());
    outs.push_back(std::move(out).value());
  }
  ASSERT_TRUE(stream_->synchronize().ok());
  // Tasks 0 and 3 straggle: decode blocks 0 and 3 from tasks {1, 2, 4, 5, 6, 7} on the device.
  std::vector<int> used = {1, 2, 4, 5, 6, 7}, missing = {0, 3};
  std::vector<TaskResult> in;
  for (int t : used) in.push_back({t, static_cast<const float*>(outs[t].data())});
  std::vector<DeviceBuffer> rebuilt;
  std::vector<float*> outPtrs;
  for (int i = 0; i < 2; ++i) {
    rebuilt.push_back(std::move(DeviceBuffer::allocate(br * cols * 4, 0)).value());
    outPtrs.push_back(static_cast<float*>(rebuilt.back().data()));
  }
  Status st = cm->decodeBlocks(in, missing, outPtrs, static_cast<size_t>(br * cols),
                               Device::cuda(0), stream_->handle());
  ASSERT_TRUE(st.ok()) << st;
  std::vector<float> want(rows * cols);
  ASSERT_TRUE(coding::gemmF32({a.data(), rows, inner, 0}, {b.data(), inner, cols, 0},
                              {want.data(), rows, cols, 0})
                  .ok());
  for (int i = 0; i < 2; ++i) {
    auto got = download<float>(rebuilt[i], br * cols);
    const std::span<const float> block(want.data() + missing[i] * br * cols, br * cols);
    EXPECT_LT(relativeError(got, block), 1e-4) << "block " << missing[i];
  }
}

// encode / decode with a device (what the coded task service's master calls with device=gpu):
// host in, host out, staged through device memory. Equal to the host path within fp32 rounding.
TEST_F(GpuKernelTest, CodedMatmulHostStagedEncodeAndDecodeMatchTheCpu) {
  auto cm = coding::CodedMatmul::create({.n = 5, .k = 3});
  ASSERT_TRUE(cm.ok());
  const int64_t rows = 50, inner = 24, cols = 9;
  auto a = randomFloats(rows * inner, 5), b = randomFloats(inner * cols, 6);
  auto host = cm->encode({a.data(), rows, inner, 0});
  auto dev = cm->encode({a.data(), rows, inner, 0}, Device::cuda(0), stream_->handle());
  ASSERT_TRUE(host.ok() && dev.ok()) << dev.status();
  const int64_t br = host->blockRows();
  for (int t = 0; t < 5; ++t) {
    for (int64_t i = 0; i < br * inner; ++i) {
      const float h = host->block(t).data[i], d = dev->block(t).data[i];
      if (t < 3) {
        ASSERT_EQ(d, h) << "systematic block " << t << " element " << i;
      }
      ASSERT_NEAR(d, h, 1e-5f * (1 + std::fabs(h))) << "block " << t << " element " << i;
    }
  }
  // Tasks 0 and 2 straggle: blocks 0 and 2 decoded from tasks 1, 3 and 4.
  std::vector<std::vector<float>> outs(5, std::vector<float>(br * cols));
  std::vector<TaskResult> in;
  for (int t : {1, 3, 4}) {
    ASSERT_TRUE(
        cm->multiplyTask(*host, t, {b.data(), inner, cols, 0}, {outs[t].data(), br, cols, 0}).ok());
    in.push_back({t, outs[t].data()});
  }
  std::vector<float> cHost(rows * cols), cDev(rows * cols);
  auto dh = cm->decode(*host, in, cols, {cHost.data(), rows, cols, 0});
  auto dd =
      cm->decode(*host, in, cols, {cDev.data(), rows, cols, 0}, Device::cuda(0), stream_->handle());
  ASSERT_TRUE(dh.ok() && dd.ok()) << dd.status();
  EXPECT_TRUE(dd->decoded);
  double scale = 0;
  for (float x : cHost) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < cHost.size(); ++i) {
    ASSERT_NEAR(cDev[i], cHost[i], 1e-5 * scale) << "element " << i;
  }
}

}  // namespace
}  // namespace cofab::gpu

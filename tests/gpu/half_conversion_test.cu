// core/half.h converts with the GPU's instructions on a device and with portable code on the
// host (the CPU twins). The reductions are only bit-identical across the two if the two agree on
// every value: checked here on the device for all 65536 f16 values and all 2^32 f32 values
// (about a second on an H100). Skips, with the reason, without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "core/half.h"

namespace cofab {
namespace {

struct Mismatches {
  unsigned long long count;
  uint32_t first;  // one input that differed (any of them, when several did)
};

__global__ void compareHalfToFloat(Mismatches* m) {
  const uint32_t h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h > 0xffffu) return;
  const uint16_t in = static_cast<uint16_t>(h);
  if (floatBits(halfToFloat(in)) != floatBits(halfToFloatPortable(in))) {
    atomicAdd(&m->count, 1ull);
    m->first = h;
  }
}

__global__ void compareFloatToHalf(Mismatches* m) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       u <= 0xffffffffull; u += stride) {
    const float f = bitsFloat(static_cast<uint32_t>(u));
    if (floatToHalf(f) != floatToHalfPortable(f)) {
      atomicAdd(&m->count, 1ull);
      m->first = static_cast<uint32_t>(u);
    }
  }
}

class HalfConversionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no GPU: cudaGetDeviceCount returned " << static_cast<int>(e) << " ("
                   << cudaGetErrorString(e) << "), " << n << " device(s)";
    }
    ASSERT_EQ(cudaMalloc(&m_, sizeof(Mismatches)), cudaSuccess);
    ASSERT_EQ(cudaMemset(m_, 0, sizeof(Mismatches)), cudaSuccess);
  }
  void TearDown() override {
    if (m_ != nullptr) cudaFree(m_);
  }
  Mismatches result() {
    Mismatches host{};
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&host, m_, sizeof(host), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  Mismatches* m_ = nullptr;
};

TEST_F(HalfConversionTest, EveryHalfWidensToTheSameFloatBits) {
  compareHalfToFloat<<<256, 256>>>(m_);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const Mismatches r = result();
  EXPECT_EQ(r.count, 0u) << "first differing f16: 0x" << std::hex << r.first;
}

TEST_F(HalfConversionTest, EveryFloatNarrowsToTheSameHalfBits) {
  compareFloatToHalf<<<4096, 256>>>(m_);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const Mismatches r = result();
  EXPECT_EQ(r.count, 0u) << "first differing f32: 0x" << std::hex << r.first;
}

}  // namespace
}  // namespace cofab

// CUDA kernels for reduce and XOR: grid-stride loops around the per-element functors that the
// CPU twins also use (gpu/reduce_math.h, gpu/xor_math.h).
#include <cstdint>
#include <string>

#include "gpu/cuda/cuda_ops.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device_pointer.h"
#include "gpu/ops_validate.h"
#include "gpu/reduce_math.h"
#include "gpu/xor_math.h"

namespace cofab::gpu::cuda {
namespace {

// Input pointers travel by value in the kernel arguments (<= 64 of them, 512 bytes).
template <typename T>
struct PointerPack {
  const T* p[kMaxKernelInputs];
};

// Elements [begin, end): the whole tensor, or the tail the vector kernel leaves.
template <typename Io>
__global__ void reduceKernel(PointerPack<typename Io::Storage> ins, int count,
                             typename Io::Storage* out, size_t begin, size_t end, float scale) {
  const ReduceElement<Io> element;
  for (size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < end;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    element(ins.p, count, out, i, scale);
  }
}

// 16 bytes per input per thread (4 f32 or 8 f16/bf16 lanes): 2-byte loads leave most of each
// memory transaction unused (bf16 ran at 0.54x the copy bandwidth on an H100 before this). Each
// lane is summed in input order with ReduceElement's steps, so results stay bit-identical.
template <typename Io>
__global__ void reduceVectorKernel(PointerPack<typename Io::Storage> ins, int count,
                                   typename Io::Storage* out, size_t vectors, float scale) {
  using S = typename Io::Storage;
  using E = ReduceElement<Io>;
  constexpr int kLanes = sizeof(uint4) / sizeof(S);
  for (size_t v = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc[kLanes];
    for (int l = 0; l < kLanes; ++l) acc[l] = 0.0f;
    for (int j = 0; j < count; ++j) {
      const uint4 raw = reinterpret_cast<const uint4*>(ins.p[j])[v];
      const S* lanes = reinterpret_cast<const S*>(&raw);
      for (int l = 0; l < kLanes; ++l) acc[l] = E::add(acc[l], lanes[l]);
    }
    uint4 result;
    S* lanes = reinterpret_cast<S*>(&result);
    for (int l = 0; l < kLanes; ++l) lanes[l] = E::finish(acc[l], scale);
    reinterpret_cast<uint4*>(out)[v] = result;
  }
}

__global__ void xorWordsKernel(PointerPack<uint64_t> srcs, int count, uint64_t* dst, size_t words) {
  const XorWords op;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t acc = srcs.p[0][i];
    for (int j = 1; j < count; ++j) acc = op(acc, srcs.p[j][i]);
    dst[i] = acc;
  }
}

__global__ void xorBytesKernel(PointerPack<uint8_t> srcs, int count, uint8_t* dst, size_t begin,
                               size_t end) {
  const XorWords op;
  for (size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < end;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint8_t acc = srcs.p[0][i];
    for (int j = 1; j < count; ++j) acc = op.byte(acc, srcs.p[j][i]);
    dst[i] = acc;
  }
}

constexpr int kThreads = 256;

unsigned blocksFor(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}

template <typename Io>
Status launchReduce(const ReduceArgs& a, cudaStream_t stream) {
  using S = typename Io::Storage;
  PointerPack<S> pack{};
  bool aligned = reinterpret_cast<uintptr_t>(a.output.data) % sizeof(uint4) == 0;
  for (size_t j = 0; j < a.inputs.size(); ++j) {
    pack.p[j] = static_cast<const S*>(a.inputs[j].data);
    aligned = aligned && reinterpret_cast<uintptr_t>(pack.p[j]) % sizeof(uint4) == 0;
  }
  const int count = static_cast<int>(a.inputs.size());
  const float scale = a.op == ReduceOp::kAverage ? 1.0f / static_cast<float>(count) : 1.0f;
  auto* out = static_cast<S*>(a.output.data);
  const size_t n = a.output.count;
  constexpr size_t kLanes = sizeof(uint4) / sizeof(S);
  const size_t vectors = aligned ? n / kLanes : 0;
  clearUnreadError();
  if (vectors > 0) {
    reduceVectorKernel<Io>
        <<<blocksFor(vectors), kThreads, 0, stream>>>(pack, count, out, vectors, scale);
    COFAB_RETURN_IF_ERROR(cudaStatus(cudaGetLastError(), "reduceVectorKernel launch"));
  }
  const size_t done = vectors * kLanes;
  if (done < n) {
    reduceKernel<Io>
        <<<blocksFor(n - done), kThreads, 0, stream>>>(pack, count, out, done, n, scale);
    COFAB_RETURN_IF_ERROR(cudaStatus(cudaGetLastError(), "reduceKernel launch"));
  }
  return OkStatus();
}

}  // namespace

Status reduce(const ReduceArgs& a) {
  const int device = a.output.device.index;
  COFAB_RETURN_IF_ERROR(cuda::setDevice(device));
  if (a.output.count == 0) return OkStatus();
  COFAB_RETURN_IF_ERROR(checkDevicePointer(a.output.data, device, "reduce output"));
  for (size_t j = 0; j < a.inputs.size(); ++j) {
    COFAB_RETURN_IF_ERROR(
        checkDevicePointer(a.inputs[j].data, device, "reduce input", static_cast<int>(j)));
  }
  auto stream = static_cast<cudaStream_t>(a.stream);
  switch (a.output.dtype) {
    case DType::kF32:
      return launchReduce<F32Io>(a, stream);
    case DType::kF16:
      return launchReduce<F16Io>(a, stream);
    case DType::kBF16:
      return launchReduce<Bf16Io>(a, stream);
    default:
      return InvalidArgument("reduce: unsupported dtype");
  }
}

Status xorBuffers(const XorArgs& a) {
  COFAB_RETURN_IF_ERROR(cuda::setDevice(a.device.index));
  if (a.bytes == 0) return OkStatus();
  COFAB_RETURN_IF_ERROR(checkDevicePointer(a.dst, a.device.index, "xor dst"));
  for (size_t j = 0; j < a.srcs.size(); ++j) {
    COFAB_RETURN_IF_ERROR(
        checkDevicePointer(a.srcs[j], a.device.index, "xor source", static_cast<int>(j)));
  }
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int count = static_cast<int>(a.srcs.size());
  bool aligned = reinterpret_cast<uintptr_t>(a.dst) % 8 == 0;
  for (const void* s : a.srcs) aligned = aligned && reinterpret_cast<uintptr_t>(s) % 8 == 0;
  size_t done = 0;
  clearUnreadError();
  if (aligned && a.bytes >= 8) {
    PointerPack<uint64_t> words{};
    for (int j = 0; j < count; ++j) words.p[j] = static_cast<const uint64_t*>(a.srcs[j]);
    const size_t n = a.bytes / 8;
    xorWordsKernel<<<blocksFor(n), kThreads, 0, stream>>>(words, count,
                                                          static_cast<uint64_t*>(a.dst), n);
    COFAB_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    done = n * 8;
  }
  if (done < a.bytes) {
    PointerPack<uint8_t> bytes{};
    for (int j = 0; j < count; ++j) bytes.p[j] = static_cast<const uint8_t*>(a.srcs[j]);
    xorBytesKernel<<<blocksFor(a.bytes - done), kThreads, 0, stream>>>(
        bytes, count, static_cast<uint8_t*>(a.dst), done, a.bytes);
    COFAB_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return OkStatus();
}

}  // namespace cofab::gpu::cuda

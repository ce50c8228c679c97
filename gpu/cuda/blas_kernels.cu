// cuBLAS GEMM (TF32 off) and the FP64 linear combination of coded matmul's decode. Row-major
// matrices are passed to column-major cuBLAS as their transposes: C^T = B^T A^T.
#include <map>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_ops.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/device_pointer.h"
#include "gpu/reduce_math.h"

namespace cofab::gpu::cuda {
namespace {

// This thread's cuBLAS handle for the current device, in pedantic math mode (no TF32, no
// reduced-precision shortcuts), bound to `stream`. cublasCreate costs about 0.2 ms and a
// workspace allocation: creating one per call made a 256^3 sgemm ten times slower than cuBLAS on
// an H100. A handle is not safe to share between threads, so each thread keeps its own per
// device; they are destroyed at thread exit, which for the main thread precedes the CUDA
// runtime's own teardown.
class ThreadBlasHandles {
 public:
  ~ThreadBlasHandles() {
    for (auto& [device, handle] : handles_) cublasDestroy(handle);
  }
  StatusOr<cublasHandle_t> get(int device, cudaStream_t stream) {
    auto it = handles_.find(device);
    if (it == handles_.end()) {
      cublasHandle_t h = nullptr;
      COFAB_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
      if (cublasStatus_t e = cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
          e != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        COFAB_CUBLAS_RETURN_IF_ERROR(e);
      }
      it = handles_.emplace(device, h).first;
    }
    COFAB_CUBLAS_RETURN_IF_ERROR(cublasSetStream(it->second, stream));
    return it->second;
  }

 private:
  std::map<int, cublasHandle_t> handles_;
};

StatusOr<cublasHandle_t> blasHandle(int device, cudaStream_t stream) {
  thread_local ThreadBlasHandles handles;
  return handles.get(device, stream);
}

__global__ void widenKernel(const float* in, double* out, size_t n) {
  const WidenF32 widen;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = widen(in[i]);
  }
}

__global__ void narrowKernel(const double* in, float* out, size_t n) {
  const NarrowF64 narrow;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = narrow(in[i]);
  }
}

unsigned blocksFor(size_t n) {
  const size_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}

}  // namespace

Status gemmF32(const GemmArgs& g) {
  COFAB_RETURN_IF_ERROR(cuda::setDevice(g.device.index));
  if (g.m == 0 || g.n == 0) return OkStatus();
  COFAB_RETURN_IF_ERROR(checkDevicePointer(g.c, g.device.index, "gemm C"));
  if (g.k > 0) {
    COFAB_RETURN_IF_ERROR(checkDevicePointer(g.a, g.device.index, "gemm A"));
    COFAB_RETURN_IF_ERROR(checkDevicePointer(g.b, g.device.index, "gemm B"));
  }
  const int lda = static_cast<int>(g.lda ? g.lda : g.k);
  const int ldb = static_cast<int>(g.ldb ? g.ldb : g.n);
  const int ldc = static_cast<int>(g.ldc ? g.ldc : g.n);
  auto stream = static_cast<cudaStream_t>(g.stream);
  if (g.k == 0) {
    COFAB_CUDA_RETURN_IF_ERROR(
        cudaMemset2DAsync(g.c, ldc * sizeof(float), 0, g.n * sizeof(float), g.m, stream));
    return OkStatus();
  }
  COFAB_ASSIGN_OR_RETURN(cublasHandle_t blas, blasHandle(g.device.index, stream));
  const float one = 1.0f, zero = 0.0f;
  COFAB_CUBLAS_RETURN_IF_ERROR(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(g.n),
                                           static_cast<int>(g.m), static_cast<int>(g.k), &one, g.b,
                                           ldb, g.a, lda, &zero, g.c, ldc));
  return OkStatus();
}

namespace {

struct Scratch {
  double* y = nullptr;  // in x e, the widened inputs
  double* x = nullptr;  // out x e, the FP64 results
  double* d = nullptr;  // out x in, the coefficients
};

Status combineInto(const CombineArgs& c, cudaStream_t stream, Scratch* s) {
  const size_t in = c.inputs.size(), out = c.outputs.size(), e = c.elements;
  COFAB_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&s->y), in * e * sizeof(double), stream));
  COFAB_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&s->x), out * e * sizeof(double), stream));
  COFAB_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&s->d), in * out * sizeof(double), stream));
  // Pageable host source: the copy is staged before the call returns, so the caller's
  // coefficients need not outlive it.
  COFAB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s->d, c.coeffs.data(), in * out * sizeof(double),
                                             cudaMemcpyHostToDevice, stream));
  clearUnreadError();
  for (size_t j = 0; j < in; ++j) {
    widenKernel<<<blocksFor(e), 256, 0, stream>>>(c.inputs[j], s->y + j * e, e);
    COFAB_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  COFAB_ASSIGN_OR_RETURN(cublasHandle_t blas, blasHandle(c.device.index, stream));
  const double one = 1.0, zero = 0.0;
  // Row-major X (out x e) = D (out x in) Y (in x e)  <=>  X^T = Y^T D^T in column-major.
  COFAB_CUBLAS_RETURN_IF_ERROR(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(e),
                                           static_cast<int>(out), static_cast<int>(in), &one, s->y,
                                           static_cast<int>(e), s->d, static_cast<int>(in), &zero,
                                           s->x, static_cast<int>(e)));
  for (size_t r = 0; r < out; ++r) {
    narrowKernel<<<blocksFor(e), 256, 0, stream>>>(s->x + r * e, c.outputs[r], e);
    COFAB_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return OkStatus();
}

}  // namespace

Status linearCombine(const CombineArgs& c) {
  COFAB_RETURN_IF_ERROR(cuda::setDevice(c.device.index));
  if (c.elements == 0) return OkStatus();
  for (size_t j = 0; j < c.inputs.size(); ++j) {
    COFAB_RETURN_IF_ERROR(checkDevicePointer(c.inputs[j], c.device.index, "linearCombine input",
                                             static_cast<int>(j)));
  }
  for (size_t r = 0; r < c.outputs.size(); ++r) {
    COFAB_RETURN_IF_ERROR(checkDevicePointer(c.outputs[r], c.device.index, "linearCombine output",
                                             static_cast<int>(r)));
  }
  auto stream = static_cast<cudaStream_t>(c.stream);
  Scratch s;
  Status result = combineInto(c, stream, &s);
  // Stream-ordered frees, after the work queued above, whatever failed.
  if (s.d != nullptr) cudaFreeAsync(s.d, stream);
  if (s.x != nullptr) cudaFreeAsync(s.x, stream);
  if (s.y != nullptr) cudaFreeAsync(s.y, stream);
  return result;
}

}  // namespace cofab::gpu::cuda

// cofab's CUDA paths against the limits and peers of the same GPU, in the same run:
//
//   build/bench/gpu/gpu_ops_bench [--benchmark_min_time=0.2]
//
//   BM_CopyD2D                  cudaMemcpyAsync device to device: the memory-bandwidth limit
//   BM_Reduce<f32|f16|bf16>/n   gpu::reduce, sum of n inputs into a separate output
//   BM_Xor/n                    gpu::xorBuffers of n sources (coded shuffling)
//   BM_Gemm/size                gpu::gemmF32 (cuBLAS, pedantic FP32: no TF32)
//   BM_GemmCublas/size          the same cublasSgemm on a handle kept across calls (the peer)
//   BM_CodedEncode/gpu:0|1      CodedMatmul::encode of A (host in, host out) for (n, k) = (8, 6)
//   BM_CodedParity/gpu:0|1      encodeParity alone on blocks already where it runs (host or GPU)
//   BM_CodedDecode/gpu:0|1      CodedMatmul::decode of C with two systematic blocks missing
//
// Device times come from CUDA events around the call (UseManualTime); the coded cases, which
// copy between host and device inside the call, are timed on the host. Bandwidths count bytes
// read plus bytes written, for the copy as for the kernels. Without a GPU every case is skipped
// with the reason and no RESULT line is printed.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <optional>
#include <string>
#include <vector>

#include "bench/support/bench_util.h"
#include "bench/support/result_reporter.h"
#include "coding/matmul/coded_matmul.h"
#include "gpu/device.h"
#include "gpu/linear_combine.h"
#include "gpu/reduce.h"
#include "gpu/stream.h"
#include "gpu/xor.h"

namespace cofab::bench {
namespace {

constexpr size_t kBytes = size_t{64} << 20;  // per buffer: an aggregator's large tensor

// The GPU, or the reason there is none (each case skips with it).
bool haveGpu(benchmark::State& state) {
  static const StatusOr<int> count = gpu::deviceCount();
  if (!count.ok()) state.SkipWithError(("no GPU: " + count.status().message()).c_str());
  return count.ok();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}
void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.toString().c_str());
    std::abort();
  }
}

// Device buffers filled with small values (every dtype reads them as finite numbers).
std::vector<gpu::DeviceBuffer> buffers(int count, size_t bytes) {
  std::vector<gpu::DeviceBuffer> out;
  for (int i = 0; i < count; ++i) {
    auto b = gpu::DeviceBuffer::allocate(bytes, 0);
    check(b.status(), "allocate");
    check(cudaMemset(b->data(), 0x3c + i, bytes), "memset");
    out.push_back(std::move(b).value());
  }
  return out;
}

// Times `body` (which enqueues work on `stream`) with CUDA events, per iteration.
template <typename F>
void timeOnDevice(benchmark::State& state, cudaStream_t stream, F body) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  body();  // warm-up: first-launch and first-handle costs stay out of the figures
  check(cudaStreamSynchronize(stream), "sync");
  for (auto _ : state) {
    check(cudaEventRecord(start, stream), "record");
    body();
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void BM_CopyD2D(benchmark::State& state) {
  if (!haveGpu(state)) return;
  auto bufs = buffers(2, kBytes);
  auto stream = gpu::Stream::create(0);
  check(stream.status(), "stream");
  auto s = static_cast<cudaStream_t>(stream->handle());
  timeOnDevice(state, s, [&] {
    check(cudaMemcpyAsync(bufs[1].data(), bufs[0].data(), kBytes, cudaMemcpyDeviceToDevice, s),
          "copy");
  });
  state.SetBytesProcessed(state.iterations() * 2 * int64_t(kBytes));
}
BENCHMARK(BM_CopyD2D)->UseManualTime();

template <DType D>
void BM_Reduce(benchmark::State& state) {
  if (!haveGpu(state)) return;
  const int inputs = static_cast<int>(state.range(0));
  auto bufs = buffers(inputs + 1, kBytes);
  auto stream = gpu::Stream::create(0);
  check(stream.status(), "stream");
  const size_t count = kBytes / dtypeSize(D);
  std::vector<TensorView> in;
  for (int i = 0; i < inputs; ++i) in.emplace_back(bufs[i].data(), count, D, Device::cuda(0));
  const gpu::ReduceArgs args{.inputs = in,
                             .output = TensorView(bufs[inputs].data(), count, D, Device::cuda(0)),
                             .op = gpu::ReduceOp::kSum,
                             .stream = stream->handle()};
  timeOnDevice(state, static_cast<cudaStream_t>(stream->handle()),
               [&] { check(gpu::reduce(args), "reduce"); });
  state.SetBytesProcessed(state.iterations() * (inputs + 1) * int64_t(kBytes));
}
BENCHMARK(BM_Reduce<DType::kF32>)->Arg(2)->Arg(8)->UseManualTime();
BENCHMARK(BM_Reduce<DType::kF16>)->Arg(2)->UseManualTime();
BENCHMARK(BM_Reduce<DType::kBF16>)->Arg(2)->UseManualTime();

void BM_Xor(benchmark::State& state) {
  if (!haveGpu(state)) return;
  const int sources = static_cast<int>(state.range(0));
  auto bufs = buffers(sources + 1, kBytes);
  auto stream = gpu::Stream::create(0);
  check(stream.status(), "stream");
  std::vector<const void*> srcs;
  for (int i = 0; i < sources; ++i) srcs.push_back(bufs[i].data());
  const gpu::XorArgs args{.srcs = srcs,
                          .dst = bufs[sources].data(),
                          .bytes = kBytes,
                          .device = Device::cuda(0),
                          .stream = stream->handle()};
  timeOnDevice(state, static_cast<cudaStream_t>(stream->handle()),
               [&] { check(gpu::xorBuffers(args), "xor"); });
  state.SetBytesProcessed(state.iterations() * (sources + 1) * int64_t(kBytes));
}
BENCHMARK(BM_Xor)->Arg(4)->UseManualTime();

// Square sgemm of `size`: cofab's entry point, or (peer) cublasSgemm on a kept handle.
template <bool kCofab>
void BM_GemmCase(benchmark::State& state) {
  if (!haveGpu(state)) return;
  const int n = static_cast<int>(state.range(0));
  const size_t bytes = size_t(n) * n * sizeof(float);
  auto bufs = buffers(3, bytes);
  check(cudaMemset(bufs[0].data(), 0, bytes), "memset");  // zeros: no overflow, same work
  check(cudaMemset(bufs[1].data(), 0, bytes), "memset");
  auto stream = gpu::Stream::create(0);
  check(stream.status(), "stream");
  auto s = static_cast<cudaStream_t>(stream->handle());
  auto* a = static_cast<float*>(bufs[0].data());
  auto* b = static_cast<float*>(bufs[1].data());
  auto* c = static_cast<float*>(bufs[2].data());
  cublasHandle_t handle = nullptr;
  if (!kCofab) {
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) std::abort();
    cublasSetStream(handle, s);
    cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);
  }
  const float one = 1, zero = 0;
  timeOnDevice(state, s, [&] {
    if (kCofab) {
      check(gpu::gemmF32({.a = a,
                          .b = b,
                          .c = c,
                          .m = n,
                          .n = n,
                          .k = n,
                          .device = Device::cuda(0),
                          .stream = s}),
            "gemm");
    } else if (cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, n, a, n, &zero, c,
                           n) != CUBLAS_STATUS_SUCCESS) {
      std::abort();
    }
  });
  if (handle != nullptr) cublasDestroy(handle);
  state.counters["tflops"] = benchmark::Counter(2.0 * n * n * double(n) * state.iterations() / 1e12,
                                                benchmark::Counter::kIsRate);
}
void BM_Gemm(benchmark::State& state) { BM_GemmCase<true>(state); }
void BM_GemmCublas(benchmark::State& state) { BM_GemmCase<false>(state); }
BENCHMARK(BM_Gemm)->Arg(256)->Arg(4096)->UseManualTime();
BENCHMARK(BM_GemmCublas)->Arg(256)->Arg(4096)->UseManualTime();

// Coded matmul on (n, k) = (8, 6): A of 12288 x 4096 floats (192 MiB), B of 4096 x 256.
constexpr int64_t kRows = 12288, kInner = 4096, kOut = 256;

Device deviceOf(benchmark::State& state) {
  return state.range(0) == 0 ? Device::cpu() : Device::cuda(0);
}

void BM_CodedEncode(benchmark::State& state) {
  if (!haveGpu(state)) return;
  auto cm = coding::CodedMatmul::create({.n = 8, .k = 6});
  check(cm.status(), "code");
  const std::vector<float> a = randomFloats(kRows * kInner, 1);
  const Device dev = deviceOf(state);
  check(cm->encode({a.data(), kRows, kInner, 0}, dev).status(), "warm-up");
  for (auto _ : state) {
    auto enc = cm->encode({a.data(), kRows, kInner, 0}, dev);
    check(enc.status(), "encode");
    benchmark::DoNotOptimize(enc->block(7).data);
  }
}
BENCHMARK(BM_CodedEncode)->Arg(0)->Arg(1)->ArgName("gpu")->Unit(benchmark::kMillisecond);

void BM_CodedParity(benchmark::State& state) {
  if (!haveGpu(state)) return;
  auto cm = coding::CodedMatmul::create({.n = 8, .k = 6});
  check(cm.status(), "code");
  const size_t blockElems = static_cast<size_t>(kRows / 6 * kInner);
  std::vector<float> host = randomFloats(blockElems * 8, 1);
  std::optional<gpu::DeviceBuffer> dev;
  float* blocks = host.data();
  const Device where = deviceOf(state);
  if (!where.isCpu()) {
    auto b = gpu::DeviceBuffer::allocate(host.size() * sizeof(float), 0);
    check(b.status(), "allocate");
    check(cudaMemcpy(b->data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
          "upload");
    dev.emplace(std::move(b).value());
    blocks = static_cast<float*>(dev->data());
  }
  check(cm->encodeParity(blocks, blockElems, where), "warm-up");
  for (auto _ : state) {
    check(cm->encodeParity(blocks, blockElems, where), "parity");
    check(cudaDeviceSynchronize(), "sync");  // asynchronous on a GPU
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_CodedParity)->Arg(0)->Arg(1)->ArgName("gpu")->Unit(benchmark::kMillisecond);

void BM_CodedDecode(benchmark::State& state) {
  if (!haveGpu(state)) return;
  auto cm = coding::CodedMatmul::create({.n = 8, .k = 6});
  check(cm.status(), "code");
  const std::vector<float> a = randomFloats(kRows * kInner, 1);
  const std::vector<float> b = randomFloats(kInner * kOut, 2);
  auto enc = cm->encode({a.data(), kRows, kInner, 0});
  check(enc.status(), "encode");
  const int64_t br = enc->blockRows();
  // Tasks 0 and 3 straggle: blocks 0 and 3 rebuilt from the two parity results.
  std::vector<std::vector<float>> outs;
  std::vector<coding::TaskResult> results;
  for (int t : {1, 2, 4, 5, 6, 7}) {
    outs.emplace_back(static_cast<size_t>(br * kOut));
    check(cm->multiplyTask(*enc, t, {b.data(), kInner, kOut, 0}, {outs.back().data(), br, kOut, 0}),
          "task");
    results.push_back({t, outs.back().data()});
  }
  std::vector<float> c(static_cast<size_t>(kRows * kOut));
  const Device dev = deviceOf(state);
  for (auto _ : state) {
    auto d = cm->decode(*enc, results, kOut, {c.data(), kRows, kOut, 0}, dev);
    check(d.status(), "decode");
    benchmark::DoNotOptimize(c.data());
  }
}
BENCHMARK(BM_CodedDecode)->Arg(0)->Arg(1)->ArgName("gpu")->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace cofab::bench

int main(int argc, char** argv) {
  using namespace cofab::bench;
  const auto cases = runBenchmarks(&argc, argv);
  const cofab::StatusOr<int> gpus = cofab::gpu::deviceCount();
  if (!gpus.ok()) {
    std::printf("no RESULT lines: no GPU (%s)\n", gpus.status().message().c_str());
    return 0;
  }
  auto gbps = [&](const std::string& name) {
    const CaseResult* c = findCase(cases, name);
    if (c == nullptr || c->counters.count("bytes_per_second") == 0) return 0.0;
    return c->counters.at("bytes_per_second") / 1e9;
  };
  auto ms = [&](const std::string& name) {
    const CaseResult* c = findCase(cases, name);
    return c == nullptr ? 0.0 : c->realTimeNs / 1e6;
  };
  const double copy = gbps("BM_CopyD2D");
  for (const char* name : {"BM_Reduce<DType::kF32>/2", "BM_Reduce<DType::kF32>/8",
                           "BM_Reduce<DType::kF16>/2", "BM_Reduce<DType::kBF16>/2", "BM_Xor/4"}) {
    printResult("gpu_ops", {{"case", name},
                            {"mib", std::to_string(kBytes >> 20)},
                            {"cofab_gbps", num(gbps(name))},
                            {"copy_gbps", num(copy)},
                            {"ratio", num(copy > 0 ? gbps(name) / copy : 0)}});
  }
  for (const char* size : {"256", "4096"}) {
    const double mine = ms(std::string("BM_Gemm/") + size);
    const double peer = ms(std::string("BM_GemmCublas/") + size);
    printResult("gpu_gemm", {{"n", size},
                             {"cofab_ms", num(mine)},
                             {"cublas_ms", num(peer)},
                             {"cublas_over_cofab", num(mine > 0 ? peer / mine : 0)}});
  }
  printResult("gpu_coded", {{"n", "8"},
                            {"k", "6"},
                            {"a_rows", std::to_string(kRows)},
                            {"a_cols", std::to_string(kInner)},
                            {"b_cols", std::to_string(kOut)},
                            {"encode_cpu_ms", num(ms("BM_CodedEncode/gpu:0"))},
                            {"encode_gpu_ms", num(ms("BM_CodedEncode/gpu:1"))},
                            {"parity_cpu_ms", num(ms("BM_CodedParity/gpu:0"))},
                            {"parity_gpu_ms", num(ms("BM_CodedParity/gpu:1"))},
                            {"decode_cpu_ms", num(ms("BM_CodedDecode/gpu:0"))},
                            {"decode_gpu_ms", num(ms("BM_CodedDecode/gpu:1"))}});
  return 0;
}

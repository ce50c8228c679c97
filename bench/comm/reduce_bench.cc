// cofab_reduce_bench: the reduction kernels (fabric/comm/reduce_kernels.h) against memcpy, on
// buffers larger than the caches, so the figures say how close a reduction is to the
// machine's copy ceiling (a sum reads two streams and writes one, like a copy plus a read).
//
// Ends with: RESULT reduce dtype=f32 bytes=... gbs=... memcpy_gbs=... isa=avx512f
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "bench/support/result_reporter.h"
#include "fabric/comm/reduce_kernels.h"

namespace cofab::bench {
namespace {

constexpr size_t kBytes = size_t{16} << 20;

void BM_Memcpy(benchmark::State& state) {
  std::vector<uint8_t> a(kBytes, 1), b(kBytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), kBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBytes);
}
BENCHMARK(BM_Memcpy);

void BM_Reduce(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const size_t n = kBytes / dtypeSize(dtype);
  std::vector<uint8_t> a(kBytes, 0), b(kBytes, 0), d(kBytes, 0);
  for (auto _ : state) {
    comm::reduce(dtype, comm::ReduceOp::kSum, d.data(), a.data(), b.data(), n);
    benchmark::ClobberMemory();
  }
  // Bytes of result produced, comparable with memcpy's bytes copied.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBytes);
  state.SetLabel(std::string(dtypeName(dtype)));
}
BENCHMARK(BM_Reduce)
    ->Arg(static_cast<int>(DType::kF32))
    ->Arg(static_cast<int>(DType::kF64))
    ->Arg(static_cast<int>(DType::kF16))
    ->Arg(static_cast<int>(DType::kBF16))
    ->Arg(static_cast<int>(DType::kI32));

}  // namespace
}  // namespace cofab::bench

int main(int argc, char** argv) {
  using namespace cofab::bench;
  auto cases = runBenchmarks(&argc, argv);
  const CaseResult* copy = findCase(cases, "BM_Memcpy");
  const double copyGbs = copy ? kBytes / copy->realTimeNs : 0;
  for (const auto& c : cases) {
    if (c.name.rfind("BM_Reduce/", 0) != 0) continue;
    const int raw = std::atoi(c.name.substr(10).c_str());
    printResult("reduce", {{"dtype", std::string(cofab::dtypeName(static_cast<cofab::DType>(raw)))},
                           {"bytes", std::to_string(kBytes)},
                           {"gbs", num(kBytes / c.realTimeNs)},
                           {"memcpy_gbs", num(copyGbs)},
                           {"isa", std::string(cofab::comm::reduceIsa())}});
  }
  return 0;
}

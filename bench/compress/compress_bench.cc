// Compression benchmark (docs/COMPRESSION.md).
//
//   build/bench/compress/cofab_compress_bench [--benchmark_min_time=0.2]
//
// 1. Codec throughput on 1 Mi f32 (4 MiB) per call: compress (1-bit with error feedback) and
//    decompress, next to memcpy of the same 4 MiB in the same run (the "free" baseline), plus the
//    compression ratio against f32.
// 2. Push-pull of a 16 MiB f32 tensor between 2 workers (threads) through one in-process daemon
//    over loopback TCP, uncompressed vs int8 vs 1-bit: ms per operation and wire bytes per worker
//    per operation (ClientStats).
// Ends with RESULT lines (DESIGN.md §7).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "aggregator/aggregator_server.h"
#include "bench/support/result_reporter.h"
#include "fabric/compress/codec.h"
#include "fabric/ps/push_pull.h"

namespace cofab {
namespace {

using compress::Compression;

constexpr size_t kElements = 1 << 20;
constexpr size_t kBlock = compress::kDefaultBlock;

std::vector<float> randomData(size_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void BM_Compress(benchmark::State& state) {
  const auto codec = static_cast<Compression>(state.range(0));
  const auto x = randomData(kElements);
  std::vector<float> residual(kElements, 0.0f);
  std::vector<uint8_t> out(compress::compressedBytes(codec, kElements, kBlock));
  for (auto _ : state) {
    compress::compress(codec, x.data(), kElements, kBlock,
                       codec == Compression::kOneBit ? residual.data() : nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kElements * 4));
  state.counters["ratio"] = static_cast<double>(kElements * 4) / static_cast<double>(out.size());
}
BENCHMARK(BM_Compress)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

void BM_Decompress(benchmark::State& state) {
  const auto codec = static_cast<Compression>(state.range(0));
  const auto x = randomData(kElements);
  std::vector<uint8_t> enc(compress::compressedBytes(codec, kElements, kBlock));
  compress::compress(codec, x.data(), kElements, kBlock, nullptr, enc.data());
  std::vector<float> out(kElements);
  for (auto _ : state) {
    if (!compress::decompress(codec, enc.data(), enc.size(), kElements, out.data()).ok()) {
      state.SkipWithError("decompress failed");
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kElements * 4));
}
BENCHMARK(BM_Decompress)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

void BM_Memcpy(benchmark::State& state) {
  const auto x = randomData(kElements);
  std::vector<float> out(kElements);
  for (auto _ : state) {
    std::memcpy(out.data(), x.data(), kElements * 4);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kElements * 4));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMicrosecond);

double gbps(const bench::CaseResult* c) {
  return c ? static_cast<double>(kElements * 4) / c->realTimeNs : 0;  // bytes/ns = GB/s
}

struct PushPullFigures {
  double msPerOp = 0;
  double wireBytesPerOp = 0;
  bool ok = false;
};

PushPullFigures pushPullRun(Compression codec, size_t elements, int iters) {
  PushPullFigures f;
  aggregator::ServerOptions so;
  so.numWorkers = 2;
  so.engineThreads = 1;
  so.listenAddress = "127.0.0.1:0";
  auto server = aggregator::AggregatorServer::create(so);
  if (!server.ok()) {
    std::fprintf(stderr, "daemon: %s\n", server.status().toString().c_str());
    return f;
  }
  ps::ClientOptions co;
  co.serverAddresses = {(*server)->address()};
  double ms[2] = {0, 0};
  uint64_t bytes[2] = {0, 0};
  bool ok[2] = {false, false};
  auto worker = [&](int rank) {
    auto client = ps::PushPullClient::connect(rank, 2, co);
    if (!client.ok()) return;
    auto data = randomData(elements);
    TensorView v = TensorView::of(data.data(), data.size(), DType::kF32);
    ps::PushPullOptions po;
    po.compression = codec;
    if (!(*client)->pushPull(1, v, v, po).wait(Deadline::afterMs(60000)).ok()) return;  // warm-up
    const uint64_t before = (*client)->stats().bytesOut;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      if (!(*client)->pushPull(1, v, v, po).wait(Deadline::afterMs(60000)).ok()) return;
    }
    ms[rank] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        iters;
    bytes[rank] = ((*client)->stats().bytesOut - before) / static_cast<uint64_t>(iters);
    (*client)->close();
    ok[rank] = true;
  };
  std::thread t1(worker, 1);
  worker(0);
  t1.join();
  (*server)->shutdown("benchmark done");
  f.ok = ok[0] && ok[1];
  f.msPerOp = std::max(ms[0], ms[1]);
  f.wireBytesPerOp = static_cast<double>(bytes[0]);
  return f;
}

}  // namespace
}  // namespace cofab

int main(int argc, char** argv) {
  using namespace cofab;
  const auto cases = bench::runBenchmarks(&argc, argv);
  const double memcpyGbps = gbps(bench::findCase(cases, "BM_Memcpy"));
  const char* names[] = {"none", "int8", "onebit"};
  for (int c = 1; c <= 2; ++c) {
    const auto* comp = bench::findCase(cases, "BM_Compress/" + std::to_string(c));
    const auto* dec = bench::findCase(cases, "BM_Decompress/" + std::to_string(c));
    const double ratio = comp && comp->counters.count("ratio") ? comp->counters.at("ratio") : 0;
    bench::printResult("compress", {{"codec", names[c]},
                                    {"elements", std::to_string(kElements)},
                                    {"block", std::to_string(kBlock)},
                                    {"compress_gbps", bench::num(gbps(comp))},
                                    {"decompress_gbps", bench::num(gbps(dec))},
                                    {"memcpy_gbps", bench::num(memcpyGbps)},
                                    {"ratio", bench::num(ratio)}});
  }
  const size_t elements = 4 << 20;  // 16 MiB of f32
  const int iters = 5;
  const auto plain = pushPullRun(Compression::kNone, elements, iters);
  for (int c = 0; c <= 2; ++c) {
    const auto f = c == 0 ? plain : pushPullRun(static_cast<Compression>(c), elements, iters);
    if (!f.ok) {
      std::fprintf(stderr, "push-pull %s failed\n", names[c]);
      continue;
    }
    bench::printResult(
        "compressed_pushpull",
        {{"codec", names[c]},
         {"workers", "2"},
         {"bytes", std::to_string(elements * 4)},
         {"ms_per_op", bench::num(f.msPerOp)},
         {"f32_ms_per_op", bench::num(plain.msPerOp)},
         {"wire_bytes_per_op", bench::num(f.wireBytesPerOp, 8)},
         {"wire_ratio", bench::num(static_cast<double>(elements * 4) / f.wireBytesPerOp)}});
  }
  return 0;
}

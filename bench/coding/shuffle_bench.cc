// Coded shuffling: what the master sends per epoch, coded (multicast XORs, each counted once)
// against uncoded unicast and the scheme's theory rows (1 - alpha) / (1 + n alpha), for
// n in {4, 8, 16} and alpha in {1/4, 1/2}; plus plan and XOR-encode time.
//
// Cases: "stratified" with a row count divisible by n C(n, t) (equal lists: the theory exactly),
// "stratified_odd" with 100000 rows (padding of unequal lists), and "uniform" assignment (rows
// dealt uniformly at random: lists unequal, more padding). Rows are 64 bytes.
//
//   build-coding/bench/coding/coding_shuffle_bench
#include <benchmark/benchmark.h>

#include <random>

#include "bench/coding/bench_args.h"
#include "bench/support/result_reporter.h"
#include "coding/shuffle/coded_shuffle.h"
#include "core/clock.h"

namespace cofab::coding {
namespace {

constexpr size_t kRowBytes = 64;
constexpr int kWorkers[] = {4, 8, 16};
constexpr double kAlphas[] = {0.25, 0.5};
constexpr const char* kCases[] = {"stratified", "stratified_odd", "uniform"};

int64_t binom(int n, int k) {
  int64_t c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return c;
}

int64_t rowsFor(int n, double alpha, int variant) {
  if (variant == 1) return 100000;
  const int64_t unit = n * binom(n, static_cast<int>(alpha * n));
  return unit * std::max<int64_t>(1, (100000 + unit - 1) / unit);
}

void BM_Shuffle(benchmark::State& state) {
  const int n = state.range(0);
  const double alpha = kAlphas[state.range(1)];
  const int variant = state.range(2);
  const int64_t rows = rowsFor(n, alpha, variant);
  auto s = CodedShuffle::create(
      {.workers = n,
       .cacheFraction = alpha,
       .rows = rows,
       .seed = 7,
       .assignment = variant == 2 ? ShuffleAssignment::kUniform : ShuffleAssignment::kStratified});
  if (!s.ok()) {
    state.SkipWithError(s.status().toString().c_str());
    return;
  }
  std::vector<uint8_t> data(rows * kRowBytes);
  std::mt19937_64 rng(1);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  ShuffleAccounting acc;
  double planMs = 0, encodeMs = 0;
  int64_t epoch = 0;
  for (auto _ : state) {
    const int64_t t0 = nowNs();
    auto plan = s->planEpoch(epoch++, kRowBytes);
    const int64_t t1 = nowNs();
    if (!plan.ok()) {
      state.SkipWithError("plan failed");
      return;
    }
    std::vector<uint8_t> wire(plan->messages.size() * kRowBytes);
    const int64_t t2 = nowNs();
    if (!s->encode(*plan, data, kRowBytes, wire).ok()) state.SkipWithError("encode failed");
    encodeMs += (nowNs() - t2) / 1e6;
    planMs += (t1 - t0) / 1e6;
    acc = plan->accounting;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["rows"] = static_cast<double>(rows);
  state.counters["coded_bytes"] = static_cast<double>(acc.codedBytes);
  state.counters["uncoded_bytes"] = static_cast<double>(acc.uncodedBytes);
  state.counters["theory_bytes"] = acc.theoryBytes;
  state.counters["header_bytes"] = static_cast<double>(acc.headerBytes);
  state.counters["plan_ms"] = planMs / iters;
  state.counters["encode_ms"] = encodeMs / iters;
}

}  // namespace
}  // namespace cofab::coding

int main(int argc, char** argv) {
  using namespace cofab::coding;
  using cofab::bench::num;
  for (int n : kWorkers) {
    for (int a = 0; a < 2; ++a) {
      for (int v = 0; v < 3; ++v) {
        benchmark::RegisterBenchmark("BM_Shuffle", BM_Shuffle)
            ->Args({n, a, v})
            ->Iterations(2)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchargs::Args args(argc, argv, {});
  auto cases = cofab::bench::runBenchmarks(args.argc(), args.argv());
  benchargs::endConsoleOutput();
  for (int n : kWorkers) {
    for (int a = 0; a < 2; ++a) {
      for (int v = 0; v < 3; ++v) {
        const auto* c =
            cofab::bench::findCase(cases, "BM_Shuffle/" + std::to_string(n) + "/" +
                                              std::to_string(a) + "/" + std::to_string(v) + "/");
        if (c == nullptr) continue;
        auto get = [&](const char* key) { return c->counters.at(key); };
        const double coded = get("coded_bytes"), uncoded = get("uncoded_bytes"),
                     theory = get("theory_bytes");
        cofab::bench::printResult("shuffle",
                                  {{"n", std::to_string(n)},
                                   {"alpha", num(kAlphas[a])},
                                   {"assignment", kCases[v]},
                                   {"rows", num(get("rows"), 8)},
                                   {"row_bytes", std::to_string(kRowBytes)},
                                   {"coded_bytes", num(coded, 10)},
                                   {"uncoded_bytes", num(uncoded, 10)},
                                   {"theory_bytes", num(theory, 10)},
                                   {"coded_vs_theory", num(theory > 0 ? coded / theory : 0, 4)},
                                   {"reduction", num(coded > 0 ? uncoded / coded : 0, 4)},
                                   {"header_bytes", num(get("header_bytes"), 10)},
                                   {"plan_ms", num(get("plan_ms"), 3)},
                                   {"encode_ms", num(get("encode_ms"), 3)}});
      }
    }
  }
  return 0;
}

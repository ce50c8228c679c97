// Coded matmul under stragglers (Lee et al.): completion time of an (n, k) coded product against
// uncoded (A split over n workers, wait for all) and 2x replication (n/2 blocks, two copies
// each, wait for one copy of every block), under the same shifted-exponential delays; the decode
// time as a share of the total; the worst relative error over every erasure pattern; and a
// comparison of the real MDS code families.
//
// Delays: a task computing a fraction `load` of the product waits load x (shift + Exp(tail))
// before it runs; shift and tail are for the whole product (load 1). Each OpenBLAS call is
// single-threaded so that tasks behave like independent workers on this 2-core machine.
//
//   build-coding/bench/coding/coding_matmul_bench [--tail_csv=PATH]
//   (PATH gets the straggler-tail sweep; bench/coding/plot_tail.py draws it.)
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>

#include "bench/coding/bench_args.h"
#include "bench/support/bench_util.h"
#include "bench/support/result_reporter.h"
#include "coding/matmul/straggler_matmul.h"

namespace cofab::coding {
namespace {

using bench::randomFloats;

constexpr int64_t kRows = 720, kInner = 256, kCols = 64;  // A 720x256, B 256x64
constexpr double kShiftMs = 5.0;
constexpr double kTailMs = 20.0;  // headline tail: the straggler-dominated regime of Lee et al.
constexpr int kRuns = 41;
constexpr std::pair<int, int> kShapes[] = {{8, 6}, {12, 9}, {16, 12}};
constexpr double kSweepTails[] = {0, 2.5, 5, 10, 20, 40, 80};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Worst relative Frobenius error of the decoded product over every k-subset of task results
// (all C(n, k) for these shapes), against an FP64 product.
double worstRelativeError(const CodedMatmul& cm, int64_t rows, int64_t inner, int64_t cols) {
  std::vector<float> a = randomFloats(rows * inner, 11), b = randomFloats(inner * cols, 12);
  std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()), want(rows * cols);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, inner, 1.0, ad.data(), inner,
              bd.data(), cols, 0.0, want.data(), cols);
  auto enc = cm.encode({a.data(), rows, inner, 0});
  if (!enc.ok()) return NAN;
  const int n = cm.n(), k = cm.k();
  const int64_t br = enc->blockRows();
  std::vector<std::vector<float>> outs(n, std::vector<float>(br * cols));
  for (int t = 0; t < n; ++t) {
    if (!cm.multiplyTask(*enc, t, {b.data(), inner, cols, 0}, {outs[t].data(), br, cols, 0}).ok()) {
      return NAN;
    }
  }
  double den = 0;
  for (double w : want) den += w * w;
  double worst = 0;
  std::vector<int> used(k);
  std::iota(used.begin(), used.end(), 0);
  std::vector<float> c(rows * cols);
  while (true) {
    std::vector<TaskResult> results;
    for (int t : used) results.push_back({t, outs[t].data()});
    if (!cm.decode(*enc, results, cols, {c.data(), rows, cols, 0}).ok()) return NAN;
    double num = 0;
    for (size_t i = 0; i < c.size(); ++i) num += (c[i] - want[i]) * (c[i] - want[i]);
    worst = std::max(worst, std::sqrt(num / den));
    int i = k - 1;
    while (i >= 0 && used[i] == n - k + i) --i;
    if (i < 0) break;
    ++used[i];
    for (int j = i + 1; j < k; ++j) used[j] = used[j - 1] + 1;
  }
  return worst;
}

// One (n, k, tail) case: kRuns runs of coded, uncoded and replicated with the same delay draws.
void BM_Stragglers(benchmark::State& state) {
  const int n = state.range(0), k = state.range(1);
  const double tail = state.range(2) / 10.0;
  auto cm = CodedMatmul::create({.n = n, .k = k});
  auto exec = StragglerExecutor::create({.threads = 16});
  auto delay = ShiftedExponentialDelay::create({.shiftMs = kShiftMs, .tailMeanMs = tail});
  if (!cm.ok() || !exec.ok() || !delay.ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  std::vector<float> a = randomFloats(kRows * kInner, 1), b = randomFloats(kInner * kCols, 2);
  std::vector<float> c(kRows * kCols);
  ConstMatrixView av{a.data(), kRows, kInner, 0}, bv{b.data(), kInner, kCols, 0};
  MatrixView cv{c.data(), kRows, kCols, 0};
  auto enc = cm->encode(av);
  std::vector<double> coded, uncoded, replicated, decodeMs;
  int decodedRuns = 0;
  for (auto _ : state) {
    for (int run = 0; run < kRuns; ++run) {
      StragglerRunOptions o{.executor = exec->get(), .delay = &*delay, .run = run};
      auto rc = runCodedMatmul(*cm, *enc, bv, cv, o);
      auto ru = runUncodedMatmul(av, bv, cv, n, o);
      auto rr = runReplicatedMatmul(av, bv, cv, n, 2, o);
      if (!rc.ok() || !ru.ok() || !rr.ok()) {
        state.SkipWithError("run failed");
        return;
      }
      coded.push_back(rc->totalMs);
      decodeMs.push_back(rc->decodeMs);
      decodedRuns += rc->decoded;
      uncoded.push_back(ru->totalMs);
      replicated.push_back(rr->totalMs);
    }
  }
  const double sumTotal = std::accumulate(coded.begin(), coded.end(), 0.0);
  const double sumDecode = std::accumulate(decodeMs.begin(), decodeMs.end(), 0.0);
  state.counters["coded_p50_ms"] = median(coded);
  state.counters["uncoded_p50_ms"] = median(uncoded);
  state.counters["replication_p50_ms"] = median(replicated);
  state.counters["decode_share"] = sumTotal > 0 ? sumDecode / sumTotal : 0;
  state.counters["decoded_runs"] = decodedRuns;
  state.counters["runs"] = static_cast<double>(coded.size());
}

void BM_ErasureError(benchmark::State& state) {
  const int n = state.range(0), k = state.range(1);
  auto cm = CodedMatmul::create({.n = n, .k = k});
  if (!cm.ok()) {
    state.SkipWithError(cm.status().toString().c_str());
    return;
  }
  double err = 0;
  for (auto _ : state) err = worstRelativeError(*cm, 240, 128, 32);
  state.counters["worst_rel_err"] = err;
  state.counters["worst_cond"] = cm->code().worstCondition();
}

constexpr MdsFamily kFamilies[] = {MdsFamily::kRandomGaussian, MdsFamily::kCauchyChebyshev,
                                   MdsFamily::kLagrangeChebyshev,
                                   MdsFamily::kVandermondeEquispaced};
constexpr std::pair<int, int> kFamilyShapes[] = {{8, 6}, {10, 8}, {12, 9}, {12, 11}, {16, 12}};

void BM_Family(benchmark::State& state) {
  const MdsFamily family = kFamilies[state.range(0)];
  const int n = state.range(1), k = state.range(2);
  auto code = RealMdsCode::create({.n = n, .k = k, .family = family, .maxCondition = 1e300});
  if (!code.ok()) {
    state.SkipWithError(code.status().toString().c_str());
    return;
  }
  CodedMatmul cm(std::move(code).value());
  double err = 0;
  for (auto _ : state) err = worstRelativeError(cm, 240, 128, 32);
  state.counters["worst_rel_err"] = err;
  state.counters["worst_cond"] = cm.code().worstCondition();
}

constexpr std::pair<int, int> kRefinedShapes[] = {{12, 9}, {16, 12}};
constexpr int kRefineSteps = 100;

// The default family after kRefineSteps hill-climbing steps (RealMdsOptions::refineSteps).
void BM_Refined(benchmark::State& state) {
  const int n = state.range(0), k = state.range(1);
  auto code = RealMdsCode::create({.n = n, .k = k, .refineSteps = kRefineSteps});
  if (!code.ok()) {
    state.SkipWithError(code.status().toString().c_str());
    return;
  }
  CodedMatmul cm(std::move(code).value());
  double err = 0;
  for (auto _ : state) err = worstRelativeError(cm, 240, 128, 32);
  state.counters["worst_rel_err"] = err;
  state.counters["worst_cond"] = cm.code().worstCondition();
}

void registerAll() {
  for (auto [n, k] : kShapes) {
    benchmark::RegisterBenchmark("BM_Stragglers", BM_Stragglers)
        ->Args({n, k, static_cast<int64_t>(kTailMs * 10)})
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_ErasureError", BM_ErasureError)
        ->Args({n, k})
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (double tail : kSweepTails) {
    if (tail == kTailMs) continue;  // already measured above
    benchmark::RegisterBenchmark("BM_Stragglers", BM_Stragglers)
        ->Args({8, 6, static_cast<int64_t>(tail * 10)})
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (auto [n, k] : kRefinedShapes) {
    benchmark::RegisterBenchmark("BM_Refined", BM_Refined)
        ->Args({n, k})
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (int f = 0; f < 4; ++f) {
    for (auto [n, k] : kFamilyShapes) {
      benchmark::RegisterBenchmark("BM_Family", BM_Family)
          ->Args({f, n, k})
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace cofab::coding

int main(int argc, char** argv) {
  using namespace cofab::coding;
  using cofab::bench::num;
  openblas_set_num_threads(1);
  std::string csvPath;
  benchargs::Args args(argc, argv, {{"tail_csv", &csvPath}});
  registerAll();
  auto cases = cofab::bench::runBenchmarks(args.argc(), args.argv());
  benchargs::endConsoleOutput();
  auto get = [&](const std::string& name, const char* key) -> const double* {
    const auto* c = cofab::bench::findCase(cases, name);
    if (c == nullptr) return nullptr;
    auto it = c->counters.find(key);
    return it == c->counters.end() ? nullptr : &it->second;
  };
  auto stragglerName = [](int n, int k, double tail) {
    return "BM_Stragglers/" + std::to_string(n) + "/" + std::to_string(k) + "/" +
           std::to_string(static_cast<int64_t>(tail * 10)) + "/";
  };
  for (auto [n, k] : kShapes) {
    const std::string s = stragglerName(n, k, kTailMs);
    const std::string e = "BM_ErasureError/" + std::to_string(n) + "/" + std::to_string(k) + "/";
    const double* coded = get(s, "coded_p50_ms");
    const double* err = get(e, "worst_rel_err");
    if (coded == nullptr || err == nullptr) continue;
    const double uncoded = *get(s, "uncoded_p50_ms");
    cofab::bench::printResult("coded_matmul",
                              {{"n", std::to_string(n)},
                               {"k", std::to_string(k)},
                               {"coded_p50_ms", num(*coded)},
                               {"uncoded_p50_ms", num(uncoded)},
                               {"replication_p50_ms", num(*get(s, "replication_p50_ms"))},
                               {"decode_share", num(*get(s, "decode_share"), 3)},
                               {"worst_rel_err", num(*err, 3)},
                               {"speedup_vs_uncoded", num(uncoded / *coded, 3)},
                               {"worst_cond", num(*get(e, "worst_cond"), 4)},
                               {"decoded_runs", num(*get(s, "decoded_runs"))},
                               {"runs", num(*get(s, "runs"))},
                               {"shift_ms", num(kShiftMs)},
                               {"tail_ms", num(kTailMs)}});
  }
  std::ofstream csv;
  if (!csvPath.empty()) {
    csv.open(csvPath);
    csv << "tail_ms,coded_p50_ms,uncoded_p50_ms,replication_p50_ms\n";
  }
  for (double tail : kSweepTails) {
    const std::string s = stragglerName(8, 6, tail);
    const double* coded = get(s, "coded_p50_ms");
    if (coded == nullptr) continue;
    const double u = *get(s, "uncoded_p50_ms"), r = *get(s, "replication_p50_ms");
    cofab::bench::printResult("coded_matmul_tail", {{"n", "8"},
                                                    {"k", "6"},
                                                    {"shift_ms", num(kShiftMs)},
                                                    {"tail_ms", num(tail)},
                                                    {"coded_p50_ms", num(*coded)},
                                                    {"uncoded_p50_ms", num(u)},
                                                    {"replication_p50_ms", num(r)}});
    if (csv.is_open()) csv << tail << "," << *coded << "," << u << "," << r << "\n";
  }
  for (int f = 0; f < 4; ++f) {
    for (auto [n, k] : kFamilyShapes) {
      const std::string name = "BM_Family/" + std::to_string(f) + "/" + std::to_string(n) + "/" +
                               std::to_string(k) + "/";
      const double* err = get(name, "worst_rel_err");
      if (err == nullptr) continue;
      cofab::bench::printResult("mds_family", {{"family", mdsFamilyName(kFamilies[f])},
                                               {"n", std::to_string(n)},
                                               {"k", std::to_string(k)},
                                               {"worst_cond", num(*get(name, "worst_cond"), 4)},
                                               {"worst_rel_err", num(*err, 3)}});
    }
  }
  for (auto [n, k] : kRefinedShapes) {
    const std::string name = "BM_Refined/" + std::to_string(n) + "/" + std::to_string(k) + "/";
    const double* err = get(name, "worst_rel_err");
    if (err == nullptr) continue;
    cofab::bench::printResult("mds_family",
                              {{"family", "random_gaussian_refined" + std::to_string(kRefineSteps)},
                               {"n", std::to_string(n)},
                               {"k", std::to_string(k)},
                               {"worst_cond", num(*get(name, "worst_cond"), 4)},
                               {"worst_rel_err", num(*err, 3)}});
  }
  return 0;
}

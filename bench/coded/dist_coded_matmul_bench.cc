// Distributed coded matmul latency: a master in this process and 8 forked worker processes
// (fabric/coded/) over tcp on loopback. Three modes under the same worker-side shifted-
// exponential delays (coding's ShiftedExponentialDelay, load-scaled, drawn from (request,
// worker)): coded (8,6), uncoded (all 8) and 2x replication (4 blocks x 2). Then a real
// straggler: worker 0 stopped with SIGSTOP for the whole scenario; coded requests complete,
// uncoded ones fail at their deadline naming the worker.
//
// The machine has 2 cores shared with other work, and 8 workers on 2 cores cannot compute in
// parallel: the settings make the injected delays (tens of ms) dominate the compute (well under
// a millisecond per task), so what is measured is the straggler behaviour, not the GEMMs.
//
// --delay_scaling=load (default) scales each task's delay by its share of the work (Lee et al.):
// under it the delays alone cap (8,6)'s p99 speedup near 1.8x. --delay_scaling=none draws the
// same shift + Exp(tail) for every task whatever its size (straggling of the environment rather
// than of the work). The bench prints what the delays alone predict next to the measurement.
//
// In between, the same delays with worker 3 stopped (SIGSTOP) for pause_ms of every period_ms:
// an intermittent real straggler, coded against uncoded.
//
//   dist_coded_matmul_bench [--requests=100] [--shift_ms=10] [--tail_ms=200]
//                           [--delay_scaling=load|none] [--pause_ms=300] [--period_ms=1500]
//                           [--stopped_requests=20] [--deadline_ms=1000] [--csv=latencies.csv]
//
// Ends with
//   RESULT dist_coded_matmul_intermittent n=8 k=6 coded_p50_ms=... uncoded_p99_ms=... ...
//   RESULT dist_coded_matmul_stopped n=8 k=6 coded_ok=... coded_p50_ms=... uncoded_ok=...
//   RESULT dist_coded_matmul n=8 k=6 coded_p50_ms=... coded_p99_ms=... uncoded_p50_ms=...
//          uncoded_p99_ms=... replication_p50_ms=... replication_p99_ms=...
#include <cblas.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/support/bench_util.h"
#include "bench/support/result_reporter.h"
#include "fabric/coded/coded_master.h"
#include "fabric/coded/coded_worker.h"
#include "fabric/rendezvous/file_store.h"

namespace cofab::coded {
namespace {

constexpr int kN = 8;
constexpr int kK = 6;
constexpr int64_t kRows = 960, kCols = 256, kBCols = 16;

struct Flags {
  int requests = 100;
  double shiftMs = 10;
  double tailMs = 200;
  int stoppedRequests = 20;
  int deadlineMs = 1000;
  int pauseMs = 300;
  int periodMs = 1500;
  // "load": delay = load x (shift + Exp(tail)) (Lee et al.; coded tasks, 1/k of the work, get
  // 8/6 the uncoded delay); "none": shift + Exp(tail) per task whatever its size.
  std::string delayScaling = "load";
  std::string csv;
};

Flags parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      const std::string p = std::string("--") + name + "=";
      return a.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    if (const char* v = val("requests"))
      f.requests = std::atoi(v);
    else if (const char* v = val("shift_ms"))
      f.shiftMs = std::atof(v);
    else if (const char* v = val("tail_ms"))
      f.tailMs = std::atof(v);
    else if (const char* v = val("stopped_requests"))
      f.stoppedRequests = std::atoi(v);
    else if (const char* v = val("deadline_ms"))
      f.deadlineMs = std::atoi(v);
    else if (const char* v = val("delay_scaling"))
      f.delayScaling = v;
    else if (const char* v = val("csv"))
      f.csv = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  if (f.delayScaling != "load" && f.delayScaling != "none") {
    std::fprintf(stderr, "--delay_scaling is load or none\n");
    std::exit(2);
  }
  return f;
}

// The p-quantile of the j-th smallest of n i.i.d. Exp(mean) (bisection on the binomial tail):
// what the injected delays alone predict for a request that needs j of n results.
double orderStatQuantile(int j, int n, double mean, double p) {
  auto cdf = [&](double x) {  // P(at least j of n are <= x)
    const double q = 1 - std::exp(-x / mean);
    double total = 0, binom = 1;
    for (int i = 0; i <= n; ++i) {
      if (i > 0) binom = binom * (n - i + 1) / i;
      if (i >= j) total += binom * std::pow(q, i) * std::pow(1 - q, n - i);
    }
    return total;
  };
  double lo = 0, hi = mean * 100;
  for (int it = 0; it < 200; ++it) {
    const double mid = (lo + hi) / 2;
    (cdf(mid) < p ? lo : hi) = mid;
  }
  return hi;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// Forks the workers (before the master creates threads), runs `body` with the master.
struct Scenario {
  std::vector<double> latencies;
  int ok = 0, failed = 0;
  std::string firstError;
};

template <typename Body>
Scenario runScenario(const std::string& dir, const CodedServiceOptions& options, Body body) {
  std::vector<pid_t> pids;
  for (int w = 0; w < options.n; ++w) {
    const pid_t pid = fork();
    if (pid == 0) {
      openblas_set_num_threads(1);
      auto store = FileStore::open(dir);
      if (!store.ok()) _exit(3);
      Status s = runCodedWorker({.store = store->get(), .name = options.name, .index = w});
      if (!s.ok()) std::fprintf(stderr, "worker %d: %s\n", w, s.toString().c_str());
      _exit(s.ok() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  Scenario out;
  {
    auto store = FileStore::open(dir);
    auto master = store.ok() ? CodedMaster::create(store->get(), options)
                             : StatusOr<std::unique_ptr<CodedMaster>>(store.status());
    if (!master.ok()) {
      std::fprintf(stderr, "master: %s\n", master.status().toString().c_str());
      for (pid_t p : pids) kill(p, SIGKILL);
    } else {
      body(**master, pids, out);
    }
  }
  for (pid_t p : pids) {
    kill(p, SIGCONT);
    int st = 0;
    waitpid(p, &st, 0);
  }
  return out;
}

}  // namespace
}  // namespace cofab::coded

int main(int argc, char** argv) {
  using namespace cofab;
  using namespace cofab::coded;
  const Flags flags = parseFlags(argc, argv);
  openblas_set_num_threads(1);
  const std::string dir = bench::makeTempDir("cofab-coded-bench");
  if (dir.empty()) return 1;

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(kRows * kCols), b(kCols * kBCols), c(kRows * kBCols);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);

  // `pause`: worker 3 is stopped (SIGSTOP) for pause_ms out of every period_ms while the
  // requests run (a real, intermittent straggler on top of the injected delays).
  auto requests = [&](int count, bool pause = false) {
    return [&, count, pause](CodedMaster& m, const std::vector<pid_t>& pids, Scenario& out) {
      Status s = m.load({a.data(), kRows, kCols, 0});
      if (!s.ok()) {
        out.firstError = s.toString();
        return;
      }
      std::atomic<bool> done{false};
      std::thread toggler;
      if (pause) {
        toggler = std::thread([&] {
          while (!done.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(flags.periodMs - flags.pauseMs));
            if (done.load()) break;
            kill(pids[3], SIGSTOP);
            std::this_thread::sleep_for(std::chrono::milliseconds(flags.pauseMs));
            kill(pids[3], SIGCONT);
          }
        });
      }
      for (int i = 0; i < count; ++i) {
        auto r = m.multiply({b.data(), kCols, kBCols, 0}, {c.data(), kRows, kBCols, 0});
        if (r.ok()) {
          ++out.ok;
          out.latencies.push_back(r->totalMs);
        } else {
          ++out.failed;
          if (out.firstError.empty()) out.firstError = r.status().toString();
        }
      }
      done = true;
      if (toggler.joinable()) toggler.join();
    };
  };

  CodedServiceOptions base;
  base.n = kN;
  base.k = kK;
  base.replicas = 2;
  base.shiftMs = flags.shiftMs;
  base.tailMeanMs = flags.tailMs;
  base.loadScaledDelay = flags.delayScaling == "load";
  base.requestTimeout = Millis(30000);
  int generation = 0;
  auto withMode = [&](CodedMode mode) {
    CodedServiceOptions o = base;
    o.mode = mode;
    o.name = "bench-" + std::to_string(generation++);  // a fresh store key per service
    return o;
  };

  const bool scaled = base.loadScaledDelay;
  std::printf(
      "# %d workers on a 2-core shared VM; A %ldx%ld, B %ldx%ld; injected delay per task "
      "= %s(%.1f ms + Exp(mean %.1f ms))%s\n",
      kN, static_cast<long>(kRows), static_cast<long>(kCols), static_cast<long>(kCols),
      static_cast<long>(kBCols), scaled ? "load x " : "", flags.shiftMs, flags.tailMs,
      scaled ? ", load = 1/k, 1/n, r/n" : " (not scaled by the task's load)");
  // What the delays alone predict (no compute, no service overhead): coded waits for the 6th of
  // 8 results, uncoded for all 8.
  const double codedScale = scaled ? 1.0 / kK : 1.0, uncodedScale = scaled ? 1.0 / kN : 1.0;
  double theory[2][2];  // [coded, uncoded][p50, p99]
  for (int q = 0; q < 2; ++q) {
    const double p = q == 0 ? 0.5 : 0.99;
    theory[0][q] = codedScale * (flags.shiftMs + orderStatQuantile(kK, kN, flags.tailMs, p));
    theory[1][q] = uncodedScale * (flags.shiftMs + orderStatQuantile(kN, kN, flags.tailMs, p));
  }
  std::printf(
      "# delays alone predict: coded p50 %.2f p99 %.2f ms, uncoded p50 %.2f p99 %.2f ms "
      "(speedups %.2fx / %.2fx)\n",
      theory[0][0], theory[0][1], theory[1][0], theory[1][1], theory[1][0] / theory[0][0],
      theory[1][1] / theory[0][1]);
  Scenario coded = runScenario(dir, withMode(CodedMode::kCoded), requests(flags.requests));
  Scenario uncoded = runScenario(dir, withMode(CodedMode::kUncoded), requests(flags.requests));
  Scenario repl = runScenario(dir, withMode(CodedMode::kReplicated), requests(flags.requests));
  for (auto [name, sc] : {std::pair<const char*, Scenario*>{"coded(8,6)", &coded},
                          {"uncoded(8)", &uncoded},
                          {"replication(2x4)", &repl}}) {
    std::printf("%-18s ok=%d failed=%d p50=%.2f ms p90=%.2f ms p99=%.2f ms max=%.2f ms %s\n", name,
                sc->ok, sc->failed, percentile(sc->latencies, 50), percentile(sc->latencies, 90),
                percentile(sc->latencies, 99), percentile(sc->latencies, 100),
                sc->firstError.c_str());
  }
  Scenario codedPaused =
      runScenario(dir, withMode(CodedMode::kCoded), requests(flags.requests, true));
  Scenario uncodedPaused =
      runScenario(dir, withMode(CodedMode::kUncoded), requests(flags.requests, true));
  std::printf("same delays + worker 3 stopped %d ms of every %d ms:\n", flags.pauseMs,
              flags.periodMs);
  for (auto [name, sc] : {std::pair<const char*, Scenario*>{"coded(8,6)", &codedPaused},
                          {"uncoded(8)", &uncodedPaused}}) {
    std::printf("  %-16s ok=%d failed=%d p50=%.2f ms p90=%.2f ms p99=%.2f ms max=%.2f ms %s\n",
                name, sc->ok, sc->failed, percentile(sc->latencies, 50),
                percentile(sc->latencies, 90), percentile(sc->latencies, 99),
                percentile(sc->latencies, 100), sc->firstError.c_str());
  }
  if (!flags.csv.empty()) {
    std::ofstream f(flags.csv);
    f << "mode,request,latency_ms\n";
    for (auto [name, sc] : {std::pair<const char*, Scenario*>{"coded", &coded},
                            {"uncoded", &uncoded},
                            {"replication", &repl}}) {
      for (size_t i = 0; i < sc->latencies.size(); ++i) {
        f << name << "," << i << "," << sc->latencies[i] << "\n";
      }
    }
  }

  // A real straggler: worker 0 (holding a systematic block) stopped with SIGSTOP throughout.
  auto stoppedScenario = [&](CodedMode mode) {
    CodedServiceOptions o = withMode(mode);
    o.shiftMs = 0;
    o.tailMeanMs = 0;
    o.requestTimeout = Millis(flags.deadlineMs);
    return runScenario(dir, o, [&](CodedMaster& m, const std::vector<pid_t>& pids, Scenario& out) {
      Status s = m.load({a.data(), kRows, kCols, 0});
      if (!s.ok()) {
        out.firstError = s.toString();
        return;
      }
      kill(pids[0], SIGSTOP);
      for (int i = 0; i < flags.stoppedRequests; ++i) {
        auto r = m.multiply({b.data(), kCols, kBCols, 0}, {c.data(), kRows, kBCols, 0});
        if (r.ok()) {
          ++out.ok;
          out.latencies.push_back(r->totalMs);
        } else {
          ++out.failed;
          if (out.firstError.empty()) out.firstError = r.status().toString();
        }
      }
      kill(pids[0], SIGCONT);
    });
  };
  Scenario codedStopped = stoppedScenario(CodedMode::kCoded);
  Scenario uncodedStopped = stoppedScenario(CodedMode::kUncoded);
  std::printf("stopped worker 0, no injected delay, deadline %d ms:\n", flags.deadlineMs);
  std::printf("  coded(8,6)  ok=%d/%d p50=%.2f ms p99=%.2f ms %s\n", codedStopped.ok,
              flags.stoppedRequests, percentile(codedStopped.latencies, 50),
              percentile(codedStopped.latencies, 99), codedStopped.firstError.c_str());
  std::printf("  uncoded(8)  ok=%d/%d first error: %s\n", uncodedStopped.ok, flags.stoppedRequests,
              uncodedStopped.firstError.c_str());
  rmdir(dir.c_str());

  using bench::num;
  bench::printResult(
      "dist_coded_matmul_intermittent",
      {{"n", std::to_string(kN)},
       {"k", std::to_string(kK)},
       {"coded_p50_ms", num(percentile(codedPaused.latencies, 50))},
       {"coded_p99_ms", num(percentile(codedPaused.latencies, 99))},
       {"uncoded_p50_ms", num(percentile(uncodedPaused.latencies, 50))},
       {"uncoded_p99_ms", num(percentile(uncodedPaused.latencies, 99))},
       {"p50_speedup",
        num(percentile(uncodedPaused.latencies, 50) / percentile(codedPaused.latencies, 50))},
       {"p99_speedup",
        num(percentile(uncodedPaused.latencies, 99) / percentile(codedPaused.latencies, 99))},
       {"pause_ms", std::to_string(flags.pauseMs)},
       {"period_ms", std::to_string(flags.periodMs)}});
  bench::printResult("dist_coded_matmul_stopped",
                     {{"n", std::to_string(kN)},
                      {"k", std::to_string(kK)},
                      {"coded_ok", std::to_string(codedStopped.ok)},
                      {"coded_p50_ms", num(percentile(codedStopped.latencies, 50))},
                      {"uncoded_ok", std::to_string(uncodedStopped.ok)},
                      {"uncoded_failed", std::to_string(uncodedStopped.failed)},
                      {"requests", std::to_string(flags.stoppedRequests)},
                      {"deadline_ms", std::to_string(flags.deadlineMs)}});
  bench::printResult(
      "dist_coded_matmul",
      {{"n", std::to_string(kN)},
       {"k", std::to_string(kK)},
       {"coded_p50_ms", num(percentile(coded.latencies, 50))},
       {"coded_p99_ms", num(percentile(coded.latencies, 99))},
       {"uncoded_p50_ms", num(percentile(uncoded.latencies, 50))},
       {"uncoded_p99_ms", num(percentile(uncoded.latencies, 99))},
       {"replication_p50_ms", num(percentile(repl.latencies, 50))},
       {"replication_p99_ms", num(percentile(repl.latencies, 99))},
       {"p50_speedup", num(percentile(uncoded.latencies, 50) / percentile(coded.latencies, 50))},
       {"p99_speedup", num(percentile(uncoded.latencies, 99) / percentile(coded.latencies, 99))},
       {"theory_p50_speedup", num(theory[1][0] / theory[0][0])},
       {"theory_p99_speedup", num(theory[1][1] / theory[0][1])},
       {"requests", std::to_string(flags.requests)},
       {"shift_ms", num(flags.shiftMs)},
       {"tail_ms", num(flags.tailMs)},
       {"delay_scaling", flags.delayScaling}});
  const bool ok = coded.failed == 0 && uncoded.failed == 0 && repl.failed == 0 &&
                  codedStopped.ok == flags.stoppedRequests;
  return ok ? 0 : 1;
}

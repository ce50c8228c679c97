// cofab_aggregator_bench: what the aggregator costs and how it compares, in one run.
//
//   cofab_aggregator_bench [--workers 2,4] [--bytes 64M] [--iters 5] [--blocks 4]
//                          [--modes dedicated,colocated,colocated_tcp] [--skip-reduce]
//                          [--skip-failover]
//
// 1. Reduction throughput of one engine thread (aggregator/reducer.h) against a STREAM-like
//    add c = a + b measured in the same process on the same buffer sizes (GB/s of memory
//    traffic: inputs read + output written).
// 2. Push-pull of one f32 tensor (default 64 MiB) with N workers (forked processes):
//    dedicated (2 cofab-aggd processes) and colocated (every worker process hosts a shard,
//    AggregatorServer in-process, and reaches it through an in-process pipe; colocated_tcp:
//    through loopback tcp like the other workers, the layout before the pipe existed), against
//    cofab's ring allreduce (fabric/comm) in the same processes and Gloo's allreduce (bench/comm's
//    gloo_allreduce_bench, run as is) when built. Time per op = the slowest rank's mean over
//    --iters back-to-back ops after one warm-up each, push-pull and ring taking turns in
//    --blocks blocks (iters/blocks ops each), so that the VM's drift in speed hits both;
//    cpu = user + system ms per op of the worker processes (all ranks together, shard threads
//    included; dedicated daemons not counted).
// 3. Failover pause: 2 daemons with replication, 2 workers pushing 1 MiB tensors back to back;
//    SIGKILL the primary; pause = first completion after the kill - the kill.
// Ends with RESULT lines (DESIGN.md §7).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "aggregator/reducer.h"
#include "bench/support/bench_util.h"
#include "fabric/comm/collectives.h"
#include "fabric/comm/communicator.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/store.h"

using namespace cofab;

namespace {

using bench::nowMs;
std::string arg(int argc, char** argv, const std::string& name, const std::string& def) {
  return bench::argValue(argc, argv, name, def);
}
bool flag(int argc, char** argv, const std::string& name) {
  return bench::hasFlag(argc, argv, name);
}
std::vector<int> parseInts(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    out.push_back(std::atoi(s.substr(pos, c - pos).c_str()));
    pos = c + 1;
  }
  return out;
}

// ---- 1. reduction vs STREAM-like add --------------------------------------------------------

__attribute__((noinline)) void streamAdd(const float* a, const float* b, float* c, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

void benchReduction(size_t bytes) {
  const size_t n = bytes / sizeof(float);
  for (int inputs : {2, 4}) {
    std::vector<std::vector<float>> in(static_cast<size_t>(inputs), std::vector<float>(n, 1.5f));
    std::vector<float> out(n, 0.0f);
    std::vector<const uint8_t*> ptrs;
    for (auto& v : in) ptrs.push_back(reinterpret_cast<const uint8_t*>(v.data()));
    double bestReduce = 1e30, bestAdd = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      double t0 = nowMs();
      aggregator::reduceInRankOrder(DType::kF32, false, ptrs, n,
                                    reinterpret_cast<uint8_t*>(out.data()));
      bestReduce = std::min(bestReduce, nowMs() - t0);
      t0 = nowMs();
      streamAdd(in[0].data(), in[1].data(), out.data(), n);
      bestAdd = std::min(bestAdd, nowMs() - t0);
    }
    const double reduceGBps = static_cast<double>(bytes) * (inputs + 1) / (bestReduce * 1e6);
    const double addGBps = static_cast<double>(bytes) * 3 / (bestAdd * 1e6);
    std::printf("reduce %d x %zu B f32: %.2f ms (%.2f GB/s); stream add: %.2f ms (%.2f GB/s)\n",
                inputs, bytes, bestReduce, reduceGBps, bestAdd, addGBps);
    std::printf(
        "RESULT aggregator_reduce bytes=%zu inputs=%d reduce_gbps=%.2f stream_add_gbps=%.2f "
        "ratio=%.3f\n",
        bytes, inputs, reduceGBps, addGBps, reduceGBps / addGBps);
    std::fflush(stdout);
  }
}

// ---- daemons ---------------------------------------------------------------------------------

pid_t spawnDaemon(const std::vector<std::string>& args) {
  return bench::spawnChild(COFAB_AGGD_PATH, args);
}

void stopDaemons(const std::vector<pid_t>& pids, int sig) {
  for (pid_t p : pids) kill(p, sig);
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
  }
}

std::vector<pid_t> startDaemons(const std::string& storeUrl, const std::string& prefix, int servers,
                                int workers, bool replication) {
  std::vector<pid_t> pids;
  for (int i = 0; i < servers; ++i) {
    pids.push_back(spawnDaemon({COFAB_AGGD_PATH, "--store", storeUrl, "--store-prefix", prefix,
                                "--workers", std::to_string(workers), "--id", std::to_string(i),
                                "--servers", std::to_string(servers), "--engines", "1", "--http",
                                "off", "--replication", replication ? "on" : "off"}));
  }
  return pids;
}

// ---- 2. push-pull vs ring allreduce ----------------------------------------------------------

struct Times {
  double pushPullMs = -1;
  double ringMs = -1;
  double pushPullCpuMs = -1;
  double ringCpuMs = -1;
};

double cpuMs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

enum class Mode { kDedicated, kColocated, kColocatedTcp };
const char* modeName(Mode m) {
  return m == Mode::kDedicated   ? "dedicated"
         : m == Mode::kColocated ? "colocated"
                                 : "colocated_tcp";
}

Status barrier(Store& store, const std::string& name, int ranks) {
  COFAB_ASSIGN_OR_RETURN(int64_t n, store.add(name, 1));
  (void)n;
  for (;;) {
    COFAB_ASSIGN_OR_RETURN(Bytes v, store.get(name, Deadline::afterMs(60000)));
    if (std::atoll(toString(v).c_str()) >= ranks) return OkStatus();
    std::this_thread::sleep_for(Millis(1));
  }
}

// One worker process: push-pull (dedicated or colocated) and ring allreduce on the same data,
// taking turns in blocks; both are measured with the push-pull client (and a colocated shard)
// open, idle while the ring runs.
int workerMain(int rank, int ranks, const std::string& storeUrl, const std::string& tag, Mode mode,
               size_t bytes, int iters, int blocks) {
  const bool colocated = mode != Mode::kDedicated;
  auto storeOr = openStore(storeUrl, Deadline::afterMs(30000));
  if (!storeOr.ok()) return 2;
  Store& store = **storeOr;
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  const TensorView view = TensorView::of(data.data(), data.size(), DType::kF32);
  std::unique_ptr<aggregator::AggregatorServer> local;
  ps::ClientOptions co;
  if (colocated) {
    aggregator::ServerOptions so;
    so.id = rank;
    so.numServers = ranks;
    so.numWorkers = ranks;
    so.engineThreads = 1;
    so.listenAddress = "127.0.0.1:0";
    auto s = aggregator::AggregatorServer::create(so);
    if (!s.ok()) {
      std::fprintf(stderr, "colocated shard: %s\n", s.status().toString().c_str());
      return 3;
    }
    local = std::move(s).value();
    (void)store.set(tag + "/shard/" + std::to_string(rank), toBytes(local->address()));
    for (int r = 0; r < ranks; ++r) {
      auto a = store.get(tag + "/shard/" + std::to_string(r), Deadline::afterMs(30000));
      if (!a.ok()) return 4;
      co.serverAddresses.push_back(toString(*a));
    }
    if (mode == Mode::kColocated) {
      auto end = local->connectInProcess(rank);
      if (!end.ok()) return 4;
      co.inProcess.emplace_back(rank, std::move(end).value());
    }
  } else {
    co.storePrefix = tag + "/agg";
  }
  auto client = ps::PushPullClient::connect(store, rank, ranks, co);
  if (!client.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, client.status().toString().c_str());
    return 5;
  }
  Status s = (*client)->pushPull(1, view, view).wait(Deadline::afterMs(120000));  // warm-up
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.toString().c_str());
    return 6;
  }
  comm::CommOptions cc;
  cc.name = tag + "/ring";
  auto commOr = comm::Communicator::create(rank, ranks, &store, cc);
  comm::AllreduceOptions ao;
  ao.algorithm = comm::AllreduceAlgorithm::kRing;
  ao.timeout = std::chrono::seconds(120);
  bool ringOk = commOr.ok() && comm::allreduce(**commOr, view, ao).ok();  // warm-up
  if (!ringOk) {
    std::fprintf(stderr, "rank %d: ring skipped: %s\n", rank,
                 commOr.ok() ? "warm-up failed" : commOr.status().toString().c_str());
  }
  // The two methods take turns in blocks of a few ops, so that a drift of the VM's speed over
  // the run (seen here: 20% within a minute) weighs on both alike instead of on whichever ran
  // second.
  Times t{0, 0, 0, 0};
  int ppDone = 0, ringDone = 0;
  for (int block = 0; block < blocks; ++block) {
    const int n = iters / blocks + (block < iters % blocks ? 1 : 0);
    const std::string b = tag + "/b" + std::to_string(block);
    if (!barrier(store, b + "p", ranks).ok()) return 7;
    double t0 = nowMs();
    double c0 = cpuMs();
    for (int i = 0; i < n; ++i) {
      s = (*client)->pushPull(1, view, view).wait(Deadline::afterMs(120000));
      if (!s.ok()) return 8;
    }
    t.pushPullMs += nowMs() - t0;
    t.pushPullCpuMs += cpuMs() - c0;
    ppDone += n;
    // The ring runs only while it has worked on every rank: each rank says how it went before
    // the barrier and all read the same count after it, so no rank waits in an allreduce (or at
    // a barrier) that another rank has given up on.
    if (!store.add(b + "rf", ringOk ? 0 : 1).ok()) return 7;
    if (!barrier(store, b + "r", ranks).ok()) return 7;
    auto ringFailures = store.get(b + "rf", Deadline::afterMs(60000));
    if (!ringFailures.ok()) return 7;
    ringOk = std::atoll(toString(*ringFailures).c_str()) == 0;
    if (!ringOk) continue;
    t0 = nowMs();
    c0 = cpuMs();
    for (int i = 0; i < n && ringOk; ++i) ringOk = comm::allreduce(**commOr, view, ao).ok();
    t.ringMs += nowMs() - t0;
    t.ringCpuMs += cpuMs() - c0;
    ringDone += n;
  }
  (*client)->close();
  t.pushPullMs /= ppDone;
  t.pushPullCpuMs /= ppDone;
  if (ringOk && ringDone > 0) {
    t.ringMs /= ringDone;
    t.ringCpuMs /= ringDone;
  } else {
    t.ringMs = t.ringCpuMs = -1;
  }
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%.3f %.3f %.3f %.3f", t.pushPullMs, t.ringMs, t.pushPullCpuMs,
                t.ringCpuMs);
  (void)store.set(tag + "/times/" + std::to_string(rank), toBytes(buf));
  if (!barrier(store, tag + "/b3", ranks).ok()) return 9;
  if (local) local->shutdown("bench done");
  return 0;
}

double glooMs(int ranks, size_t bytes) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto gloo = self.parent_path().parent_path() / "comm" / "gloo_allreduce_bench";
  if (ec || !std::filesystem::exists(gloo)) return -1;
  const std::string cmd = gloo.string() + " --ranks " + std::to_string(ranks) + " --sizes " +
                          std::to_string(bytes) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char line[512];
  double ms = -1;
  while (std::fgets(line, sizeof(line), p)) {
    const char* r = std::strstr(line, "RESULT gloo_allreduce");
    const char* m = r ? std::strstr(r, " ms=") : nullptr;
    if (m) ms = std::atof(m + 4);
  }
  pclose(p);
  return ms;
}

void benchPushPull(const std::string& dir, int ranks, size_t bytes, int iters, int blocks,
                   Mode benchMode, double gloo) {
  const bool colocated = benchMode != Mode::kDedicated;
  static int run = 0;
  const std::string tag = "run" + std::to_string(run++);
  const std::string storeUrl = "file://" + dir;
  std::vector<pid_t> daemons;
  if (!colocated) daemons = startDaemons(storeUrl, tag + "/agg", 2, ranks, false);
  std::vector<pid_t> workers;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      _exit(workerMain(r, ranks, storeUrl, tag, benchMode, bytes, iters, blocks));
    }
    workers.push_back(pid);
  }
  bool ok = true;
  for (pid_t p : workers) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ok = false;
      std::fprintf(stderr, "worker pid %d failed (status %d)\n", p, st);
    }
  }
  stopDaemons(daemons, SIGTERM);
  if (!ok) return;
  auto store = openStore(storeUrl, Deadline::afterMs(5000));
  double pp = 0, ring = 0, ppCpu = 0, ringCpu = 0;
  for (int r = 0; r < ranks; ++r) {
    auto v = (*store)->get(tag + "/times/" + std::to_string(r), Deadline::afterMs(5000));
    double a = -1, b = -1, c = -1, d = -1;
    if (v.ok()) std::sscanf(toString(*v).c_str(), "%lf %lf %lf %lf", &a, &b, &c, &d);
    pp = std::max(pp, a);
    ring = (b < 0 || ring < 0) ? -1 : std::max(ring, b);
    ppCpu += c;
    ringCpu = (d < 0 || ringCpu < 0) ? -1 : ringCpu + d;
  }
  const char* mode = modeName(benchMode);
  std::printf(
      "push-pull %zu B, %d workers, %s: %.1f ms/op (cpu %.1f ms); ring allreduce %.1f ms (cpu "
      "%.1f ms); gloo %.1f ms\n",
      bytes, ranks, mode, pp, ppCpu, ring, ringCpu, gloo);
  std::printf(
      "RESULT pushpull bytes=%zu ranks=%d mode=%s cofab_ms=%.1f ring_ms=%.1f gloo_ms=%.1f "
      "cofab_cpu_ms=%.1f ring_cpu_ms=%.1f",
      bytes, ranks, mode, pp, ring, gloo, ppCpu, ringCpu);
  if (ring > 0) std::printf(" vs_ring=%.2f", pp / ring);
  if (gloo > 0) std::printf(" vs_gloo=%.2f", pp / gloo);
  std::printf("\n");
  std::fflush(stdout);
}

// ---- 3. failover pause -----------------------------------------------------------------------

void benchFailover(const std::string& dir) {
  const std::string storeUrl = "file://" + dir;
  const int workers = 2;
  const int64_t heartbeatMs = 100, failoverMs = 500;
  auto daemons = startDaemons(storeUrl, "failover/agg", 2, workers, true);
  auto store = openStore(storeUrl, Deadline::afterMs(10000));
  if (!store.ok()) return;
  std::atomic<int> progress{0};
  std::atomic<double> killAt{0};
  // Completion times per worker; the pause is the longest stall after the kill (from the kill
  // to the first completion, or between two completions).
  std::vector<std::vector<double>> done(workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      ps::ClientOptions co;
      co.storePrefix = "failover/agg";
      co.replication = 1;
      co.heartbeatMs = heartbeatMs;
      co.failoverMs = failoverMs;
      co.chunkBytes = 256 << 10;  // 4 chunks per op: every op touches both daemons
      auto client = ps::PushPullClient::connect(**store, r, workers, co);
      if (!client.ok()) return;
      std::vector<float> x(256 << 10, 1.0f);
      const TensorView v = TensorView::of(x.data(), x.size(), DType::kF32);
      int afterKill = 0;
      for (int it = 0; it < 2000 && afterKill < 30; ++it) {
        if (!(*client)->pushPull(1, v, v).wait(Deadline::afterMs(30000)).ok()) return;
        done[static_cast<size_t>(r)].push_back(nowMs());
        if (r == 0) progress = it;
        if (killAt.load() > 0) ++afterKill;
      }
      (*client)->close();
    });
  }
  while (progress < 30) std::this_thread::sleep_for(Millis(1));
  killAt = nowMs();
  kill(daemons[0], SIGKILL);
  for (auto& t : threads) t.join();
  stopDaemons({daemons[0]}, 0);
  stopDaemons({daemons[1]}, SIGTERM);
  double pause = 0;
  for (const auto& times : done) {
    double prev = killAt.load();
    for (double t : times) {
      if (t < killAt.load()) continue;
      pause = std::max(pause, t - prev);
      prev = t;
    }
  }
  std::printf("failover pause: %.1f ms (heartbeat %lld ms, failover deadline %lld ms)\n", pause,
              static_cast<long long>(heartbeatMs), static_cast<long long>(failoverMs));
  std::printf(
      "RESULT failover pause_ms=%.1f heartbeat_ms=%lld failover_deadline_ms=%lld "
      "within_2x_deadline=%d\n",
      pause, static_cast<long long>(heartbeatMs), static_cast<long long>(failoverMs),
      pause <= 2.0 * failoverMs ? 1 : 0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  const auto workerCounts = parseInts(arg(argc, argv, "--workers", "2,4"));
  const size_t bytes = bench::parseSize(arg(argc, argv, "--bytes", "64M"));
  const int iters = std::max(1, std::atoi(arg(argc, argv, "--iters", "5").c_str()));
  // Push-pull and ring alternate in this many blocks of iters/blocks ops each (at least 1 op).
  const int blocks = std::clamp(std::atoi(arg(argc, argv, "--blocks", "4").c_str()), 1,
                                std::max(iters, 1));
  const std::string dir = bench::makeTempDir("cofab-aggbench");
  if (dir.empty()) return 1;
  const std::string modes = arg(argc, argv, "--modes", "dedicated,colocated");
  if (!flag(argc, argv, "--skip-reduce")) benchReduction(bytes);
  for (int n : workerCounts) {
    const double gloo = glooMs(n, bytes);
    for (Mode m : {Mode::kDedicated, Mode::kColocated, Mode::kColocatedTcp}) {
      // Whole names in the comma list: "colocated" must not select colocated_tcp.
      if (("," + modes + ",").find(std::string(",") + modeName(m) + ",") == std::string::npos) {
        continue;
      }
      benchPushPull(dir + "/" + modeName(m) + std::to_string(n), n, bytes, iters, blocks, m, gloo);
    }
  }
  if (!flag(argc, argv, "--skip-failover")) benchFailover(dir + "/f");
  std::filesystem::remove_all(dir);
  return 0;
}

// cofab_transfer_bench: what the transfer manager's scheduling buys, in one run.
//
//   cofab_transfer_bench [--models vgg16,resnet50,transformer] [--iters 2] [--rounds 5]
//                        [--chunk-bytes 524288] [--inflight 1] [--outstanding 8]
//                        [--byte-scale 0.125] [--compute-scale 1.0] [--credit-chunks 8]
//                        [--trace-dir D] [--skip-incast] [--skip-central]
//
// 1. Incast: 4 workers (threads, one PushPullClient each, TCP loopback) push at once to one
//    aggregator (in-process AggregatorServer, 1 engine), uncredited and then credited
//    (--credit-bytes = --credit-chunks chunks, default 8): throughput per worker and the
//    aggregator's maximum receive backlog (payload received and not yet consumed), credit
//    violations (must be 0).
// 1b. Central scheduling vs credits (--skip-central to skip): the same incast through a
//    TransferManager (8 units in flight) with the same job-wide bound on the aggregator's
//    backlog, 4 x --credit-chunks chunks: credits of a quarter of it per worker vs an
//    in-process CentralScheduler (cofab-sched's service) granting all of it per daemon.
// 2. DNN replay (bench/transfer/models/*.csv, see README.md): 4 worker processes (fork) over TCP
//    through 2 cofab-aggd daemons. Each iteration: forward pass layer 0..L-1, waiting before each
//    layer for that layer's reduced gradient of the previous iteration, then sleeping fwd_ms;
//    backward pass L-1..0, sleeping bwd_ms and handing the layer's gradient to the
//    TransferManager as soon as it is produced. Modes, interleaved per round so that machine
//    load drifts hit all alike: fifo, priority (P3/ByteScheduler), priority_central (priority
//    with grants from an in-process CentralScheduler, default budget) and no_overlap
//    (communication only after the whole backward pass, and the next forward only after all of
//    it). Gradient bytes are multiplied by --byte-scale (default 1/8) and compute times by
//    --compute-scale so that the run is communication-bound on this machine; the bench measures
//    and prints the communication-only and compute-only times so that this can be checked.
// Ends with RESULT lines (DESIGN.md §7).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "bench/support/bench_util.h"
#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/store.h"
#include "fabric/transfer/central_scheduler.h"
#include "fabric/transfer/transfer_manager.h"

using namespace cofab;

namespace {

using bench::nowMs;
std::string arg(int argc, char** argv, const std::string& name, const std::string& def) {
  return bench::argValue(argc, argv, name, def);
}
bool flag(int argc, char** argv, const std::string& name) {
  return bench::hasFlag(argc, argv, name);
}
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ---- 1. incast ------------------------------------------------------------------------------

struct IncastResult {
  double mbps = 0;  // per worker, payload pushed
  uint64_t backlogMaxBytes = 0;
  uint64_t backlogMaxChunks = 0;
  uint64_t violations = 0;
  uint64_t outstandingMax = 0;
};

// managed: the workers push through a TransferManager (8 units in flight); schedBytes > 0: in
// central mode, with an in-process CentralScheduler granting at most schedBytes per daemon.
IncastResult runIncast(size_t creditBytes, size_t chunkBytes, size_t bytesPerWorker, int rounds,
                       bool managed = false, uint64_t schedBytes = 0) {
  const int workers = 4;
  aggregator::ServerOptions so;
  so.numWorkers = workers;
  so.engineThreads = 1;
  so.listenAddress = "127.0.0.1:0";
  so.creditBytes = creditBytes;
  auto server = aggregator::AggregatorServer::create(so);
  IncastResult r;
  if (!server.ok()) {
    std::fprintf(stderr, "incast server: %s\n", server.status().toString().c_str());
    return r;
  }
  std::unique_ptr<transfer::CentralScheduler> sched;
  if (schedBytes > 0) {
    transfer::SchedulerOptions sco;
    sco.destBytes = schedBytes;
    sco.listenAddress = "127.0.0.1:0";
    auto s = transfer::CentralScheduler::create(sco);
    if (!s.ok()) {
      std::fprintf(stderr, "incast scheduler: %s\n", s.status().toString().c_str());
      return r;
    }
    sched = std::move(s).value();
  }
  std::vector<double> elapsed(workers, 0);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      ps::ClientOptions co;
      co.serverAddresses = {(*server)->address()};
      co.chunkBytes = chunkBytes;
      co.credits = creditBytes > 0 ? 1 : 0;
      auto client = ps::PushPullClient::connect(w, workers, co);
      if (!client.ok()) {
        std::fprintf(stderr, "incast worker %d: %s\n", w, client.status().toString().c_str());
        return;
      }
      std::vector<float> x(bytesPerWorker / sizeof(float), 1.0f);
      const TensorView v = TensorView::of(x.data(), x.size(), DType::kF32);
      if (managed) {
        std::unique_ptr<transfer::SchedClient> sc;
        transfer::TransferOptions to;
        to.maxInFlight = 8;
        to.maxOutstanding = 16;
        if (sched) {
          transfer::SchedClientOptions sco;
          sco.address = sched->address();
          auto c = transfer::SchedClient::connect(w, sco);
          if (!c.ok()) {
            std::fprintf(stderr, "incast worker %d: %s\n", w, c.status().toString().c_str());
            return;
          }
          sc = std::move(c).value();
          to.scheduler = sc.get();
        }
        auto mgr = transfer::TransferManager::create(**client, to);
        if (!mgr.ok()) return;
        auto once = [&](uint64_t key) {
          transfer::GradientUpdate g;
          g.key = key;
          g.tensor = v;
          const Status st = (*mgr)->enqueue(g).wait(Deadline::afterMs(120000));
          if (!st.ok()) std::fprintf(stderr, "incast worker %d: %s\n", w, st.toString().c_str());
          return st.ok();
        };
        if (!once(0)) return;
        ready++;
        while (ready.load() < workers) std::this_thread::yield();
        const double t0 = nowMs();
        for (int i = 0; i < rounds; ++i) {
          if (!once(1)) return;
        }
        elapsed[static_cast<size_t>(w)] = nowMs() - t0;
        mgr->reset();
        (*client)->close();
        return;
      }
      // Warm-up, then all four start together.
      if (!(*client)->pushPull(0, v, v).wait(Deadline::afterMs(120000)).ok()) return;
      ready++;
      while (ready.load() < workers) std::this_thread::yield();
      const double t0 = nowMs();
      for (int i = 0; i < rounds; ++i) {
        if (!(*client)->pushPull(1, v, v).wait(Deadline::afterMs(120000)).ok()) return;
      }
      elapsed[static_cast<size_t>(w)] = nowMs() - t0;
      (*client)->close();
    });
  }
  for (auto& t : threads) t.join();
  double worst = 0;
  for (double e : elapsed) worst = std::max(worst, e);
  const auto& m = (*server)->metrics();
  r.mbps = worst > 0 ? static_cast<double>(bytesPerWorker) * rounds / (worst * 1e3) : 0;
  r.backlogMaxBytes = m.backlogMaxBytes.load();
  r.backlogMaxChunks = m.backlogMaxChunks.load();
  r.violations = m.creditViolations.load();
  r.outstandingMax = m.creditOutstandingMax.load();
  (*server)->shutdown("bench done");
  if (sched) {
    r.outstandingMax = sched->stats().destinations[0].maxLoad;
    sched->shutdown();
  }
  return r;
}

// Central scheduling vs credits, both through the TransferManager, with the same job-wide bound
// on the aggregator's receive backlog: credits of `budget / 4` per worker vs a scheduler budget
// of `budget` for the daemon. Pairs back to back, median of the per-pair ratios.
void benchIncastCentral(size_t windowChunks) {
  const size_t chunk = 256 << 10, bytes = 32 << 20;
  const size_t budget = 4 * windowChunks * chunk;
  const int rounds = 3;
  std::vector<double> cm, sm, ratios;
  uint64_t cBacklog = 0, sBacklog = 0, sLoad = 0;
  for (int rep = 0; rep < 4; ++rep) {
    IncastResult c = runIncast(budget / 4, chunk, bytes, rounds, true, 0);
    IncastResult s = runIncast(0, chunk, bytes, rounds, true, budget);
    cm.push_back(c.mbps);
    sm.push_back(s.mbps);
    if (c.mbps > 0) ratios.push_back(s.mbps / c.mbps);
    cBacklog = std::max(cBacklog, c.backlogMaxBytes);
    sBacklog = std::max(sBacklog, s.backlogMaxBytes);
    sLoad = std::max(sLoad, s.outstandingMax);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf(
      "incast via TransferManager, job-wide budget %zu KiB at the aggregator:\n"
      "  credits (%zu KiB per worker): %.1f MB/s per worker, max backlog %.1f MiB\n"
      "  central (cofab-sched, %zu KiB per daemon): %.1f MB/s per worker, max backlog %.1f MiB, "
      "max granted-undelivered %.1f MiB\n",
      budget >> 10, (budget / 4) >> 10, med(cm), cBacklog / 1048576.0, budget >> 10, med(sm),
      sBacklog / 1048576.0, sLoad / 1048576.0);
  std::printf(
      "RESULT transfer_incast_central workers=4 bytes=%zu chunk=%zu budget=%zu credited_mbps=%.1f "
      "central_mbps=%.1f central_over_credited=%.3f credited_max_backlog_bytes=%llu "
      "central_max_backlog_bytes=%llu central_max_load_bytes=%llu\n",
      bytes, chunk, budget, med(cm), med(sm), med(ratios),
      static_cast<unsigned long long>(cBacklog), static_cast<unsigned long long>(sBacklog),
      static_cast<unsigned long long>(sLoad));
  std::fflush(stdout);
}

void benchIncast(size_t windowChunks) {
  const size_t chunk = 256 << 10, bytes = 32 << 20;
  const size_t window = windowChunks * chunk;
  const int rounds = 3;
  // Alternate the two modes; each pair runs back to back, so the median of the per-pair ratios
  // is robust to the load drifts of a shared machine. Throughputs: medians; backlogs: maxima.
  IncastResult plain, credited;
  std::vector<double> plainMbps, creditedMbps, ratios;
  for (int rep = 0; rep < 6; ++rep) {
    IncastResult p = runIncast(0, chunk, bytes, rounds);
    IncastResult c = runIncast(window, chunk, bytes, rounds);
    plainMbps.push_back(p.mbps);
    creditedMbps.push_back(c.mbps);
    if (p.mbps > 0) ratios.push_back(c.mbps / p.mbps);
    plain.backlogMaxBytes = std::max(plain.backlogMaxBytes, p.backlogMaxBytes);
    credited.backlogMaxBytes = std::max(credited.backlogMaxBytes, c.backlogMaxBytes);
    credited.violations += c.violations;
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  plain.mbps = med(plainMbps);
  credited.mbps = med(creditedMbps);
  const double ratio = med(ratios);
  std::printf(
      "incast: 4 workers x %zu MiB push-pull to 1 aggregator, %zu KiB chunks\n"
      "  uncredited: %.1f MB/s per worker, max backlog %.1f MiB\n"
      "  credited (window %zu KiB per worker): %.1f MB/s per worker, max backlog %.1f MiB "
      "(bound 4 x window = %.1f MiB), violations %llu\n",
      bytes >> 20, chunk >> 10, plain.mbps, plain.backlogMaxBytes / 1048576.0, window >> 10,
      credited.mbps, credited.backlogMaxBytes / 1048576.0, 4.0 * window / 1048576.0,
      static_cast<unsigned long long>(credited.violations));
  std::printf(
      "RESULT transfer_incast workers=4 bytes=%zu chunk=%zu window=%zu uncredited_mbps=%.1f "
      "credited_mbps=%.1f throughput_ratio=%.3f uncredited_max_backlog_bytes=%llu "
      "credited_max_backlog_bytes=%llu violations=%llu\n",
      bytes, chunk, window, plain.mbps, credited.mbps, ratio,
      static_cast<unsigned long long>(plain.backlogMaxBytes),
      static_cast<unsigned long long>(credited.backlogMaxBytes),
      static_cast<unsigned long long>(credited.violations));
  std::fflush(stdout);
}

// ---- 2. DNN replay --------------------------------------------------------------------------

struct Layer {
  std::string name;
  size_t bytes = 0;
  double fwdMs = 0;
  double bwdMs = 0;
};

std::vector<Layer> loadModel(const std::string& path, double byteScale, double computeScale) {
  std::ifstream in(path);
  std::vector<Layer> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("layer,", 0) == 0) continue;
    std::stringstream ss(line);
    std::string idx, name, bytes, fwd, bwd;
    std::getline(ss, idx, ',');
    std::getline(ss, name, ',');
    std::getline(ss, bytes, ',');
    std::getline(ss, fwd, ',');
    std::getline(ss, bwd, ',');
    Layer l;
    l.name = name;
    const double b = std::atof(bytes.c_str()) * byteScale;
    l.bytes = std::max<size_t>(4, static_cast<size_t>(b) / 4 * 4);
    l.fwdMs = std::atof(fwd.c_str()) * computeScale;
    l.bwdMs = std::atof(bwd.c_str()) * computeScale;
    out.push_back(l);
  }
  return out;
}

void sleepMs(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

enum class Mode { kFifo, kPriority, kNoOverlap, kCommOnly, kCentral };
constexpr int kModes = 5;
const char* modeName(Mode m) {
  switch (m) {
    case Mode::kFifo:
      return "fifo";
    case Mode::kPriority:
      return "priority";
    case Mode::kNoOverlap:
      return "no_overlap";
    case Mode::kCommOnly:
      return "comm_only";
    case Mode::kCentral:
      return "priority_central";
  }
  return "?";
}

// One worker process: every mode, `iters` iterations each per round, `rounds` rounds.
// Writes "<mode> <ms per iteration>" lines to <dir>/times.<rank>.
int replayWorker(int rank, int workers, const std::string& storeUrl, const std::string& prefix,
                 const std::vector<Layer>& model, int iters, int rounds, const std::string& dir,
                 size_t chunkBytes, int inflight, int outstanding) {
  auto store = openStore(storeUrl, Deadline::afterMs(30000));
  if (!store.ok()) return 2;
  ps::ClientOptions co;
  co.storePrefix = prefix;
  co.chunkBytes = chunkBytes;
  auto client = ps::PushPullClient::connect(**store, rank, workers, co);
  if (!client.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", rank, client.status().toString().c_str());
    return 3;
  }
  const size_t L = model.size();
  std::vector<std::vector<float>> grads(L);
  for (size_t l = 0; l < L; ++l) grads[l].assign(model[l].bytes / sizeof(float), 0.5f);
  std::ofstream times(dir + "/times." + std::to_string(rank));
  const Mode modes[] = {Mode::kFifo, Mode::kPriority, Mode::kNoOverlap, Mode::kCommOnly,
                        Mode::kCentral};
  // priority_central: priority ordering with grants from the CentralScheduler the parent runs
  // (registered under "<prefix>/sched").
  transfer::SchedClientOptions sco;
  sco.storePrefix = prefix + "/sched";
  sco.connectTimeoutMs = 30000;
  auto sched = transfer::SchedClient::connect(**store, rank, sco);
  if (!sched.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", rank, sched.status().toString().c_str());
    return 3;
  }
  for (int round = -1; round < rounds; ++round) {  // round -1: warm-up, not recorded
    for (Mode mode : modes) {
      transfer::TransferOptions to;
      to.policy = mode == Mode::kPriority || mode == Mode::kCentral ? "priority" : "fifo";
      if (mode == Mode::kCentral) to.scheduler = sched->get();
      to.maxInFlight = inflight;
      to.maxOutstanding = outstanding;
      auto mgr = transfer::TransferManager::create(**client, to);
      if (!mgr.ok()) return 4;
      std::vector<transfer::TransferHandle> pending(L);
      auto enqueueLayer = [&](size_t l, uint64_t it) {
        transfer::GradientUpdate g;
        g.key = l;
        g.tensor = TensorView::of(grads[l].data(), grads[l].size(), DType::kF32);
        g.iteration = it;
        g.priority = static_cast<int>(l);
        pending[l] = (*mgr)->enqueue(g);
      };
      auto waitLayer = [&](size_t l) -> bool {
        if (!pending[l].valid()) return true;
        Status s = pending[l].wait(Deadline::afterMs(120000));
        if (!s.ok()) std::fprintf(stderr, "worker %d: %s\n", rank, s.toString().c_str());
        pending[l] = {};
        return s.ok();
      };
      // Steady state: iteration k runs from the start of its forward pass (including the waits
      // for the previous iteration's results) to the start of the next one; iteration 0 only
      // fills the pipeline and is not counted.
      double t0 = 0;
      for (int it = 0; it <= iters; ++it) {
        if (it == 1) t0 = nowMs();
        // Forward: each layer needs its reduced gradient of the previous iteration.
        for (size_t l = 0; l < L; ++l) {
          if (!waitLayer(l)) return 5;
          if (mode != Mode::kCommOnly) sleepMs(model[l].fwdMs);
        }
        // Backward: gradients appear from the last layer to the first.
        for (size_t l = L; l-- > 0;) {
          if (mode != Mode::kCommOnly) sleepMs(model[l].bwdMs);
          if (mode == Mode::kFifo || mode == Mode::kPriority) {
            enqueueLayer(l, static_cast<uint64_t>(it));
          }
        }
        if (mode == Mode::kNoOverlap || mode == Mode::kCommOnly) {
          for (size_t l = L; l-- > 0;) enqueueLayer(l, static_cast<uint64_t>(it));
          (*mgr)->flush();
          for (size_t l = 0; l < L; ++l) {
            if (!waitLayer(l)) return 5;
          }
        } else {
          (*mgr)->flush();
        }
      }
      const double ms = (nowMs() - t0) / iters;
      for (size_t l = 0; l < L; ++l) {
        if (!waitLayer(l)) return 5;
      }
      if (round >= 0) times << modeName(mode) << ' ' << ms << '\n';
      if (rank == 0 && round == rounds - 1 && mode == Mode::kPriority && !dir.empty()) {
        (void)(*mgr)->writeTrace(dir + "/trace.priority.json");
      }
    }
  }
  times.close();
  (*client)->close();
  return 0;
}

pid_t spawnDaemon(const std::vector<std::string>& args) {
  return bench::spawnChild(COFAB_AGGD_PATH, args);
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void benchReplay(const std::string& modelName, const std::string& csv, const std::string& dir,
                 double byteScale, double computeScale, int iters, int rounds,
                 const std::string& traceOut, size_t chunkBytes, int inflight, int outstanding) {
  const auto model = loadModel(csv, byteScale, computeScale);
  if (model.empty()) {
    std::fprintf(stderr, "no layers in %s\n", csv.c_str());
    return;
  }
  std::filesystem::create_directories(dir);
  const int workers = 4, servers = 2;
  const std::string storeUrl = "file://" + dir + "/store";
  const std::string prefix = modelName + "/agg";
  std::vector<pid_t> daemons;
  for (int i = 0; i < servers; ++i) {
    daemons.push_back(
        spawnDaemon({COFAB_AGGD_PATH, "--store", storeUrl, "--store-prefix", prefix, "--workers",
                     std::to_string(workers), "--id", std::to_string(i), "--servers",
                     std::to_string(servers), "--engines", "1", "--http", "off"}));
  }
  // The central scheduler for the priority_central mode, in this process (the workers fork
  // from it but never touch it).
  transfer::SchedulerOptions so;
  so.numDestinations = servers;
  so.listenAddress = "127.0.0.1:0";
  auto sched = transfer::CentralScheduler::create(so);
  auto pstore = openStore(storeUrl, Deadline::afterMs(30000));
  if (!sched.ok() || !pstore.ok() ||
      !(*pstore)
           ->set(transfer::schedulerAddressKey(prefix + "/sched"),
                 Bytes((*sched)->address().begin(), (*sched)->address().end()))
           .ok()) {
    std::fprintf(stderr, "replay: cannot start the central scheduler\n");
    for (pid_t p : daemons) kill(p, SIGTERM);
    for (pid_t p : daemons) waitpid(p, nullptr, 0);
    return;
  }
  std::vector<pid_t> kids;
  for (int r = 0; r < workers; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      _exit(replayWorker(r, workers, storeUrl, prefix, model, iters, rounds, dir, chunkBytes,
                         inflight, outstanding));
    }
    kids.push_back(pid);
  }
  bool ok = true;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ok = false;
      std::fprintf(stderr, "replay worker pid %d failed (status %d)\n", p, st);
    }
  }
  for (pid_t p : daemons) kill(p, SIGTERM);
  for (pid_t p : daemons) waitpid(p, nullptr, 0);
  if (!ok) return;
  // Per round and mode: the slowest worker; then the median over rounds.
  std::vector<std::vector<double>> perMode(kModes,
                                           std::vector<double>(static_cast<size_t>(rounds), 0));
  for (int r = 0; r < workers; ++r) {
    std::ifstream in(dir + "/times." + std::to_string(r));
    std::string mode;
    double ms;
    std::vector<int> seen(kModes, 0);
    while (in >> mode >> ms) {
      for (int m = 0; m < kModes; ++m) {
        if (mode == modeName(static_cast<Mode>(m)) && seen[m] < rounds) {
          auto& slot = perMode[static_cast<size_t>(m)][static_cast<size_t>(seen[m]++)];
          slot = std::max(slot, ms);
        }
      }
    }
  }
  const double fifo = median(perMode[0]), prio = median(perMode[1]), none = median(perMode[2]),
               comm = median(perMode[3]), central = median(perMode[4]);
  double fwd = 0, bwd = 0, bytes = 0;
  for (const auto& l : model) {
    fwd += l.fwdMs;
    bwd += l.bwdMs;
    bytes += static_cast<double>(l.bytes);
  }
  std::printf(
      "dnn_replay %s: %zu layers, %.1f MB of gradients per worker per iteration (x%.4f of the "
      "model), compute fwd %.1f + bwd %.1f ms; communication alone %.1f ms/iteration "
      "(%s-bound)\n  fifo %.1f ms, priority %.1f ms (%.3f x fifo), no overlap %.1f ms, "
      "priority with central scheduling %.1f ms\n",
      modelName.c_str(), model.size(), bytes / 1e6, byteScale, fwd, bwd, comm,
      comm > fwd + bwd ? "communication" : "compute", fifo, prio, fifo > 0 ? prio / fifo : 0, none,
      central);
  std::printf(
      "RESULT dnn_replay model=%s workers=%d fifo_ms=%.1f priority_ms=%.1f no_overlap_ms=%.1f "
      "comm_only_ms=%.1f compute_ms=%.1f priority_vs_fifo=%.3f byte_scale=%.4f chunk=%zu "
      "inflight=%d outstanding=%d rounds=%d priority_central_ms=%.1f\n",
      modelName.c_str(), workers, fifo, prio, none, comm, fwd + bwd, fifo > 0 ? prio / fifo : 0,
      byteScale, chunkBytes, inflight, outstanding, rounds, central);
  std::fflush(stdout);
  if (!traceOut.empty() && std::filesystem::exists(dir + "/trace.priority.json")) {
    std::error_code ec;
    std::filesystem::copy_file(dir + "/trace.priority.json", traceOut,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (!ec) std::printf("trace (priority, worker 0, last round): %s\n", traceOut.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  const auto models = split(arg(argc, argv, "--models", "vgg16,resnet50,transformer"));
  const int iters = std::atoi(arg(argc, argv, "--iters", "2").c_str());
  const int rounds = std::atoi(arg(argc, argv, "--rounds", "5").c_str());
  const double byteScale = std::atof(arg(argc, argv, "--byte-scale", "0.125").c_str());
  const double computeScale = std::atof(arg(argc, argv, "--compute-scale", "1.0").c_str());
  const std::string modelDir = arg(argc, argv, "--model-dir", COFAB_TRANSFER_MODELS);
  const std::string traceDir = arg(argc, argv, "--trace-dir", "");
  const size_t chunkBytes =
      std::strtoull(arg(argc, argv, "--chunk-bytes", "524288").c_str(), nullptr, 10);
  const int inflight = std::atoi(arg(argc, argv, "--inflight", "1").c_str());
  const int outstanding = std::atoi(arg(argc, argv, "--outstanding", "8").c_str());
  const std::string dir = bench::makeTempDir("cofab-transferbench");
  if (dir.empty()) return 1;
  if (!flag(argc, argv, "--skip-incast")) {
    benchIncast(std::strtoull(arg(argc, argv, "--credit-chunks", "8").c_str(), nullptr, 10));
  }
  if (!flag(argc, argv, "--skip-central")) {
    benchIncastCentral(std::strtoull(arg(argc, argv, "--credit-chunks", "8").c_str(), nullptr, 10));
  }
  for (const auto& m : models) {
    benchReplay(m, modelDir + "/" + m + ".csv", dir + "/" + m, byteScale, computeScale, iters,
                rounds, traceDir.empty() ? "" : traceDir + "/transfer_" + m + ".json", chunkBytes,
                inflight, outstanding);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

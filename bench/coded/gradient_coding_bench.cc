// Gradient coding through the aggregator: round time with s = 1 and one worker 5x slower,
// against the same without the straggler, and against plain aggregation (every worker needed).
//
// One AggregatorServer (the cofab-aggd engine, in this process) and n = 4 worker threads with
// their own PushPullClients over tcp on loopback. A worker's "compute" is a sleep of
// partitions x partition_ms (the 2-core shared VM cannot run 4 real gradient computations in
// parallel; sleeping models the time while leaving the cores to the daemon and the clients);
// worker 3 takes 5x as long when it is the straggler. With gradient coding (s = 1, groups {0,1}
// and {2,3}) every worker computes s + 1 = 2 partitions, and a straggler still computing when
// its round completed abandons that round (as a real one would drop stale work). Without it
// every worker computes 1 partition and every round waits for all four.
//
//   gradient_coding_bench [--rounds=40] [--partition_ms=20] [--elems=262144]
//
// Ends with
//   RESULT gradient_coding n=4 s=1 coded_straggler_round_ms=... coded_round_ms=...
//          ratio=... uncoded_straggler_round_ms=... uncoded_round_ms=...
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "bench/support/result_reporter.h"
#include "fabric/coded/gradient_coding_client.h"
#include "fabric/ps/push_pull.h"

namespace cofab {
namespace {

constexpr int kWorkers = 4;
constexpr int kSlow = 3;

struct Flags {
  int rounds = 40;
  int partitionMs = 20;
  size_t elems = 262144;  // 1 MiB of f32 per gradient
};

// Round r is done once any worker has its result; everyone then starts round r + 1.
struct RoundClock {
  std::mutex mu;
  std::condition_variable cv;
  int done = -1;  // highest round done
  std::vector<double> roundMs;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  void finish(int round) {
    std::lock_guard<std::mutex> lock(mu);
    if (round <= done) return;
    const auto now = std::chrono::steady_clock::now();
    roundMs.push_back(std::chrono::duration<double, std::milli>(now - start).count());
    start = now;
    done = round;
    cv.notify_all();
  }
  void waitDone(int round) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done >= round; });
  }
  // Sleeps `ms` unless round `round` completes first; returns whether it completed.
  bool computeUnlessDone(int round, int ms) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return done >= round; });
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median round time. coded: --gradient-stragglers 1 and GradientCodingClient.
StatusOr<double> runRounds(const Flags& f, bool coded, bool straggler) {
  aggregator::ServerOptions so;
  so.numWorkers = kWorkers;
  so.listenAddress = "127.0.0.1:0";
  so.engine.gradientStragglers = coded ? 1 : -1;
  COFAB_ASSIGN_OR_RETURN(auto server, aggregator::AggregatorServer::create(so));
  RoundClock clock;
  std::vector<Status> status(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      status[w] = [&]() -> Status {
        ps::ClientOptions co;
        co.serverAddresses = {server->address()};
        COFAB_ASSIGN_OR_RETURN(auto client, ps::PushPullClient::connect(w, kWorkers, co));
        std::vector<float> partitionGrad(f.elems, 1.0f), out(f.elems);
        std::optional<coded::GradientCodingClient> gc;
        if (coded) {
          COFAB_ASSIGN_OR_RETURN(coded::GradientCodingClient g,
                                 coded::GradientCodingClient::create(client.get(), 1));
          gc.emplace(std::move(g));
        }
        const int partitions = coded ? 2 : 1;
        const int computeMs = partitions * f.partitionMs * (straggler && w == kSlow ? 5 : 1);
        for (int r = 0; r < f.rounds; ++r) {
          if (clock.computeUnlessDone(r, computeMs)) continue;  // abandoned: round already done
          ps::PushPullOptions po;
          po.iteration = static_cast<uint64_t>(r);
          ps::PushPullHandle h;
          if (coded) {
            std::vector<std::span<const float>> g(partitions, partitionGrad);
            COFAB_ASSIGN_OR_RETURN(h, gc->pushPull(1, g, out, po));
          } else {
            h = client->pushPull(1, TensorView(partitionGrad.data(), f.elems, DType::kF32),
                                 TensorView(out.data(), f.elems, DType::kF32), po);
          }
          COFAB_RETURN_IF_ERROR(h.wait(Deadline::afterMs(30000)));
          clock.finish(r);
          if (out[0] != static_cast<float>(kWorkers)) {
            return Internal("round " + std::to_string(r) + ": sum " + std::to_string(out[0]));
          }
          clock.waitDone(r);
        }
        client->close();
        return OkStatus();
      }();
      if (!status[w].ok()) clock.finish(f.rounds);  // unblock the others
    });
  }
  for (auto& t : threads) t.join();
  server->shutdown("bench done");
  for (const Status& s : status) COFAB_RETURN_IF_ERROR(s);
  // Round 0 includes connection setup: leave it out.
  std::vector<double> steady(clock.roundMs.begin() + 1, clock.roundMs.end());
  return median(steady);
}

}  // namespace
}  // namespace cofab

int main(int argc, char** argv) {
  using namespace cofab;
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--rounds=", 0) == 0)
      f.rounds = std::atoi(a.c_str() + 9);
    else if (a.rfind("--partition_ms=", 0) == 0)
      f.partitionMs = std::atoi(a.c_str() + 15);
    else if (a.rfind("--elems=", 0) == 0)
      f.elems = std::strtoull(a.c_str() + 8, nullptr, 10);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  std::printf(
      "# n=%d workers (threads), 1 in-process aggregator, %zu f32 per gradient, %d ms "
      "per partition (sleep), worker %d 5x slower as the straggler; 2-core shared VM\n",
      kWorkers, f.elems, f.partitionMs, kSlow);
  struct Run {
    const char* name;
    bool coded, straggler;
    double ms = 0;
  } runs[] = {{"coded s=1, straggler", true, true},
              {"coded s=1, none", true, false},
              {"uncoded, straggler", false, true},
              {"uncoded, none", false, false}};
  for (Run& r : runs) {
    StatusOr<double> ms = runRounds(f, r.coded, r.straggler);
    if (!ms.ok()) {
      std::fprintf(stderr, "%s: %s\n", r.name, ms.status().toString().c_str());
      return 1;
    }
    r.ms = *ms;
    std::printf("%-22s median round %.2f ms\n", r.name, r.ms);
  }
  using bench::num;
  bench::printResult("gradient_coding", {{"n", std::to_string(kWorkers)},
                                         {"s", "1"},
                                         {"coded_straggler_round_ms", num(runs[0].ms)},
                                         {"coded_round_ms", num(runs[1].ms)},
                                         {"ratio", num(runs[0].ms / runs[1].ms)},
                                         {"uncoded_straggler_round_ms", num(runs[2].ms)},
                                         {"uncoded_round_ms", num(runs[3].ms)},
                                         {"partition_ms", std::to_string(f.partitionMs)},
                                         {"rounds", std::to_string(f.rounds)}});
  return 0;
}

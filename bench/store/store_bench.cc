// TcpStore latency and throughput: set and get of small values from 1 and 4 clients, each
// client its own connection to one server on loopback (the server's single epoll thread is
// what is being measured); and a rendezvous barrier of N ranks (each sets its key, then waits
// for all N), the pattern of a job's startup, whose cost on the server must grow with the
// number of keys set times their waiters, not faster. Ends with RESULT lines.
#include <benchmark/benchmark.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/support/result_reporter.h"
#include "fabric/rendezvous/tcp_store.h"
#include "fabric/rendezvous/tcp_store_server.h"

namespace {

cofab::TcpStoreServer& server() {
  static std::unique_ptr<cofab::TcpStoreServer> s = [] {
    auto started = cofab::TcpStoreServer::start({});
    COFAB_CHECK(started.ok()) << started.status();
    return std::move(*started);
  }();
  return *s;
}

std::unique_ptr<cofab::TcpStore> client() {
  auto c = cofab::TcpStore::connect("127.0.0.1", server().port(), {}, cofab::Deadline::afterMs(5000));
  COFAB_CHECK(c.ok()) << c.status();
  return std::move(*c);
}

void BM_TcpStoreSet(benchmark::State& state) {
  auto c = client();
  cofab::Bytes value(static_cast<size_t>(state.range(0)), 7);
  std::string key = "set/" + std::to_string(state.thread_index());
  for (auto _ : state) {
    auto s = c->set(key, value);
    if (!s.ok()) state.SkipWithError(s.toString().c_str());
  }
  state.counters["ops"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                             benchmark::Counter::kIsRate);
}

void BM_TcpStoreGet(benchmark::State& state) {
  auto c = client();
  std::string key = "get/" + std::to_string(state.thread_index());
  COFAB_CHECK(c->set(key, cofab::Bytes(static_cast<size_t>(state.range(0)), 1)).ok());
  for (auto _ : state) {
    auto v = c->get(key, cofab::Deadline::afterMs(5000));
    if (!v.ok()) state.SkipWithError(v.status().toString().c_str());
    benchmark::DoNotOptimize(v);
  }
  state.counters["ops"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                             benchmark::Counter::kIsRate);
}

// N ranks, each its own connection and thread: set "<round>/<rank>", wait for every rank's key.
void BM_TcpStoreBarrier(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  std::vector<std::unique_ptr<cofab::TcpStore>> clients;
  for (int r = 0; r < ranks; ++r) clients.push_back(client());
  int64_t round = 0;
  for (auto _ : state) {
    const std::string prefix = "barrier/" + std::to_string(ranks) + "/" + std::to_string(round++);
    std::vector<std::string> keys;
    for (int r = 0; r < ranks; ++r) keys.push_back(prefix + "/" + std::to_string(r));
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        if (!clients[r]->set(keys[r], cofab::Bytes{1}).ok()) ++failures;
        if (!clients[r]->wait(keys, cofab::Deadline::afterMs(120000)).ok()) ++failures;
      });
    }
    for (auto& t : threads) t.join();
    if (failures > 0) state.SkipWithError("a rank's set or wait failed");
  }
}

BENCHMARK(BM_TcpStoreBarrier)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TcpStoreSet)->Arg(64)->Threads(1)->Threads(4)->UseRealTime();
BENCHMARK(BM_TcpStoreGet)->Arg(64)->Threads(1)->Threads(4)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  auto cases = cofab::bench::runBenchmarks(&argc, argv);
  for (const char* op : {"Set", "Get"}) {
    for (int threads : {1, 4}) {
      std::string name = std::string("BM_TcpStore") + op + "/64/real_time/threads:" +
                         std::to_string(threads);
      const auto* c = cofab::bench::findCase(cases, name);
      if (c == nullptr) continue;
      // realTimeNs is wall time over all clients' operations: its inverse is the total rate,
      // and each client waits `threads` times as long per operation.
      cofab::bench::printResult(
          "store", {{"op", op}, {"clients", std::to_string(threads)}, {"value_bytes", "64"},
                    {"latency_us", cofab::bench::num(threads * c->realTimeNs / 1e3)},
                    {"ops_per_s", cofab::bench::num(1e9 / c->realTimeNs, 6)}});
    }
  }
  for (int ranks : {64, 256, 1024}) {
    const auto* c = cofab::bench::findCase(
        cases, "BM_TcpStoreBarrier/" + std::to_string(ranks) + "/real_time");
    if (c == nullptr) continue;
    cofab::bench::printResult("store_barrier", {{"ranks", std::to_string(ranks)},
                                                {"barrier_ms", cofab::bench::num(c->realTimeNs / 1e6)}});
  }
  return 0;
}

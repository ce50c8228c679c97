// Coded shuffling over the network: a master uploads each epoch's messages once to an aggregator
// (the cofab-aggd server, in this process, fan-out pushes) and 8 worker threads with their own
// connections pull what they need and rebuild their batches from their caches (verified against
// the data set every epoch). Coded against uncoded (every needed row uploaded once for its one
// worker) on the same path; the figure of merit is the master's egress, which the coding shrinks
// by 1 + n alpha in theory. Epoch times are on the 2-core shared VM with everything on loopback
// (daemon, master and workers share the cores): indicative only.
//
//   coded_shuffle_net_bench [--epochs=3] [--row_bytes=4096]
//
// Ends with one line per cache fraction:
//   RESULT dist_coded_shuffle n=8 alpha=... coded_egress_bytes=... uncoded_egress_bytes=...
//          reduction=... theory_reduction=... vs_theory=... coded_epoch_ms=... uncoded_epoch_ms=...
//          daemon_peak_slots=... daemon_slots_after=... (every epoch is released once received:
//          the daemon holds one epoch's uploads at most, none at the end)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/aggregator_server.h"
#include "bench/support/result_reporter.h"
#include "coding/shuffle/coded_shuffle.h"
#include "fabric/coded/shuffle_relay.h"

namespace cofab {
namespace {

constexpr int kWorkers = 8;

struct ModeResult {
  uint64_t egress = 0;
  double epochMs = 0;      // mean
  uint64_t peakSlots = 0;  // daemon slots held before an epoch's release (its uploads)
  uint64_t slotsLeft = 0;  // after the last release (coded's entry): 0 when nothing leaks
};

StatusOr<std::pair<ModeResult, ModeResult>> runAlpha(double alpha, int64_t rows, size_t rowBytes,
                                                     int epochs) {
  COFAB_ASSIGN_OR_RETURN(
      coding::CodedShuffle shuffle,
      coding::CodedShuffle::create({.workers = kWorkers, .cacheFraction = alpha, .rows = rows}));
  std::vector<uint8_t> data(static_cast<size_t>(rows) * rowBytes);
  std::mt19937 rng(5);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::vector<coding::WorkerCache> caches;
  for (int w = 0; w < kWorkers; ++w) {
    COFAB_ASSIGN_OR_RETURN(coding::WorkerCache c, shuffle.buildCache(w, data, rowBytes));
    caches.push_back(std::move(c));
  }
  aggregator::ServerOptions so;
  so.numWorkers = kWorkers + 1;
  so.listenAddress = "127.0.0.1:0";
  COFAB_ASSIGN_OR_RETURN(auto server, aggregator::AggregatorServer::create(so));
  const Deadline connectBy = Deadline::afterMs(20000);
  COFAB_ASSIGN_OR_RETURN(auto master,
                         coded::ShuffleEndpoint::connect(server->address(), kWorkers, connectBy));
  std::vector<std::unique_ptr<coded::ShuffleEndpoint>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    COFAB_ASSIGN_OR_RETURN(auto e,
                           coded::ShuffleEndpoint::connect(server->address(), w, connectBy));
    workers.push_back(std::move(e));
  }
  ModeResult res[2];
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (int mode = 0; mode < 2; ++mode) {
      const bool coded = mode == 0;
      COFAB_ASSIGN_OR_RETURN(coding::ShufflePlan plan, shuffle.planEpoch(epoch, rowBytes));
      const auto t0 = std::chrono::steady_clock::now();
      COFAB_ASSIGN_OR_RETURN(coded::ShuffleEpochStats st,
                             coded::shuffleUploadEpoch(*master, shuffle, plan, coded, data,
                                                       rowBytes, Deadline::afterMs(60000)));
      std::vector<Status> status(kWorkers);
      std::vector<std::thread> threads;
      for (int w = 0; w < kWorkers; ++w) {
        threads.emplace_back([&, w] {
          std::vector<uint8_t> batch(plan.batch[w].size() * rowBytes);
          status[w] = coded::shuffleReceiveEpoch(*workers[w], shuffle, plan, coded, caches[w],
                                                 rowBytes, batch, Deadline::afterMs(60000));
          for (size_t i = 0; status[w].ok() && i < plan.batch[w].size(); ++i) {
            if (std::memcmp(batch.data() + i * rowBytes, data.data() + plan.batch[w][i] * rowBytes,
                            rowBytes) != 0) {
              status[w] = DataLoss("worker " + std::to_string(w) + " decoded a wrong row");
            }
          }
        });
      }
      for (auto& t : threads) t.join();
      for (const Status& s : status) COFAB_RETURN_IF_ERROR(s);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      res[mode].egress += st.masterEgressBytes;
      res[mode].epochMs += ms / epochs;
      // Every worker has the epoch: free its uploads on the daemon (outside the timed part).
      res[mode].peakSlots = std::max(res[mode].peakSlots, server->metrics().slots.load());
      COFAB_RETURN_IF_ERROR(
          coded::shuffleReleaseEpoch(*master, plan, coded, Deadline::afterMs(60000)));
    }
  }
  res[0].slotsLeft = server->metrics().slots.load();
  workers.clear();
  master.reset();
  server->shutdown("bench done");
  return std::make_pair(res[0], res[1]);
}

}  // namespace
}  // namespace cofab

int main(int argc, char** argv) {
  using namespace cofab;
  int epochs = 3;
  size_t rowBytes = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--epochs=", 0) == 0)
      epochs = std::atoi(a.c_str() + 9);
    else if (a.rfind("--row_bytes=", 0) == 0)
      rowBytes = std::strtoull(a.c_str() + 12, nullptr, 10);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  // 4480 rows = 8 C(8, 2) x 20 = 8 C(8, 4) x 8: equal multicast lists at both cache fractions.
  const int64_t rows = 4480;
  std::printf(
      "# n=%d workers (threads), 1 in-process aggregator, %ld rows of %zu bytes, %d epochs "
      "per mode; egress = headers + payloads the master sent; 2-core shared VM\n",
      kWorkers, static_cast<long>(rows), rowBytes, epochs);
  std::vector<std::vector<std::pair<std::string, std::string>>> lines;
  for (double alpha : {0.25, 0.5}) {
    auto r = runAlpha(alpha, rows, rowBytes, epochs);
    if (!r.ok()) {
      std::fprintf(stderr, "alpha %.2f: %s\n", alpha, r.status().toString().c_str());
      return 1;
    }
    const auto& [coded, uncoded] = *r;
    const double theory = 1 + kWorkers * alpha;
    const double reduction = static_cast<double>(uncoded.egress) / coded.egress;
    std::printf(
        "alpha=%.2f coded: egress %lu B, epoch %.1f ms; uncoded: egress %lu B, epoch "
        "%.1f ms; reduction %.3f (theory %.0f)\n",
        alpha, static_cast<unsigned long>(coded.egress), coded.epochMs,
        static_cast<unsigned long>(uncoded.egress), uncoded.epochMs, reduction, theory);
    using bench::num;
    lines.push_back(
        {{"n", std::to_string(kWorkers)},
         {"alpha", num(alpha)},
         {"coded_egress_bytes", std::to_string(coded.egress)},
         {"uncoded_egress_bytes", std::to_string(uncoded.egress)},
         {"reduction", num(reduction)},
         {"theory_reduction", num(theory)},
         {"vs_theory", num(reduction / theory)},
         {"coded_epoch_ms", num(coded.epochMs)},
         {"uncoded_epoch_ms", num(uncoded.epochMs)},
         {"row_bytes", std::to_string(rowBytes)},
         {"daemon_peak_slots", std::to_string(std::max(coded.peakSlots, uncoded.peakSlots))},
         {"daemon_slots_after", std::to_string(coded.slotsLeft)},
         {"rows", std::to_string(rows)}});
  }
  for (const auto& l : lines) bench::printResult("dist_coded_shuffle", l);
  return 0;
}

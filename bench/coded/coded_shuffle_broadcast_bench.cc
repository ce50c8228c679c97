// Coded shuffling over DPDK Ethernet broadcast (fabric/coded/shuffle_broadcast.h): a master and
// 4 worker processes, each with its own EAL and af_packet port on a veth in one Linux bridge
// (network namespaces this bench creates and that die with its processes; needs the rights to
// unshare a network namespace, e.g. root). Every epoch is verified row for row by the workers.
// Coded against uncoded on the same broadcast path; the figure of merit is the master's egress
// (wire bytes of every frame it sent, re-sends and Fin rounds included), which coding shrinks by
// 1 + n alpha in theory. Epoch time = the master's sendEpoch (first frame to every worker's
// "done"); on the 2-core shared VM with 5 busy-polling processes it is indicative only.
//
//   coded_shuffle_broadcast_bench [--epochs=3] [--row_bytes=4096]
//
// Ends with one line per cache fraction:
//   RESULT dist_coded_shuffle path=dpdk_broadcast n=4 alpha=... coded_egress_bytes=...
//          uncoded_egress_bytes=... reduction=... theory_reduction=... vs_theory=...
//          coded_epoch_ms=... uncoded_epoch_ms=... resent_messages=...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/support/result_reporter.h"
#include "coding/shuffle/coded_shuffle.h"
#include "fabric/coded/shuffle_broadcast.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"
#include "tests/support/veth_netns.h"

namespace cofab {
namespace {

constexpr int kWorkers = 4;
// 4 C(4, 1) x 4 C(4, 2) / 8 x ...: equal multicast lists at alpha 0.25 and 0.5.
constexpr int64_t kRows = 960;
constexpr double kAlphas[] = {0.25, 0.5};
constexpr const char* kEal0 = "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";
constexpr const char* kEal1 = "-l 1 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";

std::vector<uint8_t> dataSet(size_t rowBytes) {
  std::vector<uint8_t> data(kRows * rowBytes);
  std::mt19937 rng(5);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return data;
}

int64_t epochId(size_t alphaIndex, int epoch) {
  return static_cast<int64_t>(alphaIndex) * 1000 + epoch;
}

int worker(const std::string& storeUrl, int w, int epochs, size_t rowBytes) {
  auto store = openStore(storeUrl, Deadline::afterMs(10000));
  if (!store.ok()) return testing::childFail(w, store.status().toString());
  const std::vector<uint8_t> data = dataSet(rowBytes);
  auto ep = coded::BroadcastShuffleEndpoint::open(**store, "bench", w);
  if (!ep.ok()) return testing::childFail(w, ep.status().toString());
  if (!(*store)->set("bench/up/" + std::to_string(w), Bytes{1}).ok()) return 1;
  for (size_t a = 0; a < std::size(kAlphas); ++a) {
    auto shuffle = coding::CodedShuffle::create(
        {.workers = kWorkers, .cacheFraction = kAlphas[a], .rows = kRows});
    if (!shuffle.ok()) return testing::childFail(w, shuffle.status().toString());
    auto cache = shuffle->buildCache(w, data, rowBytes);
    if (!cache.ok()) return testing::childFail(w, cache.status().toString());
    for (int e = 0; e < epochs; ++e) {
      for (bool coded : {true, false}) {
        auto plan = shuffle->planEpoch(epochId(a, e), rowBytes);
        if (!plan.ok()) return testing::childFail(w, plan.status().toString());
        std::vector<uint8_t> batch(plan->batch[w].size() * rowBytes);
        const Status s = (*ep)->receiveEpoch(*shuffle, *plan, coded, *cache, rowBytes, batch,
                                             Deadline::afterMs(60000));
        if (!s.ok()) return testing::childFail(w, s.toString());
        for (size_t i = 0; i < plan->batch[w].size(); ++i) {
          if (std::memcmp(batch.data() + i * rowBytes, data.data() + plan->batch[w][i] * rowBytes,
                          rowBytes) != 0) {
            return testing::childFail(w, "decoded a wrong row");
          }
        }
      }
    }
  }
  return 0;
}

int master(const std::string& storeUrl, int epochs, size_t rowBytes, const std::string& out) {
  auto store = openStore(storeUrl, Deadline::afterMs(10000));
  if (!store.ok()) return testing::childFail(-1, store.status().toString());
  const std::vector<uint8_t> data = dataSet(rowBytes);
  auto ep = coded::BroadcastShuffleEndpoint::open(**store, "bench", -1);
  if (!ep.ok()) return testing::childFail(-1, ep.status().toString());
  std::vector<std::string> up;
  for (int w = 0; w < kWorkers; ++w) up.push_back("bench/up/" + std::to_string(w));
  if (!(*store)->wait(up, Deadline::afterMs(30000)).ok()) {
    return testing::childFail(-1, "workers not up");
  }
  std::ofstream lines(out);
  for (size_t a = 0; a < std::size(kAlphas); ++a) {
    auto shuffle = coding::CodedShuffle::create(
        {.workers = kWorkers, .cacheFraction = kAlphas[a], .rows = kRows});
    if (!shuffle.ok()) return testing::childFail(-1, shuffle.status().toString());
    uint64_t egress[2] = {0, 0};
    double ms[2] = {0, 0};
    int64_t resent = 0;
    for (int e = 0; e < epochs; ++e) {
      for (int mode = 0; mode < 2; ++mode) {
        auto plan = shuffle->planEpoch(epochId(a, e), rowBytes);
        if (!plan.ok()) return testing::childFail(-1, plan.status().toString());
        const auto t0 = std::chrono::steady_clock::now();
        auto st =
            (*ep)->sendEpoch(*shuffle, *plan, mode == 0, data, rowBytes, Deadline::afterMs(60000));
        if (!st.ok()) return testing::childFail(-1, st.status().toString());
        ms[mode] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count() /
                    epochs;
        egress[mode] += st->egressBytes;
        resent += st->resentMessages;
      }
    }
    const double theory = 1 + kWorkers * kAlphas[a];
    const double reduction = static_cast<double>(egress[1]) / static_cast<double>(egress[0]);
    using bench::num;
    lines << "n=" << kWorkers << " alpha=" << num(kAlphas[a]) << " coded_egress_bytes=" << egress[0]
          << " uncoded_egress_bytes=" << egress[1] << " reduction=" << num(reduction)
          << " theory_reduction=" << num(theory) << " vs_theory=" << num(reduction / theory)
          << " coded_epoch_ms=" << num(ms[0]) << " uncoded_epoch_ms=" << num(ms[1])
          << " resent_messages=" << resent << " row_bytes=" << rowBytes << " rows=" << kRows
          << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace cofab

int main(int argc, char** argv) {
  using namespace cofab;
  int epochs = 3;
  size_t rowBytes = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--epochs=", 0) == 0) {
      epochs = std::atoi(a.c_str() + 9);
    } else if (a.rfind("--row_bytes=", 0) == 0) {
      rowBytes = std::strtoull(a.c_str() + 12, nullptr, 10);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  testing::TempDir dir;
  const std::string storeUrl = "file://" + dir.path() + "/store";
  const std::string out = dir.path() + "/lines";
  std::printf(
      "# n=%d worker processes + 1 master, af_packet ports on veths in one bridge (namespaces made "
      "here), %ld rows of %zu bytes, %d epochs per mode; egress = wire bytes of every frame the "
      "master sent; 2-core shared VM\n",
      kWorkers, static_cast<long>(kRows), rowBytes, epochs);
  std::fflush(stdout);
  testing::ProcessGroup outer;
  outer.start(1, [&](int) -> int {
    if (std::string why = testing::makeBridgeNetns(kWorkers + 1); !why.empty()) {
      return testing::childFail(0, why);
    }
    if (!testing::linkUp("cfd0", 10000)) return testing::childFail(0, "cfd0 has no carrier");
    testing::ProcessGroup workers;
    workers.start(kWorkers, [&](int w) -> int {
      const std::string iface = testing::bridgeVeth(w + 1);
      if (std::string why = testing::unshareNetns(); !why.empty()) {
        return testing::childFail(w, why);
      }
      if (Status s = testing::bringUp(iface, 10000); !s.ok()) {
        return testing::childFail(w, s.toString());
      }
      ::setenv("COFAB_DPDK_EAL_ARGS", w % 2 ? kEal1 : kEal0, 1);
      ::setenv("COFAB_DPDK_VDEV", ("net_af_packet0,iface=" + iface + ",framecnt=4096").c_str(), 1);
      return worker(storeUrl, w, epochs, rowBytes);
    });
    for (int w = 0; w < kWorkers; ++w) {
      const Status s = testing::moveToNetnsOf(testing::bridgeVeth(w + 1), workers.pid(w), 10000);
      if (!s.ok()) return testing::childFail(0, s.toString());
    }
    ::setenv("COFAB_DPDK_EAL_ARGS", kEal1, 1);
    ::setenv("COFAB_DPDK_VDEV", "net_af_packet0,iface=cfd0,framecnt=4096", 1);
    const int code = master(storeUrl, epochs, rowBytes, out);
    const std::string f = testing::failures(workers.waitAll(Deadline::afterMs(120000)));
    if (!f.empty()) return testing::childFail(0, f);
    return code;
  });
  const std::string f = testing::failures(outer.waitAll(Deadline::afterMs(300000)));
  if (!f.empty()) {
    std::fprintf(stderr, "%s\n", f.c_str());
    return 1;
  }
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::printf("RESULT dist_coded_shuffle path=dpdk_broadcast %s\n", line.c_str());
  }
  return 0;
}

// Coded shuffling over DPDK Ethernet broadcast (fabric/coded/shuffle_broadcast.h): a master and
// four workers, each its own process with its own EAL and af_packet port on a veth in one Linux
// bridge (network namespaces the test creates: the bridge's for the master, one per worker, see
// tests/support/veth_netns.h for why). Each epoch, coded and uncoded, every worker's batch must
// equal the data set's rows exactly; one worker discards every 5th frame it needs, so the
// NACK/re-send path must recover; the master's first-pass egress coded vs uncoded must be the
// plan's reduction (1 + t) within 10%. Skipped with the reason when EAL, namespaces, veths or
// bridges are missing.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include "coding/shuffle/coded_shuffle.h"
#include "fabric/coded/shuffle_broadcast.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"
#include "tests/support/veth_netns.h"

namespace cofab::testing {
namespace {

constexpr int kSkipCode = 77;
constexpr int kWorkers = 4;
constexpr size_t kRowBytes = 4096;            // three frames per row at MTU 1500
constexpr int64_t kRows = kWorkers * 6 * 10;  // n C(n, t) x 10 with t = 2: equal lists
constexpr int kEpochs = 2;
// Where a child writes why the test cannot run here (set before the first fork).
std::string gReasonFile;

// In the master: EAL cannot start here (no hugepage-free mode, no af_packet PMD...) is a skip.
int skipOrFail(const Status& s) {
  if (s.code() != StatusCode::kUnavailable) return childFail(-1, "master open: " + s.toString());
  std::ofstream(gReasonFile) << "EAL cannot start: " << s.toString();
  return kSkipCode;
}
constexpr const char* kEal0 = "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";
constexpr const char* kEal1 = "-l 1 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";

std::vector<uint8_t> dataSet() {
  std::vector<uint8_t> data(kRows * kRowBytes);
  std::mt19937 rng(3);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return data;
}

StatusOr<coding::CodedShuffle> makeShuffle() {
  return coding::CodedShuffle::create({.workers = kWorkers, .cacheFraction = 0.5, .rows = kRows});
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

using WorkerBody = std::function<int(coded::BroadcastShuffleEndpoint&,
                                      const coding::CodedShuffle&, const coding::WorkerCache&)>;
using MasterBody = std::function<int(coded::BroadcastShuffleEndpoint&,
                                      const coding::CodedShuffle&, const std::vector<uint8_t>&)>;

// Worker `w` (its veth already moved into its namespace): its store, shuffle, cache of `data`
// (rows of rowBytes) and endpoint, its "up" mark in the store; then `body`.
int asWorker(const std::string& storeUrl, int w, const std::vector<uint8_t>& data,
             size_t rowBytes, const WorkerBody& body) {
  auto store = openStore(storeUrl, Deadline::afterMs(10000));
  if (!store.ok()) return childFail(w, store.status().toString());
  auto shuffle = makeShuffle();
  if (!shuffle.ok()) return childFail(w, shuffle.status().toString());
  auto cache = shuffle->buildCache(w, data, rowBytes);
  if (!cache.ok()) return childFail(w, cache.status().toString());
  auto ep = coded::BroadcastShuffleEndpoint::open(**store, "bcast", w);
  if (!ep.ok()) return childFail(w, "open: " + ep.status().toString());
  if (!(*store)->set("test/up/" + std::to_string(w), Bytes{1}).ok()) return childFail(w, "store");
  return body(**ep, *shuffle, *cache);
}

// The master (in the bridge's namespace, port on cfd0): its store, shuffle, data set and
// endpoint; waits for workers 0..workersUp-1's "up" marks, then `body`.
int asMaster(const std::string& storeUrl, int workersUp, const MasterBody& body) {
  auto store = openStore(storeUrl, Deadline::afterMs(10000));
  if (!store.ok()) return childFail(-1, store.status().toString());
  auto shuffle = makeShuffle();
  if (!shuffle.ok()) return childFail(-1, shuffle.status().toString());
  const std::vector<uint8_t> data = dataSet();
  auto ep = coded::BroadcastShuffleEndpoint::open(**store, "bcast", -1);
  if (!ep.ok()) return skipOrFail(ep.status());
  std::vector<std::string> up;
  for (int w = 0; w < workersUp; ++w) up.push_back("test/up/" + std::to_string(w));
  if (Status s = (*store)->wait(up, Deadline::afterMs(20000)); !s.ok()) {
    return childFail(-1, "workers not up: " + s.toString());
  }
  return body(**ep, *shuffle, data);
}

// Worker `w` receives one epoch in one mode; its batch must equal the data set's rows exactly.
int receiveExactly(coded::BroadcastShuffleEndpoint& ep, const coding::CodedShuffle& shuffle,
                   const coding::WorkerCache& cache, int w, int64_t epoch, bool coded) {
  const std::vector<uint8_t> data = dataSet();
  auto plan = shuffle.planEpoch(epoch, kRowBytes);
  if (!plan.ok()) return childFail(w, plan.status().toString());
  std::vector<uint8_t> batch(plan->batch[w].size() * kRowBytes);
  const Status s =
      ep.receiveEpoch(shuffle, *plan, coded, cache, kRowBytes, batch, Deadline::afterMs(20000));
  if (!s.ok()) return childFail(w, s.toString());
  for (size_t i = 0; i < plan->batch[w].size(); ++i) {
    if (std::memcmp(batch.data() + i * kRowBytes, data.data() + plan->batch[w][i] * kRowBytes,
                    kRowBytes) != 0) {
      return childFail(w, "epoch " + std::to_string(epoch) + (coded ? " coded" : " uncoded") +
                              ": batch row " + std::to_string(i) + " differs from row " +
                              std::to_string(plan->batch[w][i]));
    }
  }
  return 0;
}

// Worker `w`: every epoch, both modes, exact batch.
int workerMain(const std::string& storeUrl, int w) {
  return asWorker(storeUrl, w, dataSet(), kRowBytes, [w](auto& ep, auto& shuffle, auto& cache) {
    for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
      for (bool coded : {true, false}) {
        if (int rc = receiveExactly(ep, shuffle, cache, w, epoch, coded); rc != 0) return rc;
      }
    }
    return 0;
  });
}

// Worker `w`: only epoch 0, coded, and its batch must be exact.
int workerCodedEpoch0(const std::string& storeUrl, int w) {
  return asWorker(storeUrl, w, dataSet(), kRowBytes, [w](auto& ep, auto& shuffle, auto& cache) {
    return receiveExactly(ep, shuffle, cache, w, 0, true);
  });
}

// The master: sends every epoch and checks egress.
int masterMain(const std::string& storeUrl, const std::string& resultFile) {
  return asMaster(storeUrl, kWorkers, [&](auto& ep, auto& shuffle, auto& data) -> int {
  int64_t resent = 0;
  std::ofstream out(resultFile);
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    uint64_t first[2] = {0, 0};
    for (bool coded : {true, false}) {
      auto plan = shuffle.planEpoch(epoch, kRowBytes);
      if (!plan.ok()) return childFail(-1, plan.status().toString());
      auto stats =
          ep.sendEpoch(shuffle, *plan, coded, data, kRowBytes, Deadline::afterMs(20000));
      if (!stats.ok()) return childFail(-1, stats.status().toString());
      const int64_t planned = coded ? plan->accounting.codedBytes : plan->accounting.uncodedBytes;
      if (static_cast<int64_t>(stats->payloadBytes) != planned) {
        return childFail(-1, "payload " + std::to_string(stats->payloadBytes) + " != plan " +
                                 std::to_string(planned));
      }
      first[coded ? 0 : 1] = stats->firstPassBytes;
      resent += stats->resentMessages;
      out << "epoch " << epoch << (coded ? " coded" : " uncoded")
          << " first_pass_bytes=" << stats->firstPassBytes << " egress_bytes=" << stats->egressBytes
          << " resent=" << stats->resentMessages << " rounds=" << stats->rounds << "\n";
    }
    const double ratio = double(first[1]) / double(first[0]);
    const double theory = 1.0 + shuffle.cachedBy();
    out << "epoch " << epoch << " ratio=" << ratio << " theory=" << theory << "\n";
    if (std::abs(ratio - theory) > 0.1 * theory) {
      return childFail(-1, "egress reduction " + std::to_string(ratio) + " is not " +
                               std::to_string(theory) + " within 10%");
    }
  }
  // Worker 0 discarded every 5th frame it needed: the re-send path must have run.
  if (resent == 0) return childFail(-1, "no message was re-sent although worker 0 lost frames");
  return 0;
  });
}

// Runs `live` worker processes (worker w: workerMain unless told otherwise) and the master
// (masterBody, in the bridge's namespace) on one bridge. Returns "" or the skip reason; failures
// are reported through gtest.
std::string runOnBridge(int live, const std::function<int(const std::string&, int)>& workerBody,
                        const std::function<int(const std::string&)>& masterBody,
                        const std::string& dirPath) {
  const std::string storeUrl = "file://" + dirPath + "/store";
  const std::string reasonFile = dirPath + "/skip";
  gReasonFile = reasonFile;
  ProcessGroup outer;
  outer.start(1, [&](int) -> int {
    auto skip = [&](const std::string& why) {
      std::ofstream(reasonFile) << why;
      return kSkipCode;
    };
    if (std::string why = makeBridgeNetns(kWorkers + 1); !why.empty()) return skip(why);
    if (!linkUp("cfd0", 10000)) return childFail(0, "cfd0 has no carrier");
    // Workers fork before this process starts EAL (fork after EAL is not supported).
    ProcessGroup workers;
    workers.start(live, [&](int w) -> int {
      const std::string iface = bridgeVeth(w + 1);
      if (std::string why = unshareNetns(); !why.empty()) return childFail(w, why);
      if (Status s = bringUp(iface, 10000); !s.ok()) return childFail(w, s.toString());
      ::setenv("COFAB_DPDK_EAL_ARGS", w % 2 ? kEal1 : kEal0, 1);
      ::setenv("COFAB_DPDK_VDEV", ("net_af_packet0,iface=" + iface + ",framecnt=4096").c_str(), 1);
      return workerBody(storeUrl, w);
    });
    for (int w = 0; w < live; ++w) {
      if (Status s = moveToNetnsOf(bridgeVeth(w + 1), workers.pid(w), 10000); !s.ok()) {
        return childFail(0, s.toString());
      }
    }
    ::setenv("COFAB_DPDK_EAL_ARGS", kEal1, 1);
    ::setenv("COFAB_DPDK_VDEV", "net_af_packet0,iface=cfd0,framecnt=4096", 1);
    const int masterCode = masterBody(storeUrl);
    if (masterCode == kSkipCode) return kSkipCode;  // the workers are killed with `workers`
    const std::string f = failures(workers.waitAll(Deadline::afterMs(60000)));
    if (!f.empty()) return childFail(0, f);
    return masterCode;
  });
  auto exits = outer.waitAll(Deadline::afterMs(100000));
  if (exits.size() == 1 && exits[0].exited && exits[0].code == kSkipCode) {
    return readFile(reasonFile);
  }
  EXPECT_EQ(failures(exits), "");
  return "";
}

TEST(DpdkShuffleBroadcast, WorkersDecodeExactlyOverEthernetBroadcast) {
  TempDir dir;
  const std::string resultFile = dir.path() + "/result";
  const std::string skip = runOnBridge(
      kWorkers,
      [](const std::string& storeUrl, int w) {
        // Worker 0 loses every 5th frame it needs: the NACK path must recover them.
        if (w == 0) ::setenv("COFAB_SHUFFLE_BCAST_DROP_EVERY", "5", 1);
        return workerMain(storeUrl, w);
      },
      [&](const std::string& storeUrl) { return masterMain(storeUrl, resultFile); }, dir.path());
  if (!skip.empty()) GTEST_SKIP() << skip;
  std::printf("%s", readFile(resultFile).c_str());
}

// Worker 3 of the plan never shows up: the master's epoch fails at its deadline naming worker 3
// (and only it), while the three live workers still decode the epoch exactly.
TEST(DpdkShuffleBroadcast, MasterNamesTheWorkerThatNeverReceived) {
  TempDir dir;
  const std::string skip = runOnBridge(
      kWorkers - 1,
      workerCodedEpoch0,
      [](const std::string& storeUrl) -> int {
        return asMaster(storeUrl, kWorkers - 1, [](auto& ep, auto& shuffle, auto& data) -> int {
          auto plan = shuffle.planEpoch(0, kRowBytes);
          auto stats =
              ep.sendEpoch(shuffle, *plan, true, data, kRowBytes, Deadline::afterMs(2000));
          if (stats.ok()) return childFail(-1, "the epoch completed without worker 3");
          const std::string why = stats.status().toString();
          if (stats.status().code() != StatusCode::kDeadlineExceeded ||
              why.find("worker(s) 3 did not") == std::string::npos) {
            return childFail(-1, "unexpected error: " + why);
          }
          return 0;
        });
      },
      dir.path());
  if (!skip.empty()) GTEST_SKIP() << skip;
}

// The master of a test whose only worker (0) gives up on epoch 0: the master's epoch must fail
// with RemoteError carrying the worker's reason (`expect` in its message), at once.
int masterSeesWorker0GiveUp(const std::string& storeUrl, const std::string& expect) {
  return asMaster(storeUrl, 1, [&expect](auto& ep, auto& shuffle, auto& data) -> int {
    auto plan = shuffle.planEpoch(0, kRowBytes);
    auto stats = ep.sendEpoch(shuffle, *plan, true, data, kRowBytes, Deadline::afterMs(20000));
    const std::string why = stats.status().toString();
    if (stats.status().code() != StatusCode::kRemoteError ||
        why.find("worker 0 gave up: ") == std::string::npos ||
        why.find(expect) == std::string::npos) {
      return childFail(-1, "unexpected outcome: " + why);
    }
    return 0;
  });
}

// Worker 0 (the only one started) cuts its rows 4 bytes shorter than the master (a
// configuration mismatch): the frames pass their CRCs but fit no row of its size. It used to NACK
// them every round and both sides ran into their deadlines with "messages missing"; now worker 0
// fails at once naming rowBytes, and the master's epoch fails with worker 0's reason (before it
// would notice the workers that never started).
TEST(DpdkShuffleBroadcast, AWorkerWithAnotherRowSizeFailsBothSidesWithTheReason) {
  TempDir dir;
  const std::string skip = runOnBridge(
      1,
      [](const std::string& storeUrl, int w) -> int {
        constexpr size_t kWrongRowBytes = kRowBytes - 4;
        const std::vector<uint8_t> data(kRows * kWrongRowBytes, 1);
        return asWorker(storeUrl, w, data, kWrongRowBytes, [w](auto& ep, auto& shuffle,
                                                              auto& cache) -> int {
          auto plan = shuffle.planEpoch(0, kWrongRowBytes);
          std::vector<uint8_t> batch(plan->batch[w].size() * kWrongRowBytes);
          const Status s = ep.receiveEpoch(shuffle, *plan, true, cache, kWrongRowBytes, batch,
                                           Deadline::afterMs(20000));
          if (s.code() != StatusCode::kInvalidArgument ||
              s.message().find("rowBytes 4092 does not match") == std::string::npos) {
            return childFail(w, "unexpected outcome: " + s.toString());
          }
          return 0;
        });
      },
      [](const std::string& storeUrl) {
        return masterSeesWorker0GiveUp(storeUrl, "rowBytes 4092 does not match");
      },
      dir.path());
  if (!skip.empty()) GTEST_SKIP() << skip;
}

// Worker 0 (the only one started) plans with another seed than the master (its own cache too):
// it fails with FailedPrecondition saying the plans differ, and so does the master's epoch. The
// frames only carry message ids, so it decoded the master's messages against its own plan into
// a wrong batch returned OK, or waited for ids the master never sends ("messages missing").
TEST(DpdkShuffleBroadcast, AWorkerWithAnotherPlanIsToldSoNotGivenGarbage) {
  TempDir dir;
  const std::string skip = runOnBridge(
      1,
      [](const std::string& storeUrl, int w) -> int {
        const std::vector<uint8_t> data = dataSet();
        return asWorker(storeUrl, w, data, kRowBytes, [w, &data](auto& ep, auto&, auto&) -> int {
          auto other = coding::CodedShuffle::create(
              {.workers = kWorkers, .cacheFraction = 0.5, .rows = kRows, .seed = 2});
          if (!other.ok()) return childFail(w, other.status().toString());
          auto cache = other->buildCache(w, data, kRowBytes);
          if (!cache.ok()) return childFail(w, cache.status().toString());
          auto plan = other->planEpoch(0, kRowBytes);
          std::vector<uint8_t> batch(plan->batch[w].size() * kRowBytes);
          const Status s = ep.receiveEpoch(*other, *plan, true, *cache, kRowBytes, batch,
                                           Deadline::afterMs(5000));
          if (s.code() != StatusCode::kFailedPrecondition ||
              s.message().find("the master planned another epoch") == std::string::npos) {
            return childFail(w, "unexpected outcome: " + s.toString());
          }
          return 0;
        });
      },
      [](const std::string& storeUrl) {
        return masterSeesWorker0GiveUp(storeUrl, "the master planned another epoch");
      },
      dir.path());
  if (!skip.empty()) GTEST_SKIP() << skip;
}

// Worker 0 (the only one started) receives everything but passes a batch buffer one row short:
// it fails building its batch, and the master's epoch fails at once with that reason. The master
// sent rounds until its deadline and then said "did not receive every message in time" (only a
// rowBytes mismatch reached it).
TEST(DpdkShuffleBroadcast, AnyWorkerFailureReachesTheMasterWithItsReason) {
  TempDir dir;
  const std::string skip = runOnBridge(
      1,
      [](const std::string& storeUrl, int w) -> int {
        const std::vector<uint8_t> data = dataSet();
        return asWorker(storeUrl, w, data, kRowBytes,
                        [w](auto& ep, auto& shuffle, auto& cache) -> int {
                          auto plan = shuffle.planEpoch(0, kRowBytes);
                          std::vector<uint8_t> batch((plan->batch[w].size() - 1) * kRowBytes);
                          const Status s = ep.receiveEpoch(shuffle, *plan, true, cache, kRowBytes,
                                                           batch, Deadline::afterMs(20000));
                          if (s.ok())
                            return childFail(w, "a batch buffer one row short was accepted");
                          return 0;
                        });
      },
      [](const std::string& storeUrl) { return masterSeesWorker0GiveUp(storeUrl, "a batch of"); },
      dir.path());
  if (!skip.empty()) GTEST_SKIP() << skip;
}

}  // namespace
}  // namespace cofab::testing

// cofab-aggd over the dpdk transport, unchanged: a real daemon process started with
// `--transport dpdk` (its EAL arguments and memif server vdev from COFAB_DPDK_EAL_ARGS /
// COFAB_DPDK_VDEV in its environment) registers its dpdk address ("<mac>/<ip>:<udp port>") in
// the Store; a forked worker process (memif client, its own EAL) finds it there and push-pulls
// over dpdk. memif joins exactly two processes, so the daemon serves one worker here (a daemon
// serving N workers over memif would need one port per peer: docs/DPDK.md).
// With af_packet on veths in a Linux bridge (a shared segment, in network namespaces the test
// creates) one daemon serves two workers, and their sum is checked.
// This test process never starts EAL itself: the probe, the daemon and the worker each run in
// their own process (one EAL per process).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

#include "fabric/ps/push_pull.h"
#include "fabric/transport/dpdk/factory.h"
#include "tests/aggregator/daemon_cluster.h"
#include "tests/aggregator/test_data.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"
#include "tests/support/veth_netns.h"

namespace cofab::testing {
namespace {

constexpr int kSkipCode = 77;
constexpr const char* kServerEal = "-l 1 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";
constexpr const char* kClientEal = "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry";

std::string memifVdev(const std::string& sock, bool server) {
  return "net_memif0,role=" + std::string(server ? "server" : "client") + ",socket=" + sock +
         ",socket-abstract=no";
}

// Whether EAL can start here at all (in a child, so that this process stays EAL-free): "" when
// it can, else the reason.
std::string ealProbe(const std::string& dir) {
  ProcessGroup probe;
  const std::string reasonFile = dir + "/probe";
  probe.start(1, [&](int) -> int {
    ::setenv("COFAB_DPDK_EAL_ARGS", kClientEal, 1);
    ::unsetenv("COFAB_DPDK_VDEV");
    auto ctx = transport::dpdk::createContext({.localId = "probe"});
    if (ctx.ok()) {
      (*ctx)->join();
      return 0;
    }
    std::ofstream(reasonFile) << ctx.status().toString();
    return ctx.status().code() == StatusCode::kUnavailable ? kSkipCode : 1;
  });
  auto exits = probe.waitAll(Deadline::afterMs(20000));
  if (exits.size() == 1 && exits[0].exited && exits[0].code == 0) return "";
  std::ifstream in(reasonFile);
  std::string reason((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (exits.size() == 1 && exits[0].exited && exits[0].code == kSkipCode) return reason;
  ADD_FAILURE() << "EAL probe failed: " << (reason.empty() ? exits[0].describe() : reason);
  return "probe failed";
}

struct Spec {
  uint64_t key;
  size_t count;
  DType dtype;
  bool average;
};

const std::vector<Spec>& specs() {
  static const std::vector<Spec> v = {
      {10, 1, DType::kF32, false},     {11, 333, DType::kF32, true},
      {12, 5000, DType::kF64, false},  {13, 4097, DType::kF16, false},
      {14, 70000, DType::kBF16, true}, {15, 300000, DType::kF32, false}};
  return v;
}

// Worker `rank` of `workers` (in a child process whose EAL settings are in its environment):
// three rounds of every spec over dpdk, each result checked against the reference reduction of
// every worker's input. The child's exit code.
int pushPullRounds(const std::string& storeUrl, int rank, int workers) {
  auto store = openStore(storeUrl, Deadline::afterMs(10000));
  if (!store.ok()) return childFail(rank, store.status().toString());
  ps::ClientOptions co;
  co.transport = "dpdk";
  co.chunkBytes = 64 << 10;  // large tensors take several chunks
  co.connectTimeoutMs = 20000;
  auto client = ps::PushPullClient::connect(**store, rank, workers, co);
  if (!client.ok()) return childFail(rank, client.status().toString());
  const auto& sp = specs();
  for (uint64_t it = 0; it < 3; ++it) {
    std::vector<std::vector<uint8_t>> in, out;
    std::vector<ps::PushPullHandle> handles;
    for (const auto& s : sp) {
      in.push_back(makeTensor(s.dtype, s.count, rank, s.key, it));
      out.emplace_back(in.back().size());
    }
    for (size_t i = 0; i < sp.size(); ++i) {
      ps::PushPullOptions o;
      o.op = sp[i].average ? ps::ReduceOp::kAverage : ps::ReduceOp::kSum;
      o.delivery = (i + it) % 2 ? ps::Delivery::kPull : ps::Delivery::kPushBack;
      handles.push_back(
          (*client)->pushPull(sp[i].key, TensorView(in[i].data(), sp[i].count, sp[i].dtype),
                              TensorView(out[i].data(), sp[i].count, sp[i].dtype), o));
    }
    for (size_t i = 0; i < sp.size(); ++i) {
      const Status s = handles[i].wait(Deadline::afterMs(20000));
      if (!s.ok()) {
        return childFail(rank, "key " + std::to_string(sp[i].key) + ": " + s.toString());
      }
      std::vector<std::vector<uint8_t>> all;
      for (int r = 0; r < workers; ++r)
        all.push_back(makeTensor(sp[i].dtype, sp[i].count, r, sp[i].key, it));
      if (out[i] != referenceReduce(sp[i].dtype, sp[i].average, all)) {
        return childFail(rank, "key " + std::to_string(sp[i].key) + " iteration " +
                                   std::to_string(it) + ": result differs from the reference");
      }
    }
  }
  (*client)->close();
  return 0;
}

// Several dtypes, sizes spanning one frame to many chunks, sum and average, three rounds, both
// deliveries: the results must be exactly the daemon's reduction of what was pushed (one
// worker: memif is point to point).
TEST(DpdkAggd, PushPullThroughDaemonOverMemif) {
  TempDir dir;
  if (std::string why = ealProbe(dir.path()); !why.empty()) {
    if (why == "probe failed") return;
    GTEST_SKIP() << "EAL cannot start: " << why;
  }
  const std::string sock = dir.path() + "/memif.sock";
  // The daemon inherits these (it is exec'd by DaemonCluster); this process never reads them.
  ::setenv("COFAB_DPDK_EAL_ARGS", kServerEal, 1);
  ::setenv("COFAB_DPDK_VDEV", memifVdev(sock, true).c_str(), 1);
  ::setenv("COFAB_DPDK_PEER_TIMEOUT_MS", "3000", 1);
  DaemonCluster cluster(1, 1, {"--transport", "dpdk", "--listen", ""});
  const Status started = cluster.start(Deadline::afterMs(20000));
  ::unsetenv("COFAB_DPDK_EAL_ARGS");
  ::unsetenv("COFAB_DPDK_VDEV");
  ASSERT_TRUE(started.ok()) << started;
  // The daemon published its dpdk address, not a tcp one.
  EXPECT_NE(cluster.address(0).find('/'), std::string::npos) << cluster.address(0);

  const std::string storeUrl = cluster.storeUrl();
  ProcessGroup worker;
  worker.start(1, [&](int) -> int {
    ::setenv("COFAB_DPDK_EAL_ARGS", kClientEal, 1);
    ::setenv("COFAB_DPDK_VDEV", memifVdev(sock, false).c_str(), 1);
    return pushPullRounds(storeUrl, 0, 1);
  });
  auto exits = worker.waitAll(Deadline::afterMs(60000));
  EXPECT_EQ(failures(exits), "");
  // The daemon counted the rounds it completed over dpdk, and SIGTERM still drains and exits 0.
  auto rounds = cluster.metric(0, "cofab_agg_rounds_completed_total");
  if (rounds.ok()) {
    EXPECT_GE(*rounds, 3.0 * specs().size());
  }
  cluster.signal(0, SIGTERM);
  EXPECT_EQ(cluster.wait(0, Deadline::afterMs(15000)), 0);
}

// One daemon, two workers, one L2 segment: a Linux bridge with three veth pairs, in a network
// namespace an intermediate child creates; the daemon's af_packet port sits on the bridge's
// namespace side of cfd0, each worker unshares a namespace of its own and is handed its veth end
// (DPDK's af_packet ports join PACKET_FANOUT groups numbered (pid ^ ifindex) & 0xffff per
// namespace, which two ports in one namespace can collide on). The workers' sums are checked.
TEST(DpdkAggd, TwoWorkersSumThroughDaemonOverAfPacketBridge) {
  TempDir dir;
  if (std::string why = ealProbe(dir.path()); !why.empty()) {
    if (why == "probe failed") return;
    GTEST_SKIP() << "EAL cannot start: " << why;
  }
  const std::string reasonFile = dir.path() + "/skip";
  ProcessGroup outer;
  outer.start(1, [&](int) -> int {
    auto skip = [&](const std::string& why) {
      std::ofstream(reasonFile) << why;
      return kSkipCode;
    };
    if (std::string why = makeBridgeNetns(3); !why.empty()) return skip(why);
    if (!linkUp("cfd0", 10000)) return childFail(0, "cfd0 has no carrier");
    ::setenv("COFAB_DPDK_EAL_ARGS", kServerEal, 1);
    ::setenv("COFAB_DPDK_VDEV", "net_af_packet0,iface=cfd0,framecnt=4096", 1);
    DaemonCluster cluster(1, 2, {"--transport", "dpdk", "--listen", ""});
    const Status started = cluster.start(Deadline::afterMs(20000));
    if (!started.ok()) return childFail(0, "daemon: " + started.toString());
    const std::string storeUrl = cluster.storeUrl();
    ProcessGroup workers;
    workers.start(2, [&](int rank) -> int {
      const std::string iface = bridgeVeth(rank + 1);
      if (std::string why = unshareNetns(); !why.empty()) return childFail(rank, why);
      if (Status s = bringUp(iface, 10000); !s.ok()) return childFail(rank, s.toString());
      ::setenv("COFAB_DPDK_EAL_ARGS", rank == 0 ? kClientEal : kServerEal, 1);
      ::setenv("COFAB_DPDK_VDEV", ("net_af_packet0,iface=" + iface + ",framecnt=4096").c_str(), 1);
      return pushPullRounds(storeUrl, rank, 2);
    });
    for (int r = 0; r < 2; ++r) {
      if (Status s = moveToNetnsOf(bridgeVeth(r + 1), workers.pid(r), 10000); !s.ok()) {
        return childFail(0, s.toString());
      }
    }
    const std::string f = failures(workers.waitAll(Deadline::afterMs(60000)));
    if (!f.empty()) return childFail(0, f);
    cluster.signal(0, SIGTERM);
    const int code = cluster.wait(0, Deadline::afterMs(15000));
    return code == 0 ? 0 : childFail(0, "daemon exited with " + std::to_string(code));
  });
  auto exits = outer.waitAll(Deadline::afterMs(100000));
  if (exits.size() == 1 && exits[0].exited && exits[0].code == kSkipCode) {
    std::ifstream in(reasonFile);
    std::string reason((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    GTEST_SKIP() << reason;
  }
  EXPECT_EQ(failures(exits), "");
}

}  // namespace
}  // namespace cofab::testing

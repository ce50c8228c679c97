// dpdk_pushpull_bench: push-pull of one f32 tensor through a cofab-aggd daemon over the dpdk
// transport against the same through a tcp one, in one run (issue 6).
//
//   build/bench/dpdk/dpdk_pushpull_bench [--bytes 16M] [--iters 20]
//
// Per transport: a real cofab-aggd process (`--workers 1 --transport tcp|dpdk`; over dpdk it is
// the memif server on lcore 1) and one forked worker process (the memif client on lcore 0, its
// own EAL) that push-pulls the tensor once to warm up, then --iters times back to back, and
// checks every result (one worker: the sum is its own input). memif joins two processes, so
// one worker (docs/DPDK.md). Time per op = the mean; Gbit/s counts the bytes pushed and pulled
// (2 x --bytes per op). Ignores other arguments, so scripts/bench.sh can run it with the rest.
// Ends with
//   RESULT dpdk_pushpull bytes=... iters=... dpdk_ms=... tcp_ms=... dpdk_gbps=... tcp_gbps=...
//          dpdk_vs_tcp=...     (time ratio: < 1 means dpdk is faster)
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/dpdk/memif_args.h"
#include "bench/support/bench_util.h"
#include "fabric/ps/push_pull.h"
#include "fabric/rendezvous/store.h"

namespace cofab::bench {
namespace {

struct CaseResult {
  double ms = -1;
  std::string error;
};

// The worker process: returns its exit code; writes "<ms>" or "error <why>" to `resultPath`.
int worker(const std::string& storeUrl, const std::string& transport, size_t bytes, int iters,
           const std::string& resultPath) {
  std::ofstream out(resultPath);
  auto fail = [&](const std::string& why) {
    out << "error " << why << "\n";
    return 1;
  };
  auto store = openStore(storeUrl, Deadline::afterMs(30000));
  if (!store.ok()) return fail(store.status().toString());
  ps::ClientOptions co;
  co.transport = transport;
  co.connectTimeoutMs = 30000;
  auto client = ps::PushPullClient::connect(**store, 0, 1, co);
  if (!client.ok()) return fail(client.status().toString());
  std::vector<float> in = randomFloats(bytes / sizeof(float), 7);
  std::vector<float> result(in.size());
  const TensorView src = TensorView::of(in.data(), in.size(), DType::kF32);
  const TensorView dst = TensorView::of(result.data(), result.size(), DType::kF32);
  Status s = (*client)->pushPull(1, src, dst).wait(Deadline::afterMs(120000));  // warm-up
  if (!s.ok()) return fail("warm-up: " + s.toString());
  const double t0 = nowMs();
  for (int i = 0; i < iters; ++i) {
    s = (*client)->pushPull(1, src, dst).wait(Deadline::afterMs(120000));
    if (!s.ok()) return fail("op " + std::to_string(i) + ": " + s.toString());
  }
  const double ms = (nowMs() - t0) / iters;
  if (std::memcmp(result.data(), in.data(), bytes) != 0) {
    return fail("the result is not the worker's own input (one worker: the sum is its input)");
  }
  (*client)->close();
  out << ms << "\n";
  return 0;
}

CaseResult runCase(const std::string& dir, const std::string& transport, size_t bytes, int iters) {
  const std::string caseDir = dir + "/" + transport;
  std::filesystem::create_directories(caseDir + "/store");
  const std::string storeUrl = "file://" + caseDir + "/store";
  const std::string sock = caseDir + "/memif.sock";
  std::vector<std::string> args = {
      COFAB_AGGD_PATH, "--store", storeUrl,    "--workers", "1",      "--id", "0",
      "--servers",     "1",       "--engines", "1",         "--http", "off",  "--transport",
      transport};
  if (transport == "dpdk") {
    // The daemon's dpdk context takes its port from the environment it inherits.
    ::setenv("COFAB_DPDK_EAL_ARGS", memifEalArgs(true).c_str(), 1);
    ::setenv("COFAB_DPDK_VDEV", memifVdev(sock, true).c_str(), 1);
    args.insert(args.end(), {"--listen", ""});
  }
  const pid_t daemon = spawnChild(COFAB_AGGD_PATH, args);
  ::unsetenv("COFAB_DPDK_EAL_ARGS");
  ::unsetenv("COFAB_DPDK_VDEV");
  if (daemon < 0) return {-1, "could not start cofab-aggd"};
  const std::string resultPath = caseDir + "/result";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (transport == "dpdk") {
      ::setenv("COFAB_DPDK_EAL_ARGS", memifEalArgs(false).c_str(), 1);
      ::setenv("COFAB_DPDK_VDEV", memifVdev(sock, false).c_str(), 1);
    }
    _exit(worker(storeUrl, transport, bytes, iters, resultPath));
  }
  int st = 0;
  if (pid > 0) waitpid(pid, &st, 0);
  // A daemon that died early (say its EAL could not start) shows up only as the worker's
  // connect timing out: name it.
  int dst = 0;
  const bool daemonGone = waitpid(daemon, &dst, WNOHANG) == daemon;
  if (!daemonGone) {
    kill(daemon, SIGTERM);
    waitpid(daemon, &dst, 0);
  }
  CaseResult r;
  if (pid < 0) return {-1, "could not fork the worker"};
  if (daemonGone) {
    r.error = "cofab-aggd --transport " + transport + " exited before the worker finished (" +
              (WIFEXITED(dst) ? "exit code " + std::to_string(WEXITSTATUS(dst))
                              : "signal " + std::to_string(WTERMSIG(dst))) +
              ")";
    return r;
  }
  std::ifstream in(resultPath);
  std::string first;
  if (!(in >> first)) {
    r.error = "the worker wrote no result (exit status " + std::to_string(st) + ")";
  } else if (first == "error") {
    std::getline(in, r.error);
  } else {
    r.ms = std::atof(first.c_str());
  }
  return r;
}

}  // namespace
}  // namespace cofab::bench

int main(int argc, char** argv) {
  using namespace cofab::bench;
  const size_t bytes = parseSize(argValue(argc, argv, "--bytes", "16M")) / 4 * 4;
  const int iters = std::max(1, std::atoi(argValue(argc, argv, "--iters", "20").c_str()));
  if (bytes == 0) {
    std::fprintf(stderr, "--bytes must be a size such as 16M\n");
    return 2;
  }
  const std::string dir = makeTempDir("cofab-dpdk-pushpull");
  if (dir.empty()) return 1;
  const CaseResult tcp = runCase(dir, "tcp", bytes, iters);
  const CaseResult dpdk = runCase(dir, "dpdk", bytes, iters);
  std::filesystem::remove_all(dir);
  auto gbps = [&](double ms) {
    return ms > 0 ? 2.0 * static_cast<double>(bytes) * 8 / (ms * 1e6) : -1;
  };
  for (const auto* c : {&tcp, &dpdk}) {
    if (!c->error.empty()) {
      std::printf("%s: %s\n", c == &tcp ? "tcp" : "dpdk", c->error.c_str());
    }
  }
  std::printf(
      "push-pull %zu B f32 through cofab-aggd, %d ops: tcp %.2f ms (%.2f Gbit/s), dpdk %.2f "
      "ms (%.2f Gbit/s)\n",
      bytes, iters, tcp.ms, gbps(tcp.ms), dpdk.ms, gbps(dpdk.ms));
  std::printf(
      "RESULT dpdk_pushpull bytes=%zu iters=%d dpdk_ms=%.3f tcp_ms=%.3f dpdk_gbps=%.2f "
      "tcp_gbps=%.2f dpdk_vs_tcp=%s\n",
      bytes, iters, dpdk.ms, tcp.ms, gbps(dpdk.ms), gbps(tcp.ms),
      dpdk.ms > 0 && tcp.ms > 0 ? std::to_string(dpdk.ms / tcp.ms).c_str() : "nan");
  return tcp.error.empty() && dpdk.error.empty() ? 0 : 1;
}

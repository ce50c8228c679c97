// gloo_allreduce_bench: Gloo's allreduce (gloo::allreduce, TCP transport, FileStore
// rendezvous) measured exactly like cofab_comm_bench: N forked ranks, barrier, back-to-back
// ops, the slowest rank's time / iterations. f32 sum, in place.
//
//   gloo_allreduce_bench --ranks 4 --sizes 4K,64M
// Ends with: RESULT gloo_allreduce bytes=... ranks=... ms=...
#include <sys/wait.h>
#include <unistd.h>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/comm/bench_common.h"

namespace {

double nowSec() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void allreduceMax(const std::shared_ptr<gloo::Context>& ctx, double* v) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v, 1);
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
  o.setTag(7);
  gloo::allreduce(o);
}

void allreduceSum(const std::shared_ptr<gloo::Context>& ctx, double* v) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v, 1);
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
  o.setTag(8);
  gloo::allreduce(o);
}

int child(int rank, int ranks, const std::string& dir, const std::vector<size_t>& sizes, int fd) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(store, dev);
  size_t maxBytes = 0;
  for (size_t s : sizes) maxBytes = std::max(maxBytes, s);
  std::vector<float> a(maxBytes / 4 + 1, 1.0f);
  std::string out;
  for (size_t bytes : sizes) {
    const size_t count = bytes / 4;
    // One options object (and so one registered buffer) per size, reused by every call: Gloo's
    // best case.
    gloo::AllreduceOptions o(ctx);
    o.setOutput(a.data(), count);
    o.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    auto once = [&] { gloo::allreduce(o); };
    const int iters = cofab::bench::itersFor(bytes);
    for (int w = 0; w < 2; ++w) once();
    gloo::BarrierOptions b(ctx);
    gloo::barrier(b);
    const double t0 = nowSec();
    const double c0 = cofab::bench::cpuSeconds();
    for (int i = 0; i < iters; ++i) once();
    double elapsed = nowSec() - t0;
    double cpu = cofab::bench::cpuSeconds() - c0;
    allreduceMax(ctx, &elapsed);
    allreduceSum(ctx, &cpu);
    char line[160];
    std::snprintf(line, sizeof(line),
                  "RESULT gloo_allreduce bytes=%zu ranks=%d ms=%.4f cpu_ms=%.4f\n", bytes, ranks,
                  elapsed * 1e3 / iters, cpu * 1e3 / iters);
    out += line;
  }
  if (rank == 0 && write(fd, out.data(), out.size()) != static_cast<ssize_t>(out.size())) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int ranks = std::atoi(cofab::bench::argValue(argc, argv, "--ranks", "2").c_str());
  const auto sizes = cofab::bench::parseSizes(
      cofab::bench::argValue(argc, argv, "--sizes", cofab::bench::kDefaultSizes));
  char dirTemplate[] = "/tmp/gloo-bench-XXXXXX";
  if (mkdtemp(dirTemplate) == nullptr) return 1;
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      _exit(child(r, ranks, dirTemplate, sizes, fds[1]));
    }
    pids.push_back(pid);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(got));
  int failed = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::string cleanup = std::string("rm -rf '") + dirTemplate + "'";
  if (std::system(cleanup.c_str()) != 0) return 1;
  std::fputs(text.c_str(), stdout);
  return failed ? 1 : 0;
}

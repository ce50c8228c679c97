// cofab_comm_bench: allreduce, allgather and broadcast over a transport (tcp by default) with
// N forked processes meeting through a FileStore (or, with --threads, N threads of this process
// meeting through a HashStore); reports time per op, algbw and busbw (nccl-tests definitions) and
// a memcpy bandwidth for the machine's copy ceiling.
//
//   cofab_comm_bench --ranks 4 --ops allreduce,allgather,broadcast --sizes 4K,1M,64M
//   cofab_comm_bench --threads --transport tcp --ranks 4
//
// Threads as ranks exist for transports that only work inside one process here: the same main
// is built as cofab-rdma-comm-bench with "rdma" bound to the verbs emulation (bench/rdma/). With
// --threads the CPU figure is the whole process's per op (ranks share it), not a sum over
// processes.
//
// Output ends with RESULT lines (DESIGN.md §7):
//   RESULT comm_allreduce bytes=67108864 ranks=4 ms=... algbw_gbs=... busbw_gbs=...
//   RESULT memcpy bytes=67108864 gbs=...
// `bytes` is the per-rank buffer (allgather: the gathered output), as nccl-tests counts it.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/comm/bench_common.h"
#include "bench/support/result_reporter.h"
#include "fabric/comm/collectives.h"
#include "fabric/rendezvous/file_store.h"
#include "fabric/rendezvous/hash_store.h"

// What "rdma" is bound to in this binary: libibverbs.so.1, or the verbs emulation (a test
// double, set by bench/rdma's build of this file) whose figures say nothing about a NIC.
#ifndef COFAB_BENCH_RDMA_BINDING
#define COFAB_BENCH_RDMA_BINDING "real"
#endif

namespace cofab::bench {
namespace {

using comm::Communicator;

double nowSec() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Measurement {
  std::string op;
  size_t bytes;
  double ms;
  double cpuMs;  // all ranks together, per op
};

Status runOp(Communicator& c, const std::string& op, std::vector<float>& a, std::vector<float>& b,
             size_t count) {
  const int n = c.size();
  if (op == "allreduce") {
    return comm::allreduce(c, TensorView(a.data(), count, DType::kF32));
  }
  if (op == "allgather") {
    const size_t per = count / static_cast<size_t>(n);
    return comm::allgather(c, TensorView(a.data(), per, DType::kF32),
                           TensorView(b.data(), per * static_cast<size_t>(n), DType::kF32));
  }
  return comm::broadcast(c, TensorView(a.data(), count, DType::kF32));
}

// One rank's measurements. `sumCpu`: add the ranks' CPU seconds (processes); threads share one
// process whose CPU counter already covers every rank.
Status measureRank(Communicator& c, const std::vector<std::string>& ops,
                   const std::vector<size_t>& sizes, bool sumCpu, std::vector<Measurement>* out) {
  size_t maxBytes = 0;
  for (size_t s : sizes) maxBytes = std::max(maxBytes, s);
  std::vector<float> a(maxBytes / 4 + 1, 1.0f), b(maxBytes / 4 + 1, 0.0f);
  for (const auto& op : ops) {
    for (size_t bytes : sizes) {
      const size_t count = bytes / 4;
      const int iters = itersFor(bytes);
      Status s;
      for (int w = 0; w < 2 && s.ok(); ++w) s = runOp(c, op, a, b, count);
      if (s.ok()) s = comm::barrier(c);
      const double t0 = nowSec();
      const double c0 = cpuSeconds();
      for (int i = 0; i < iters && s.ok(); ++i) s = runOp(c, op, a, b, count);
      double elapsed = nowSec() - t0;
      double cpu = cpuSeconds() - c0;
      if (s.ok()) {
        comm::AllreduceOptions mo;
        mo.op = comm::ReduceOp::kMax;
        s = comm::allreduce(c, TensorView(&elapsed, 1, DType::kF64), mo);
      }
      if (s.ok() && sumCpu) s = comm::allreduce(c, TensorView(&cpu, 1, DType::kF64));
      COFAB_RETURN_IF_ERROR(s.withContext(op + " " + std::to_string(bytes) + " bytes"));
      out->push_back({op, bytes, elapsed * 1e3 / iters, cpu * 1e3 / iters});
    }
  }
  return OkStatus();
}

std::string formatMeasurements(const std::vector<Measurement>& results) {
  std::string text;
  for (const auto& m : results) {
    char line[256];
    std::snprintf(line, sizeof(line), "%s %zu %.6f %.6f\n", m.op.c_str(), m.bytes, m.ms, m.cpuMs);
    text += line;
  }
  return text;
}

int child(int rank, int ranks, const std::string& dir, const std::string& transport,
          const std::vector<std::string>& ops, const std::vector<size_t>& sizes, int writeFd) {
  auto store = FileStore::open(dir);
  if (!store.ok()) return 1;
  comm::CommOptions o;
  o.transport = transport;
  auto c = Communicator::create(rank, ranks, store->get(), o);
  if (!c.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, c.status().toString().c_str());
    return 1;
  }
  std::vector<Measurement> results;
  if (Status s = measureRank(**c, ops, sizes, /*sumCpu=*/true, &results); !s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.toString().c_str());
    return 1;
  }
  if (rank == 0) {
    const std::string text = formatMeasurements(results);
    if (write(writeFd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return 1;
  }
  return 0;
}

// --threads: every rank a thread of this process. Rank 0's measurements, or the first error.
StatusOr<std::string> runThreads(int ranks, const std::string& transport,
                                 const std::vector<std::string>& ops,
                                 const std::vector<size_t>& sizes) {
  HashStore store;
  std::vector<Status> status(static_cast<size_t>(ranks));
  std::vector<Measurement> rank0;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      comm::CommOptions o;
      o.transport = transport;
      auto c = Communicator::create(r, ranks, &store, o);
      if (!c.ok()) {
        status[static_cast<size_t>(r)] = c.status();
        return;
      }
      std::vector<Measurement> mine;
      status[static_cast<size_t>(r)] = measureRank(**c, ops, sizes, /*sumCpu=*/false, &mine);
      if (r == 0) rank0 = std::move(mine);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    COFAB_RETURN_IF_ERROR(status[static_cast<size_t>(r)].withContext("rank " + std::to_string(r)));
  }
  return formatMeasurements(rank0);
}

// Every rank a forked process meeting through a FileStore. Rank 0's measurements.
StatusOr<std::string> runProcesses(int ranks, const std::string& transport,
                                   const std::vector<std::string>& ops,
                                   const std::vector<size_t>& sizes) {
  char dirTemplate[] = "/tmp/cofab-comm-bench-XXXXXX";
  if (mkdtemp(dirTemplate) == nullptr) return errnoStatus(StatusCode::kIoError, "mkdtemp", errno);
  const std::string dir = dirTemplate;
  int fds[2];
  if (pipe(fds) != 0) return errnoStatus(StatusCode::kIoError, "pipe", errno);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      _exit(child(r, ranks, dir, transport, ops, sizes, fds[1]));
    }
    pids.push_back(pid);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(got));
  close(fds[0]);
  int failed = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::string cleanup = "rm -rf '" + dir + "'";
  if (std::system(cleanup.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  if (failed) return Internal(std::to_string(failed) + " rank process(es) failed (see above)");
  return text;
}

double memcpyGbs(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);
  const int iters = 10;
  const double t0 = nowSec();
  for (int i = 0; i < iters; ++i) {
    src[static_cast<size_t>(i)] = static_cast<char>(i);
    std::memcpy(dst.data(), src.data(), bytes);
  }
  const double t = (nowSec() - t0) / iters;
  return static_cast<double>(bytes) / t / 1e9 + (dst[5] == 7 ? 1e-12 : 0);
}

int run(int argc, char** argv) {
  const int ranks = std::atoi(argValue(argc, argv, "--ranks", "2").c_str());
  const auto sizes = parseSizes(argValue(argc, argv, "--sizes", kDefaultSizes));
  const std::string transport = argValue(argc, argv, "--transport", "tcp");
  std::vector<std::string> ops;
  {
    const std::string list = argValue(argc, argv, "--ops", "allreduce,allgather,broadcast");
    size_t pos = 0;
    while (pos < list.size()) {
      size_t comma = list.find(',', pos);
      if (comma == std::string::npos) comma = list.size();
      ops.push_back(list.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  const bool threads = hasFlag(argc, argv, "--threads");
  std::string text;
  if (threads) {
    auto measured = runThreads(ranks, transport, ops, sizes);
    if (!measured.ok()) {
      std::fprintf(stderr, "%s\n", measured.status().toString().c_str());
      return 1;
    }
    text = *measured;
  } else {
    auto measured = runProcesses(ranks, transport, ops, sizes);
    if (!measured.ok()) {
      std::fprintf(stderr, "%s\n", measured.status().toString().c_str());
      return 1;
    }
    text = *measured;
  }
  std::printf("%-10s %12s %6s %12s %12s %12s\n", "op", "bytes", "ranks", "time_ms", "algbw_GB/s",
              "busbw_GB/s");
  std::vector<std::vector<std::pair<std::string, std::string>>> lines;
  std::vector<std::string> names;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;
    char op[32];
    size_t bytes = 0;
    double ms = 0, cpuMs = 0;
    if (std::sscanf(text.substr(pos, nl - pos).c_str(), "%31s %zu %lf %lf", op, &bytes, &ms,
                    &cpuMs) == 4) {
      const double algbw = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
      const double busbw = algbw * busFactor(op, ranks);
      std::printf("%-10s %12zu %6d %12.4f %12.3f %12.3f\n", op, bytes, ranks, ms, algbw, busbw);
      names.push_back(std::string("comm_") + op);
      lines.push_back({{"bytes", std::to_string(bytes)},
                       {"ranks", std::to_string(ranks)},
                       {"transport", transport},
                       {"ranks_as", threads ? "threads" : "processes"},
                       {"ms", num(ms)},
                       {"cpu_ms", num(cpuMs)},
                       {"algbw_gbs", num(algbw)},
                       {"busbw_gbs", num(busbw)}});
      if (transport == "rdma") lines.back().push_back({"binding", COFAB_BENCH_RDMA_BINDING});
    }
    pos = nl + 1;
  }
  const size_t copyBytes = size_t{64} << 20;
  const double copy = memcpyGbs(copyBytes);
  std::printf("memcpy %zu bytes: %.2f GB/s (one core)\n", copyBytes, copy);
  for (size_t i = 0; i < lines.size(); ++i) printResult(names[i], lines[i]);
  printResult("memcpy", {{"bytes", std::to_string(copyBytes)}, {"gbs", num(copy)}});
  return 0;
}

}  // namespace
}  // namespace cofab::bench

int main(int argc, char** argv) { return cofab::bench::run(argc, argv); }

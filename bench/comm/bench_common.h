// Shared by the collective benchmarks (cofab's and the Gloo / Open MPI peers): command-line
// sizes, iteration counts, and the nccl-tests bandwidth definitions, so every program measures
// the same way: barrier, `iters` back-to-back operations, the slowest rank's time / iters.
#pragma once

#include <sys/resource.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "bench/support/bench_util.h"

namespace cofab::bench {

// "4K,64K,1M,64M" -> bytes. K/M/G are binary.
inline std::vector<size_t> parseSizes(const std::string& text) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(parseSize(text.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

inline const char* kDefaultSizes = "4K,64K,1M,16M,64M,256M";

// Enough iterations for a stable mean without spending minutes on 256 MiB.
inline int itersFor(size_t bytes) {
  const size_t budget = size_t{384} << 20;
  size_t it = bytes == 0 ? 200 : budget / bytes;
  if (it < 3) it = 3;
  if (it > 200) it = 200;
  return static_cast<int>(it);
}

// nccl-tests: algbw = bytes / time; busbw = algbw * factor.
inline double busFactor(std::string_view op, int ranks) {
  if (op == "allreduce") return 2.0 * (ranks - 1) / ranks;
  if (op == "allgather") return static_cast<double>(ranks - 1) / ranks;
  return 1.0;  // broadcast
}

// CPU seconds (user + system) this process has used, all its threads: summed over ranks and
// divided by the iterations it says what an operation costs the machine, a figure that the
// other load on a shared 2-core machine disturbs much less than the wall time.
inline double cpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace cofab::bench

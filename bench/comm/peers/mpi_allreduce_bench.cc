// mpi_allreduce_bench: MPI_Allreduce (f32 sum, in place) measured like cofab_comm_bench:
// barrier, back-to-back ops, the slowest rank's time / iterations. Start it with mpirun, e.g.
//   mpirun --allow-run-as-root --oversubscribe -n 4 --mca pml ob1 --mca btl tcp,self \
//       mpi_allreduce_bench --sizes 4K,64M --label mpi_tcp
// Ends with: RESULT <label>_allreduce bytes=... ranks=... ms=...
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/comm/bench_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const auto sizes = cofab::bench::parseSizes(
      cofab::bench::argValue(argc, argv, "--sizes", cofab::bench::kDefaultSizes));
  const std::string label = cofab::bench::argValue(argc, argv, "--label", "mpi");
  size_t maxBytes = 0;
  for (size_t s : sizes) maxBytes = std::max(maxBytes, s);
  std::vector<float> a(maxBytes / 4 + 1, 1.0f);
  for (size_t bytes : sizes) {
    const int count = static_cast<int>(bytes / 4);
    const int iters = cofab::bench::itersFor(bytes);
    for (int w = 0; w < 2; ++w) {
      MPI_Allreduce(MPI_IN_PLACE, a.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    const double c0 = cofab::bench::cpuSeconds();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, a.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double elapsed = MPI_Wtime() - t0, slowest = 0;
    double cpu = cofab::bench::cpuSeconds() - c0, cpuTotal = 0;
    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&cpu, &cpuTotal, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("RESULT %s_allreduce bytes=%zu ranks=%d ms=%.4f cpu_ms=%.4f\n", label.c_str(),
                  bytes, ranks, slowest * 1e3 / iters, cpuTotal * 1e3 / iters);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}

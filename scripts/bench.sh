#!/usr/bin/env bash
# Runs every benchmark binary the build produced (bench/<area>/<name>_bench) and collects their
# RESULT lines at the end. Peer comparisons (Gloo, Open MPI) have their own scripts, named in
# bench/RESULTS.md.
#   bash scripts/bench.sh [filter-regex]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
filter=${1:-.}
bash "$root/scripts/build.sh" > /dev/null
results=$(mktemp)
trap 'rm -f "$results"' EXIT
# Programs with their own command line (not Google Benchmark): they would take the
# --benchmark_* flags below for their own arguments, so they are named here and run by hand or
# by their script.
declare -A own_main=(
  [cofab_aggregator_bench]="flags in bench/RESULTS.md (issue 4 sections)"
  [coded_shuffle_broadcast_bench]="commands in docs/CODED.md"
  [coded_shuffle_net_bench]="commands in docs/CODED.md"
  [dist_coded_matmul_bench]="commands in docs/CODED.md"
  [gradient_coding_bench]="commands in docs/CODED.md"
  [gloo_allreduce_bench]="scripts/compare_collectives.sh"
  [mpi_allreduce_bench]="scripts/compare_collectives.sh"
  [dpdk_p2p_bench]="build/bench/dpdk/dpdk_p2p_bench [seconds] [spin us] [cases] (docs/DPDK.md)"
  [dpdk_pushpull_bench]="docs/DPDK.md"
  [cofab_transfer_bench]="scripts/bench_transfer.sh"
)
while IFS= read -r bin; do
  name=$(basename "$bin")
  [[ "$name" =~ $filter ]] || continue
  if [[ -n "${own_main[$name]:-}" ]]; then
    echo "== bench: $name skipped here (own command line): ${own_main[$name]}"
    continue
  fi
  echo "== bench: $name"
  "$bin" --benchmark_min_time=0.2 --benchmark_color=false | tee -a "$results"
done < <(find "$build/bench" -type f -executable -name '*_bench' | sort)
echo "== bench: RESULT lines"
grep '^RESULT ' "$results" || echo "(none)"

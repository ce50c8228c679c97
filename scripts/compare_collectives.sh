#!/usr/bin/env bash
# Allreduce side by side: cofab (tcp), Gloo (tcp, FileStore rendezvous) and Open MPI (tcp, and
# shared memory for reference), same sizes, same ranks, same run; plus cofab's allgather and
# broadcast. Builds what it needs, prints a table with ratios, writes bench/collectives_allreduce.png
# (gnuplot) and ends with one line per size and rank count:
#   RESULT allreduce bytes=67108864 ranks=4 cofab_ms=... gloo_ms=... mpi_tcp_ms=... mpi_shm_ms=...
#
# Usage: scripts/compare_collectives.sh [--sizes 4K,64K,1M,16M,64M,256M] [--ranks "2 4"]
#                                       [--rounds N]
# --rounds N (default 1) runs the whole set N times, the implementations taking turns (cofab,
# gloo, mpi, cofab, ...), and reports each one's median: on a VM whose speed drifts within minutes
# one round can favour whichever ran in the fast spell.
# Environment: BUILD_DIR (default build-bench, RelWithDebInfo), PLOT (default
# bench/collectives_allreduce.png). Peers missing from the build are reported as "n/a".
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
plot="${PLOT:-$root/bench/collectives_allreduce.png}"
sizes="4K,64K,1M,16M,64M,256M"
ranks="2 4"
rounds=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sizes) sizes="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
  echo "compare_collectives: --rounds must be a positive integer, got '$rounds'" >&2
  exit 2
fi

echo "== building in $build"
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOFAB_BUILD_TESTS=OFF \
    -DCOFAB_BUILD_EXAMPLES=OFF >/dev/null
fi
targets=(cofab_comm_bench)
grep -q "gloo_allreduce_bench" "$build/Makefile" 2>/dev/null || cmake "$build" >/dev/null
for t in gloo_allreduce_bench mpi_allreduce_bench; do
  if grep -q "^$t:" "$build/Makefile" 2>/dev/null; then targets+=("$t"); fi
done
cmake --build "$build" --target "${targets[@]}" -j2 >/dev/null
bin="$build/bench/comm"

log="$(mktemp)"
trap 'rm -f "$log" "$log.dat" "$log.table"' EXIT
mpirun_base=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1)

for ((round = 1; round <= rounds; round++)); do
  for n in $ranks; do
    of=""
    ((rounds > 1)) && of=", round $round of $rounds"
    echo "== $n ranks: cofab (tcp)$of"
    # The peers may be missing or fail (their figures then read n/a); cofab's own bench failing
    # is an error of this script.
    if ! "$bin/cofab_comm_bench" --ranks "$n" --ops allreduce,allgather,broadcast \
        --sizes "$sizes" | tee -a "$log" | { grep -v '^RESULT' || true; }; then
      echo "compare_collectives: cofab_comm_bench failed at $n ranks" >&2
      exit 1
    fi
    if [[ -x "$bin/gloo_allreduce_bench" ]]; then
      echo "== $n ranks: gloo (tcp)"
      "$bin/gloo_allreduce_bench" --ranks "$n" --sizes "$sizes" | tee -a "$log" >/dev/null || true
    fi
    if [[ -x "$bin/mpi_allreduce_bench" ]] && command -v mpirun >/dev/null; then
      echo "== $n ranks: open mpi (tcp)"
      "${mpirun_base[@]}" -n "$n" --mca btl tcp,self "$bin/mpi_allreduce_bench" --sizes "$sizes" \
        --label mpi_tcp 2>/dev/null | tee -a "$log" >/dev/null || true
      echo "== $n ranks: open mpi (shared memory)"
      "${mpirun_base[@]}" -n "$n" --mca btl vader,self "$bin/mpi_allreduce_bench" --sizes "$sizes" \
        --label mpi_shm 2>/dev/null | tee -a "$log" >/dev/null || true
    fi
  done
done

# key=value RESULT lines -> table, plot data and the summary RESULT lines. The *_cpu columns
# are CPU milliseconds per operation, all ranks together (user + system).
awk -v datfile="$log.dat" '
  function field(name,   i, kv) {
    for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == name) return kv[2] }
    return ""
  }
  /^RESULT (comm_allreduce|gloo_allreduce|mpi_tcp_allreduce|mpi_shm_allreduce) / {
    impl = $2; sub(/_allreduce$/, "", impl); if (impl == "comm") impl = "cofab"
    b = field("bytes"); r = field("ranks")
    v = field("ms"); if (v != "") msv[impl, r, b] = msv[impl, r, b] " " v
    v = field("cpu_ms"); if (v != "") cpuv[impl, r, b] = cpuv[impl, r, b] " " v
    if (!((r, b) in seen)) { seen[r, b] = 1; order[++count] = r SUBSEP b }
  }
  # The median of the space-separated values in s ("" when none): one value per round.
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " "); if (n == 0) return ""
    for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : sprintf("%.3f", (a[n / 2] + a[n / 2 + 1]) / 2)
  }
  function show(v) { return v == "" ? "n/a" : v }
  function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "n/a" : sprintf("%.2f", a / b) }
  END {
    for (key in msv) ms[key] = median(msv[key])
    for (key in cpuv) cpu[key] = median(cpuv[key])
    printf "\n%6s %11s %10s %10s %10s %10s %11s %13s %10s %10s %10s\n", "ranks", "bytes", "cofab_ms", "gloo_ms", \
      "mpi_tcp_ms", "mpi_shm_ms", "cofab/gloo", "cofab/mpi_tcp", "cofab_cpu", "gloo_cpu", "mpitcp_cpu"
    for (i = 1; i <= count; i++) {
      split(order[i], k, SUBSEP); r = k[1]; b = k[2]
      c = ms["cofab", r, b]; g = ms["gloo", r, b]; t = ms["mpi_tcp", r, b]; s = ms["mpi_shm", r, b]
      printf "%6s %11s %10s %10s %10s %10s %11s %13s %10s %10s %10s\n", r, b, show(c), show(g), show(t), show(s), \
        ratio(c, g), ratio(c, t), show(cpu["cofab", r, b]), show(cpu["gloo", r, b]), show(cpu["mpi_tcp", r, b])
      printf "%s %s %s %s %s %s\n", r, b, show(c), show(g), show(t), show(s) > datfile
      lines[i] = sprintf("RESULT allreduce bytes=%s ranks=%s cofab_ms=%s gloo_ms=%s mpi_tcp_ms=%s mpi_shm_ms=%s", \
        b, r, show(c), show(g), show(t), show(s))
    }
    print ""
    for (i = 1; i <= count; i++) print lines[i]
  }' "$log" > "$log.table"
head -n -"$(grep -c '^RESULT allreduce' "$log.table")" "$log.table"

if command -v gnuplot >/dev/null && [[ -s "$log.dat" ]]; then
  plots=""
  for n in $ranks; do
    for col in 3:cofab 4:gloo 5:mpi_tcp 6:mpi_shm; do
      c="${col%%:*}"; name="${col#*:}"
      plots+="${plots:+, }'$log.dat' using (\$1==$n ? \$2 : 1/0):(\$$c) with linespoints title '$name $n ranks'"
    done
  done
  gnuplot <<GP 2>/dev/null && echo "plot: $plot"
set terminal png size 1000,650
set output '$plot'
set title 'allreduce f32 sum over TCP on one host (lower is better)'
set logscale xy
set xlabel 'bytes per rank'
set ylabel 'time per allreduce (ms)'
set key left top
set datafile missing 'n/a'
plot $plots
GP
fi
grep '^RESULT allreduce' "$log.table"

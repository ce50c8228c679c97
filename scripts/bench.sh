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
while IFS= read -r bin; do
  name=$(basename "$bin")
  [[ "$name" =~ $filter ]] || continue
  echo "== bench: $name"
  "$bin" --benchmark_min_time=0.2 --benchmark_color=false | tee -a "$results"
done < <(find "$build/bench" -type f -executable -name '*_bench' | sort)
echo "== bench: RESULT lines"
grep '^RESULT ' "$results" || echo "(none)"

#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (build-fuzz/) and runs each for a while: CI runs it
# briefly so that the fuzzers keep building, a longer run is the same command with more seconds.
#   bash scripts/fuzz.sh          every fuzzer for 20 s
#   bash scripts/fuzz.sh 600      every fuzzer for 10 minutes
# A crash leaves its input in build-fuzz/crashes/ and fails the script.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-20}
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: the run time must be a positive number of seconds, got '$seconds'" >&2
  exit 2
fi
bash "$root/scripts/setup.sh" --fuzz
build=${BUILD_DIR:-$root/build-fuzz}
fuzzers=(wire_header_fuzzer)
echo "fuzz: building ${fuzzers[*]} in $build"
mkdir -p "$build"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCOFAB_BUILD_FUZZERS=ON -DCOFAB_BUILD_BENCH=OFF \
  -DCOFAB_WITH_CUDA=OFF > "$build/configure.log" 2>&1 || {
  cat "$build/configure.log" >&2; echo "fuzz: configure FAILED" >&2; exit 1; }
cmake --build "$build" -j"${JOBS:-2}" --target "${fuzzers[@]}" > "$build/build.log" 2>&1 || {
  grep -E "error" "$build/build.log" | head -40 >&2
  echo "fuzz: build FAILED; full log in $build/build.log" >&2; exit 1; }
mkdir -p "$build/crashes"
for f in "${fuzzers[@]}"; do
  bin=$(find "$build" -name "$f" -type f -perm -u+x | head -1)
  [[ -n "$bin" ]] || { echo "fuzz: $f was not built" >&2; exit 1; }
  echo "fuzz: $f for $seconds s"
  rc=0
  "$bin" -max_total_time="$seconds" -artifact_prefix="$build/crashes/" > "$build/$f.log" 2>&1 || rc=$?
  grep -E "DONE|ERROR|SUMMARY" "$build/$f.log" || true
  if [[ $rc -ne 0 ]]; then
    tail -40 "$build/$f.log" >&2
    echo "fuzz: $f FAILED (exit $rc; input in $build/crashes/, log $build/$f.log)" >&2
    exit 1
  fi
done
echo "fuzz: all fuzzers ran clean"

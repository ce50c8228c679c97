#!/usr/bin/env bash
# The GPU checks, for a lent GPU machine that has the CUDA driver but none of cofab's Debian
# dependencies (and no package registry). Two halves:
#
#   bash scripts/gpu_check.sh pack        here, after scripts/build.sh: copies the GPU-relevant
#                                         test and bench binaries, cofab's libraries and the
#                                         Debian ones they need (not glibc, not CUDA's) into
#                                         .devrun/ (stripped of debug info, about 51-55 MiB)
#   bash scripts/gpu_check.sh run [OUT]   there, with .devrun/ carried: GPU tests, the coded
#                                         matmul and service tests, compute-sanitizer memcheck
#                                         and racecheck on the kernel tests, gpu_ops_bench, and
#                                         dpdk_p2p_bench (memif) for its core-count contrast;
#                                         one log, OUT/steps.log (default OUT: .devrun/out)
#
# .devrun/ must be ignored (.git/info/exclude) so that it travels only when carried.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dev=$root/.devrun
build=${BUILD_DIR:-$root/build}
pmds=/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0

bins=(tests/gpu/gpu_kernel_tests tests/gpu/gpu_twin_tests tests/gpu/gpu_half_tests
      tests/core/core_tests tests/coding/coding_matmul_tests tests/coding/coding_erasure_tests
      tests/fabric/coded/coded_service_tests bench/gpu/gpu_ops_bench bench/dpdk/dpdk_p2p_bench)

pack() {
  rm -rf "$dev" && mkdir -p "$dev/bin" "$dev/lib" "$dev/pmds"
  for b in "${bins[@]}"; do cp "$build/$b" "$dev/bin/" || exit 1; done
  # memif and the ring mempool are EAL plugins (dlopened from $pmds), not linked.
  # (EAL loads only names ending in .so or .so.<ABI>.)
  cp -L "$pmds/librte_net_memif.so" "$pmds/librte_mempool_ring.so" "$dev/pmds/"
  # Everything the binaries and plugins load, except glibc's own libraries and CUDA's (the GPU
  # machine brings a driver-matched CUDA; carrying cuBLAS would also break the size limit).
  for f in "$dev"/bin/* "$dev"/pmds/*; do ldd "$f"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/cuda' |
    while read -r lib; do cp -L "$lib" "$dev/lib/"; done
  strip --strip-debug "$dev"/bin/* "$dev"/lib/* "$dev"/pmds/*
  du -sh "$dev"
}

# Finds a directory holding libname on the GPU machine: CUDA's own folders, then pip's wheels.
find_lib_dir() {
  local name=$1 d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e $d/$name ]] && { echo "$d"; return; }
  done
  d=$(find / -xdev -name "$name" -not -path "*/proc/*" 2>/dev/null | head -1)
  [[ -n $d ]] && dirname "$d"
}

step() {  # step NAME TIMEOUT CMD...: runs CMD with a deadline, its log under $out, a summary line
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/step.log" 2>&1
  local rc=$?
  # A sanitizer that found something fails the step even though the tests passed.
  grep -q -E '(ERROR|RACECHECK) SUMMARY: [1-9]' "$out/step.log" && rc=1
  ((rc != 0)) && failed+=("$name")
  echo "== $name rc=$rc $((SECONDS - t0))s"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY|RACECHECK SUMMARY|^RESULT|tests? ran' \
    "$out/step.log" | head -40
  # One log for every step: the GPU machine returns at most 8 files.
  { echo "===== $name rc=$rc"; cat "$out/step.log"; } >> "$out/steps.log"
  rm -f "$out/step.log"
}

run() {
  out=${1:-$dev/out}
  failed=()
  mkdir -p "$out"
  nvidia-smi -L
  local cublas cudart
  cublas=$(find_lib_dir libcublas.so.13)
  cudart=$(find_lib_dir libcudart.so.13)
  echo "cublas: ${cublas:-missing}  cudart: ${cudart:-missing}"
  export LD_LIBRARY_PATH=$dev/lib:${cudart}:${cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local b=$dev/bin brief=--gtest_brief=1
  step gpu_kernel 90 "$b/gpu_kernel_tests" $brief
  step gpu_twin 30 "$b/gpu_twin_tests" $brief
  step gpu_half 90 "$b/gpu_half_tests" $brief
  step core 60 "$b/core_tests" $brief
  step coding_matmul 90 "$b/coding_matmul_tests" $brief
  step coding_erasure 60 "$b/coding_erasure_tests" $brief
  step coded_service 120 "$b/coded_service_tests" $brief
  if command -v compute-sanitizer > /dev/null; then
    # Less the test that leaves a CUDA error unread on purpose: memcheck counts that API error.
    step memcheck 150 compute-sanitizer --tool memcheck --leak-check full "$b/gpu_kernel_tests" \
      $brief --gtest_filter=-*AnErrorTheCallerLeftUnread*
    step racecheck 120 compute-sanitizer --tool racecheck "$b/gpu_kernel_tests" $brief
  else
    echo "== compute-sanitizer: not on this machine"
  fi
  step gpu_ops_bench 150 "$b/gpu_ops_bench" --benchmark_min_time=0.3
  # DPDK finds its plugins only in the folder compiled into librte_eal.
  # (EAL refuses a world-writable plugin folder.)
  if [[ ! -d $pmds ]]; then mkdir -p -m 755 "$pmds" && cp "$dev"/pmds/* "$pmds/"; fi
  step dpdk_p2p 90 "$b/dpdk_p2p_bench" 2 50 raw,dpdk,tcp,zc
  if ((${#failed[@]} > 0)); then
    echo "gpu_check: FAILED: ${failed[*]} (see $out/steps.log)"
    return 1
  fi
  echo "gpu_check: every step passed"
}

case "${1:-}" in
  pack) pack ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash scripts/gpu_check.sh pack|run [OUT]" >&2; exit 2 ;;
esac

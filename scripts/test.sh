#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, builds, runs ctest.
#   bash scripts/test.sh                              the suite
#   bash scripts/test.sh --sanitize address,undefined the suite under ASan+UBSan (build-asan/)
#   bash scripts/test.sh --sanitize thread            the suite under TSan (build-tsan/)
#   (--sanitize=VALUE works too)
# Extra arguments after the options go to ctest (e.g. -L unit, -R Store).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sanitize=""
usage="usage: test.sh [--sanitize[=] address,undefined|thread] [ctest args]"
if [[ "${1:-}" == --sanitize=* ]]; then
  sanitize=${1#--sanitize=}
  [[ -n "$sanitize" ]] || { echo "$usage" >&2; exit 2; }
  shift
elif [[ "${1:-}" == "--sanitize" ]]; then
  [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }
  sanitize=$2
  shift 2
fi

bash "$root/scripts/setup.sh"
if [[ -n "$sanitize" ]]; then
  # A BUILD_DIR given wins; else one directory per sanitizer, never the plain build's.
  if [[ -z "${BUILD_DIR:-}" ]]; then
    case "$sanitize" in
      address*) BUILD_DIR=$root/build-asan ;;
      thread) BUILD_DIR=$root/build-tsan ;;
      *) BUILD_DIR=$root/build-${sanitize%%,*} ;;
    esac
  fi
  export BUILD_DIR
  # Sanitized builds skip benchmarks: their numbers would mean nothing. They compile at -O1 with
  # line tables only (-g1), what the sanitizers' docs suggest and all their reports need: an ASan
  # build at -O2 -g took 569 s on the 2-core CI machine, and this halves it (one test file: 13.7 s
  # against 6.7 s).
  bash "$root/scripts/build.sh" -DCOFAB_SANITIZE="$sanitize" -DCOFAB_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
else
  export BUILD_DIR=${BUILD_DIR:-$root/build}
  bash "$root/scripts/build.sh"
fi

# DPDK's libraries are not built with TSan: packet memory handed from one poller to another
# through DPDK's own rings (volatile accesses and rte_smp barriers, in uninstrumented code)
# shows as races TSan cannot rule out. Under TSan the dpdk binaries and the dpdk instances of
# the transport contract suite are left out; they run in the plain and ASan suites.
excluded=()
[[ "$sanitize" == thread ]] && excluded=(-LE dpdk -E '/dpdk$|[Dd]pdk')

echo "test: running ctest in $BUILD_DIR"
cd "$BUILD_DIR"
start=$(date +%s)
ctest -j2 --output-on-failure --timeout 300 "${excluded[@]}" "$@"
echo "test: done in $(( $(date +%s) - start )) s"

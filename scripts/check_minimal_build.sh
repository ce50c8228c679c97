#!/usr/bin/env bash
# Builds cofab with every optional backend off (no ISA-L, DPDK, RDMA verbs headers or CUDA) and
# runs the unit tests there: the portable fallbacks must build and pass on their own.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export BUILD_DIR=${BUILD_DIR:-$root/build-minimal}
# No debug info (-g0): this build only has to compile and pass its unit tests, and it compiles
# about a third faster without (CI runs it after two other full builds).
bash "$root/scripts/build.sh" -DCOFAB_WITH_ISAL=OFF -DCOFAB_WITH_DPDK=OFF -DCOFAB_WITH_RDMA=OFF \
  -DCOFAB_WITH_CUDA=OFF -DCOFAB_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g0 -DNDEBUG"
grep -q 'ISA-L=0 DPDK=0 RDMA=0 CUDA=0' "$BUILD_DIR/configure.log" || {
  echo "check_minimal_build: a backend was not switched off"; exit 1; }
cd "$BUILD_DIR"
ctest -j2 --output-on-failure --timeout 300 -L unit

#!/usr/bin/env bash
# Transfer manager benchmarks in one command: incast with and without credits (4 workers, one
# aggregator) and the DNN replay (4 worker processes, 2 cofab-aggd daemons; fifo vs priority vs
# no overlap) for the VGG-16-, ResNet-50- and transformer-like profiles in bench/transfer/models.
#   bash scripts/bench_transfer.sh [extra cofab_transfer_bench flags, e.g. --models vgg16]
# Builds only what it needs (-j2). Ends with RESULT transfer_incast / RESULT dnn_replay lines.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  bash "$root/scripts/build.sh" > /dev/null
fi
cmake --build "$build" -j2 --target cofab_transfer_bench cofab-aggd > /dev/null
timeout 1200 "$build/bench/transfer/cofab_transfer_bench" "$@"

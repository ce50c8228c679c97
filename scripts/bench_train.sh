#!/usr/bin/env bash
# Fashion-MNIST MLP: 4 workers training synchronously through aggregator daemons against the
# same model trained in one process with the same hyperparameters and global batch.
#   bash scripts/bench_train.sh [epochs] [aggregators]
# Ends with: RESULT train algo=sync slow=0 workers=4 test_acc=... single_process_acc=... samples_per_s=...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
epochs=${1:-5}
aggs=${2:-2}
workers=4
args="--epochs $epochs --batch 128 --lr 0.05 --momentum 0.9 --seed 1"
bash "$root/scripts/build.sh" > /dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== bench_train: one process"
"$build/examples/train_mnist/train_mnist" $args --sync local | tee "$out/local.txt"
echo "== bench_train: $workers workers, $aggs aggregator daemon(s)"
# The daemon's path reaches the role's /bin/sh in a variable: no character of it is shell syntax.
export COFAB_BENCH_AGGD=$build/aggregator/cofab-aggd
"$build/fabric/bin/cofab-run" -n "$workers" --role "aggd:$aggs:\"\$COFAB_BENCH_AGGD\"" -- \
  "$build/examples/train_mnist/train_mnist" $args --sync aggregator | tee "$out/dist.txt"

field() { grep -o "$1=[0-9.]*" "$2" | tail -1 | cut -d= -f2; }
single=$(field test_acc "$out/local.txt")
dist=$(field test_acc "$out/dist.txt")
rate=$(field samples_per_s "$out/dist.txt")
single_rate=$(field samples_per_s "$out/local.txt")
echo "RESULT train algo=sync slow=0 workers=$workers aggregators=$aggs epochs=$epochs test_acc=$dist single_process_acc=$single samples_per_s=$rate single_process_samples_per_s=$single_rate"

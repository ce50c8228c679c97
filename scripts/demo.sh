#!/usr/bin/env bash
# The main job, end to end on this machine: install what is missing, build, then train an MLP on
# Fashion-MNIST with 4 worker processes that sum their gradients through 2 aggregator daemons
# (cofab-aggd), all started by cofab-run, which also hosts the rendezvous store.
#   bash scripts/demo.sh [epochs] [workers] [aggregators]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
epochs=${1:-3}
workers=${2:-4}
aggs=${3:-2}
for n in "$epochs" "$workers" "$aggs"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "usage: demo.sh [epochs] [workers] [aggregators], each >= 1" >&2; exit 2; }
done
# The global batch (128 by default) is split evenly over the workers: round it down to a multiple.
batch=$((128 / workers * workers))
(( batch >= workers )) || { echo "demo.sh: at most 128 workers" >&2; exit 2; }
echo "== demo: installing missing packages"
bash "$root/scripts/setup.sh"
echo "== demo: building"
bash "$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}
echo "== demo: what this build can use"
"$build/fabric/bin/cofab-info" | sed -n '1,9p'
echo "== demo: $workers ranks meet through a TcpStore and exchange 1 MiB each"
"$build/fabric/bin/cofab-run" -n "$workers" -- "$build/examples/store_exchange/store_exchange" \
  --bytes 1048576
echo "== demo: $workers workers train on Fashion-MNIST through $aggs aggregator daemon(s)"
# The role command goes through /bin/sh: the daemon's path reaches it in a variable, so that no
# character of it (spaces, quotes, parentheses) is read as shell syntax.
export COFAB_DEMO_AGGD=$build/aggregator/cofab-aggd
"$build/fabric/bin/cofab-run" -n "$workers" --role "aggd:$aggs:\"\$COFAB_DEMO_AGGD\"" -- \
  "$build/examples/train_mnist/train_mnist" --epochs "$epochs" --batch "$batch" --sync aggregator
echo "== demo: done (single-process comparison: bash scripts/bench_train.sh)"

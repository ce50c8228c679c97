#!/usr/bin/env bash
# Training-sync algorithms (docs/SYNC.md) on the Fashion-MNIST MLP: 4 workers (+ 2 cofab-aggd
# daemons, except gossip) for every algorithm, once with equal workers and once with rank 3
# slowed 2x (it sleeps as long as it computed, every step). One table, RESULT lines, and a PNG
# of test accuracy against wall time.
#   bash scripts/bench_sync.sh [epochs] [png]
# Env: ALGOS (default all), SLOW ("0 1"), STALENESS (ssp's clock bound, default 4),
# VERSION_STALENESS (ssp's version bound, default 16: ssp runs by versions unless EXTRA has
# --staleness-unit clocks), EXTRA (more train_mnist flags), BUILD_DIR.
# Ends with: RESULT train algo=<a> slow=<0|1> workers=4 test_acc=... samples_per_s=...
#            bytes_sent=... secs_to_85=... skipped=... (gradcode: rounds completed without a
#            worker, summed over the ranks)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
epochs=${1:-6}
png=${2:-$root/bench/sync/accuracy_vs_time.png}
algos=${ALGOS:-"sync ssp shadowsync easgd eawild gossip int8 onebit gradcode"}
slows=${SLOW:-"0 1"}
staleness=${STALENESS:-4}
workers=4
aggs=2
args="--epochs $epochs --batch 128 --lr 0.05 --momentum 0.9 --seed 1 ${EXTRA:-}"
trainer=$build/examples/train_mnist/train_mnist
[[ -x $trainer && -x $build/aggregator/cofab-aggd && -x $build/fabric/bin/cofab-run ]] ||
  { echo "bench_sync: build first (cmake --build $build --target train_mnist cofab-aggd cofab-run)" >&2; exit 1; }
daemon=$build/aggregator/cofab-aggd
# ssp's bound lives in the daemons (only a daemon with the model store knows --staleness).
"$daemon" --help 2>&1 | grep -q -- --staleness && daemon="$daemon --staleness $staleness"
"$build/aggregator/cofab-aggd" --help 2>&1 | grep -q -- --version-staleness &&
  daemon="$daemon --version-staleness ${VERSION_STALENESS:-16}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

algo_args() {
  case $1 in
    eawild) echo "--threads 2 --sync-every 4" ;;
    easgd) echo "--sync-every 4" ;;
    shadowsync) echo "--shadow-interval-ms 20" ;;
    # 1-bit updates have the magnitude of the block mean everywhere: a smaller step keeps the
    # error-feedback noise down (0.05 loses ~5 points early on).
    onebit) echo "--lr 0.02" ;;
    # s = 1: groups {0,1} and {2,3}; the daemons need the same --gradient-stragglers.
    gradcode) echo "--gradient-stragglers 1" ;;
    *) echo "" ;;
  esac
}

for slow in $slows; do
  for algo in $algos; do
    log=$out/$algo.$slow.txt
    slowargs=""
    [[ $slow == 1 ]] && slowargs="--slow-rank 3 --slow-factor 2"
    echo "== bench_sync: $algo slow=$slow" >&2
    if [[ $algo == gossip ]]; then
      cmd=("$build/fabric/bin/cofab-run" -n $workers --)
    else
      d=$daemon
      [[ $algo == gradcode ]] && d="$daemon --gradient-stragglers 1"
      cmd=("$build/fabric/bin/cofab-run" -n $workers
           --role "aggd:$aggs:$d" --)
    fi
    if ! timeout 900 "${cmd[@]}" "$trainer" $args --sync "$algo" $(algo_args "$algo") $slowargs \
        > "$log" 2>&1; then
      echo "bench_sync: $algo slow=$slow failed:" >&2
      tail -5 "$log" >&2
    fi
    grep -E "^(\[[^]]*\] )?(epoch|train_mnist: final)" "$log" | sed 's/^\[[^]]*\] //' >&2 || true
  done
done

# Per run: accuracy against wall time (rank 0's epoch lines), final figures, bytes summed over ranks.
printf "\n%-11s %4s %8s %9s %9s %10s %12s %10s\n" algo slow test_acc secs_to85 epochs_to85 samples/s bytes_sent vs_f32 >&2
results=()
for slow in $slows; do
  for algo in $algos; do
    log=$out/$algo.$slow.txt
    sed 's/^\[[^]]*\] //' "$log" | awk -v a="$algo" -v s="$slow" \
      '/^epoch [0-9]+: test accuracy/ { e=$2; sub(":","",e); print a, s, $7, $5, e }' \
      > "$out/$algo.$slow.curve"
    acc=$(grep -o "RESULT train_run .*test_acc=[0-9.]*" "$log" | grep -o "test_acc=[0-9.]*" | cut -d= -f2 || true)
    rate=$(grep -o "RESULT train_run .*samples_per_s=[0-9.]*" "$log" | grep -o "samples_per_s=[0-9.]*" | cut -d= -f2 || true)
    bytes=$(grep -o "RESULT sync_worker .*bytes_sent=[0-9]*" "$log" | grep -o "bytes_sent=[0-9]*" |
            cut -d= -f2 | awk '{s+=$1} END {printf "%.0f", s}' || true)
    skipped=$(grep -o "RESULT sync_worker .*skipped=[0-9]*" "$log" | grep -o "skipped=[0-9]*" |
              cut -d= -f2 | awk '{s+=$1} END {printf "%.0f", s}' || true)
    reach=$(awk '$4 >= 0.85 { print $3, $5; exit }' "$out/$algo.$slow.curve")
    secs85=${reach% *}; ep85=${reach#* }
    [[ -z $reach ]] && secs85=none && ep85=none
    [[ $algo == sync ]] && eval "sync_bytes_$slow=$bytes"
    ref=$(eval echo "\${sync_bytes_$slow:-0}")
    ratio=$(awk -v r="$ref" -v b="$bytes" 'BEGIN { if (b > 0 && r > 0) printf "%.1fx", r / b; else print "-" }')
    printf "%-11s %4s %8s %9s %9s %10s %12s %10s\n" "$algo" "$slow" "${acc:-fail}" "$secs85" "$ep85" "${rate:-0}" "$bytes" "$ratio" >&2
    results+=("RESULT train algo=$algo slow=$slow workers=$workers test_acc=${acc:-0} samples_per_s=${rate:-0} bytes_sent=$bytes secs_to_85=$secs85 epochs_to_85=$ep85 epochs=$epochs skipped=${skipped:-0}")
  done
done

if ! command -v gnuplot > /dev/null && [[ $(id -u) == 0 ]]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gnuplot-nox > /dev/null 2>&1 || true
fi
if command -v gnuplot > /dev/null; then
  mkdir -p "$(dirname "$png")"
  plots=()
  for slow in $slows; do
    p=""
    for algo in $algos; do
      [[ -s $out/$algo.$slow.curve ]] || continue
      p+="${p:+, }'$out/$algo.$slow.curve' using 3:4 with linespoints title '$algo'"
    done
    plots+=("set title 'Fashion-MNIST MLP, 4 workers, $( [[ $slow == 1 ]] && echo 'rank 3 slowed 2x' || echo 'equal workers')'; plot $p")
  done
  {
    echo "set terminal pngcairo size 1400,560 noenhanced"
    echo "set output '$png'; set multiplot layout 1,${#plots[@]}"
    echo "set xlabel 'wall time (s)'; set ylabel 'test accuracy'; set key bottom right; set grid"
    echo "set yrange [0.78:0.9]"
    for p in "${plots[@]}"; do echo "$p"; done
    echo "unset multiplot"
  } > "$out/plot.gp"
  gnuplot "$out/plot.gp" 2> "$out/gnuplot.err" || cat "$out/gnuplot.err" >&2
  echo "bench_sync: plot in $png" >&2
else
  echo "bench_sync: gnuplot not found (Debian: gnuplot-nox); no PNG" >&2
fi
printf "%s\n" "${results[@]}"

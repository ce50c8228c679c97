#!/usr/bin/env bash
# The main job, end to end on this machine: install what is missing, build, then start 4 local
# ranks with cofab-run that meet through its TcpStore, exchange data and check it.
#   bash scripts/demo.sh [ranks]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ranks=${1:-4}
echo "== demo: installing missing packages"
bash "$root/scripts/setup.sh"
echo "== demo: building"
bash "$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}
echo "== demo: what this build can use"
"$build/fabric/bin/cofab-info" | sed -n '1,9p'
echo "== demo: $ranks ranks meet through a TcpStore and exchange 1 MiB each"
"$build/fabric/bin/cofab-run" -n "$ranks" -- "$build/examples/store_exchange/store_exchange" --bytes 1048576
echo "== demo: done"

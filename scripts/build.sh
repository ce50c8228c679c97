#!/usr/bin/env bash
# Configures and builds cofab into a build directory (default: build/), with -j2 for the 2-core
# machines this project runs on.
#   scripts/build.sh                       RelWithDebInfo into build/
#   BUILD_DIR=build-asan scripts/build.sh -DCOFAB_SANITIZE=address,undefined
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-2}
echo "build: configuring $build $*"
mkdir -p "$build"
# Failures go to stderr too, so that callers that silence stdout (the bench scripts) still
# show why the build failed.
cmake -S "$root" -B "$build" -DCOFAB_WERROR=ON "$@" > "$build/configure.log" 2>&1 || {
  cat "$build/configure.log" >&2; echo "build: configure FAILED" >&2; exit 1; }
grep -E '^-- cofab' "$build/configure.log" || true
echo "build: compiling with -j$jobs"
start=$(date +%s)
# Progress lines are dropped so that warnings and errors stand out.
set +o pipefail
cmake --build "$build" -j"$jobs" 2>&1 | tee "$build/build.log" |
  { grep -vE '^\[ *[0-9]+%\] (Building|Linking|Built)' || true; }
rc=${PIPESTATUS[0]}
set -o pipefail
if [[ $rc -ne 0 ]]; then
  { grep -E 'error|Error' "$build/build.log" | head -60 || true
    echo "build: FAILED (exit $rc); full log in $build/build.log"; } >&2
  exit "$rc"
fi
echo "build: done in $(( $(date +%s) - start )) s"

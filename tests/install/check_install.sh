#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs a separate consumer
# project against it twice: through find_package(cofab) and through pkg-config.
#   check_install.sh <build-dir> <source-dir-of-consumer> [sanitizers]
set -euo pipefail
build=$1
consumer=$2
# A sanitized cofab needs its consumer linked with the same runtime.
flags=${3:+-fsanitize=$3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
# The installed programs start as they are, with no LD_LIBRARY_PATH (their RPATH).
env -u LD_LIBRARY_PATH "$prefix/bin/cofab-run" --help > "$work/run-help.log" 2>&1 ||
  { echo "check_install: installed cofab-run does not start:"; cat "$work/run-help.log"; exit 1; }
export LD_LIBRARY_PATH=$prefix/lib:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

cmake -S "$consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_FLAGS="$flags" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/cmake-build" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/cmake-build/consumer"

libdir=$(dirname "$(find "$prefix" -name cofab.pc | head -1)")
export PKG_CONFIG_PATH=$libdir
c++ $flags -o "$work/consumer-pc" "$consumer/main.cc" $(pkg-config --cflags --libs cofab)
"$work/consumer-pc"
echo "check_install: OK (find_package and pkg-config)"

#!/usr/bin/env bash
# Installs the Debian packages cofab needs to build, test and benchmark. Idempotent: when every
# package is present it only checks and returns (about a second). Not root: prints the command.
#   scripts/setup.sh            build + test dependencies
#   scripts/setup.sh --peers    also the benchmark peers (Gloo, Open MPI), plotting and clang
#   scripts/setup.sh --fuzz     also clang and its libFuzzer runtime (scripts/fuzz.sh)
set -euo pipefail

packages=(
  cmake g++ make pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  libdpdk-dev libisal-dev libibverbs-dev librdmacm-dev libnuma-dev iproute2
  libopenblas-dev libcpp-httplib-dev dataset-fashion-mnist zlib1g-dev
)
if [[ "${1:-}" == "--peers" ]]; then
  packages+=(libgloo-dev libopenmpi-dev openmpi-bin gnuplot-nox clang libclang-rt-14-dev)
elif [[ "${1:-}" == "--fuzz" ]]; then
  packages+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run as root:  apt-get update && DEBIAN_FRONTEND=noninteractive $cmd" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A stale package list makes installs fail with 404s: refresh it once per day at most.
if [[ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]]; then
  apt-get update -qq
fi
if ! $cmd -qq; then
  apt-get update -qq
  $cmd -qq
fi
echo "setup: done"

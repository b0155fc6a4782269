#!/usr/bin/env bash
# Installs what troupe needs from Debian 12 packages (only what is missing),
# then configures and builds. Idempotent; safe to run again.
#
#   scripts/setup.sh [--build-dir DIR] [--type Release|Debug|RelWithDebInfo]
#                    [--sanitize address|undefined|thread] [--no-build]
#
# Environment overrides: TROUPE_JOBS (parallel compile jobs, default 2),
# TROUPE_CUDA (AUTO/ON/OFF, default AUTO), TROUPE_EXTRA_PACKAGES.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$here/build"
build_type=Release
sanitize=""
do_build=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --type) build_type="$2"; shift 2 ;;
    --sanitize) sanitize="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    *) echo "setup.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build ccache pkg-config git file dpkg-dev
  libcaf-dev libucx-dev ucx-utils libcapnp-dev capnproto
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libopenblas-dev zlib1g-dev libssl-dev libxxhash-dev libisal-dev libcpp-httplib-dev iproute2
  dataset-fashion-mnist
  gnuplot-nox
  openmpi-bin
  prometheus
)
# shellcheck disable=SC2206
packages+=(${TROUPE_EXTRA_PACKAGES:-})

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing missing Debian packages: ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # The tests need only prometheus's promtool: its server is not started
  # (policy-rc.d says no to every service start during the install) nor
  # left enabled.
  policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d
    trap '$sudo rm -f "$policy"' EXIT INT TERM  # (never left behind)
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod +x "$policy"
  fi
  status=0
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
  if [[ -n "$policy" ]]; then $sudo rm -f "$policy"; trap - EXIT INT TERM; fi
  [[ $status -eq 0 ]] || exit "$status"
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
    $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi

[[ $do_build -eq 1 ]] || exit 0

jobs="${TROUPE_JOBS:-2}"
cmake_args=(-S "$here" -B "$build_dir" -G Ninja
  -DCMAKE_BUILD_TYPE="$build_type"
  -DTROUPE_CUDA="${TROUPE_CUDA:-AUTO}")
if [[ -n "$sanitize" ]]; then cmake_args+=(-DTROUPE_SANITIZE="$sanitize"); fi
if command -v ccache >/dev/null; then
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/troupe-ccache}"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
fi
echo "setup: configuring $build_dir ($build_type)"
mkdir -p "$build_dir"
cmake "${cmake_args[@]}" >"$build_dir/configure.log" 2>&1 || {
  cat "$build_dir/configure.log" >&2; exit 1; }
grep -E '^-- troupe:' "$build_dir/configure.log" || true
echo "setup: building with $jobs jobs"
cmake --build "$build_dir" -j "$jobs"

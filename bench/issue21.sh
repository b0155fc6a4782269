#!/usr/bin/env bash
# Every figure of issue 21 (speed to the ceilings on CPUs) measured again in one run on this
# machine, each beside its peer or ceiling, then a perf profile of each figure whose goal is
# missed. The lent many-core host's figures come from bench/device_cpu.sh instead.
#
#   bench/issue21.sh                     (from the repository root; OUT=DIR, default runs/issue21)
#   PROFILES=0 bench/issue21.sh          (the figures only)
#
# The peers (ucx_perftest, Gloo, Open MPI, PyTorch) and perf are bench dependencies, installed
# here only. Each step's output goes to $OUT/NAME.log (and .json where the step writes one); the
# profiles to $OUT/perf-NAME.txt: the 40 hottest symbols of every CPU while the command ran.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
out="$(realpath -m "${OUT:-$here/runs/issue21}")"
mkdir -p "$out"
TROUPE_EXTRA_PACKAGES="ucx-utils libgloo-dev libopenmpi-dev openmpi-bin python3-torch python3-numpy linux-perf" \
  scripts/setup.sh >"$out/setup.log" 2>&1 || { tail -20 "$out/setup.log"; exit 1; }
cmake -S . -B build -U "MPI_*" >/dev/null  # finds the peers' libraries now installed (a cache from before them forgets its misses)
cmake --build build -j "${TROUPE_JOBS:-2}" --target troupe troupe_ceilings troupe_gloo_allreduce \
  troupe_mpi_allreduce >/dev/null
bin=build/bin/troupe
step() { echo "== $(date +%T) $1"; }

step "version"
"$bin" version | tee "$out/version.log" | grep -E "troupe|BLAS core"

step "transport: actor to actor against ucx_perftest (bandwidth, round trip)"
"$bin" bench transport --json "$out/transport.json" 2>&1 | grep -v "^20" | tee "$out/transport.log"

step "all-reduce against Gloo and Open MPI"
"$bin" bench allreduce --trials 3 --json "$out/allreduce.json" 2>&1 | grep -v "^20" | tee "$out/allreduce.log"

step "parameter server push / pull against ucx_perftest"
"$bin" bench ps --json "$out/ps.json" 2>&1 | grep -v "^20" | tee "$out/ps.log"

step "the main job (W=2 S=2) against one process"
bench/ps_e2e.sh 1000000 2>&1 | tee "$out/ps_e2e.log"

step "troupe against PyTorch (Debian's 1.13), MLP MFU and DLRM roofline"
THREADS=2 MLP_EPOCHS=2 DLRM_ROWS=200000 OUT="$out/compare" bench/compare_pytorch.sh 2>&1 \
  | grep -v "^20" | tail -5 | tee "$out/compare.log"

step "dense kernels on every CPU: OpenBLAS's fallback core against troupe's choice"
bench/blas_core.sh 2>&1 | tee "$out/blas_core.log"

step "scaling with cores: the step's profile at 1 and 2 threads and Amdahl's prediction"
bench/step_profile.sh 2>&1 | tee "$out/step_profile.log"

[[ ${PROFILES:-1} == 1 ]] || exit 0
# perf: every CPU (-a; root, or perf_event_paranoid <= 0), call graphs off (the top symbols are
# what the RESULTS text reads), sampled at 999 Hz while COMMAND runs.
profile() {  # profile NAME COMMAND...
  local name=$1; shift
  step "perf: $name"
  perf record -q -a -F 999 -o "$out/perf-$name.data" -- "$@" >"$out/perf-$name.cmd.log" 2>&1 \
    || { echo "perf record failed: see $out/perf-$name.cmd.log"; return 0; }
  perf report -i "$out/perf-$name.data" --no-children --sort comm,dso,symbol --percent-limit 0.5 --stdio 2>/dev/null \
    | grep -v "^#" | grep -v "^$" | sed -E "s/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//" | head -40 >"$out/perf-$name.txt" || true
  rm -f "$out/perf-$name.data"
  head -15 "$out/perf-$name.txt"
}
profile round-trip "$bin" bench transport --no-perftest --seconds 0.3 --trials 1 --round-trips 200000
profile bandwidth-4k "$bin" bench transport --no-perftest --sizes 4096 --seconds 2 --trials 2 --round-trips 10
profile allreduce-4k "$bin" bench allreduce --no-peers --sizes 4096,4096,4096,4096,4096,4096 --trials 10
profile ps "$bin" bench ps --no-perftest --seconds 0.5
profile main-job "$bin" train --config configs/dlrm-synthetic.toml --set data.synthetic.rows=1000000 \
  --set cluster.workers=2 --set cluster.servers=2 --set run.dir="$out/runs" --log-level warn
profile dlrm-one-process "$bin" train --config configs/dlrm-synthetic.toml --set data.synthetic.rows=1000000 \
  --set run.dir="$out/runs" --log-level warn
step "done: $out"

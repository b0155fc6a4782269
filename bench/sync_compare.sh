#!/usr/bin/env bash
# Synchronous data parallelism against its peers, in one command:
#  1. `troupe bench allreduce` beside Gloo (libgloo-dev) and Open MPI
#     (openmpi-bin, libopenmpi-dev): 4 KiB / 1 MiB / 64 MiB, n = 2 and 4;
#  2. bench/sync_vs_ddp.sh: MLP training in train.mode=allreduce beside
#     PyTorch DistributedDataParallel (python3-torch, gloo backend), W = 2.
# The peers are bench dependencies, installed here only. Writes
# $OUT/allreduce.json and $OUT/sync_vs_ddp.json.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
out="${OUT:-$here/runs/sync-compare}"
mkdir -p "$out"
TROUPE_EXTRA_PACKAGES="libgloo-dev libopenmpi-dev openmpi-bin python3-torch python3-numpy" scripts/setup.sh
cmake -S . -B build -U "MPI_*" >/dev/null  # finds the peers' libraries now installed (a cache from before them forgets its misses)
cmake --build build -j "${TROUPE_JOBS:-2}" --target troupe troupe_gloo_allreduce troupe_mpi_allreduce >/dev/null
echo "== troupe bench allreduce (beside Gloo and Open MPI)"
build/bin/troupe bench allreduce --trials "${TRIALS:-3}" --json "$out/allreduce.json"
echo "== sync training beside PyTorch DDP"
OUT="$out" bench/sync_vs_ddp.sh

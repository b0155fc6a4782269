#!/usr/bin/env bash
# Checkpoint overhead: the README's main job (DLRM, 3M synthetic rows, W=2,
# S=2, BSP) for 3 epochs, without checkpoints and with one a minute
# (checkpoint.every_seconds=60), back to back. Prints samples/s of both, the
# ratio, and each checkpoint's pause and size. The mode (ps, allreduce:
# no shards, hybrid) is the job's train.mode.
# Usage: bench/checkpoint_overhead.sh [epochs] [seconds between checkpoints] [mode]
#        (from the repository root, after a build)
set -euo pipefail
epochs="${1:-3}"
every="${2:-60}"
mode="${3:-ps}"
servers=2
[ "$mode" = allreduce ] && servers=0
bin=build/bin/troupe
out=$(mktemp -d)
common=(--config configs/dlrm-synthetic.toml --set cluster.workers=2 --set cluster.servers="$servers"
        --set train.mode="$mode" --set train.epochs="$epochs" --set run.dir="$out/runs")
"$bin" train "${common[@]}" --set run.name=none --summary-json "$out/none.json" > "$out/none.log" 2>&1
"$bin" train "${common[@]}" --set run.name=ckpt --set checkpoint.every_seconds="$every" \
  --summary-json "$out/ckpt.json" > "$out/ckpt.log" 2>&1
python3 - "$out/none.json" "$out/ckpt.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"no checkpoints:        {a['samples_per_sec']:9.0f} samples/s  {a['train_seconds']:.1f} s training  AUC {a['test_auc']:.5f}")
print(f"one a minute:          {b['samples_per_sec']:9.0f} samples/s  {b['train_seconds']:.1f} s training  AUC {b['test_auc']:.5f}")
print(f"throughput with / without: {b['samples_per_sec'] / a['samples_per_sec']:.4f}")
for c in b["checkpoints"]:
    print(f"  checkpoint {c['id']}: step {c['step']}, {c['bytes'] / 1e6:.1f} MB, workers paused {c['paused_s']:.3f} s, "
          f"written in {c['written_s']:.2f} s")
PY
rm -rf "$out"

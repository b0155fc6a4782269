#!/usr/bin/env bash
# troupe's synchronous data parallelism against PyTorch DistributedDataParallel
# (Debian python3-torch, gloo backend): the MLP on Fashion-MNIST, W worker
# processes on loopback, the same per-worker batch, optimizer, learning rate
# and threads per worker, back to back in one run. Prints both samples/s
# and the ratio; writes $OUT/sync_vs_ddp.json.
#
#   bench/sync_vs_ddp.sh                        # W=2, 3 epochs, batch 128
#   WORKERS=4 EPOCHS=2 OUT=/tmp/ddp bench/sync_vs_ddp.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
workers="${WORKERS:-2}"
epochs="${EPOCHS:-3}"
batch="${BATCH:-128}"
cores="$(nproc)"
threads=$(( cores / workers > 0 ? cores / workers : 1 ))
out="${OUT:-$here/runs/sync-vs-ddp}"
mkdir -p "$out"
TROUPE_EXTRA_PACKAGES="python3-torch python3-numpy" scripts/setup.sh
py=/usr/bin/python3

echo "== troupe: train.mode=allreduce, $workers workers, $epochs epochs, batch $batch per worker"
build/bin/troupe train --config configs/mlp-fashion-mnist.toml --set cluster.workers="$workers" \
  --set train.mode=allreduce --set train.epochs="$epochs" --set train.batch_size="$batch" \
  --set train.lr_decay=1.0 --set cluster.worker_threads="$threads" --set run.dir="$out/runs" \
  --summary-json "$out/troupe.json" --log-level warn
echo "== PyTorch DDP (gloo): $workers workers, $epochs epochs, batch $batch per worker"
(cd bench/pytorch && "$py" mlp_ddp.py --workers "$workers" --epochs "$epochs" --batch "$batch" \
  --threads "$threads") | tee "$out/ddp.json"
"$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
t = json.load(open(f"{out}/troupe.json"))
d = json.loads(open(f"{out}/ddp.json").read().strip().splitlines()[-1])
ratio = t["samples_per_sec"] / d["samples_per_sec"]
res = {"workers": t.get("workers"), "troupe_samples_per_sec": t["samples_per_sec"],
       "ddp_samples_per_sec": d["samples_per_sec"], "ratio": ratio,
       "troupe_test_accuracy": t.get("test_accuracy"), "ddp_test_accuracy": d["test_accuracy"]}
json.dump(res, open(f"{out}/sync_vs_ddp.json", "w"), indent=1)
print(f"troupe {t['samples_per_sec']:.0f} samples/s (accuracy {t.get('test_accuracy')}), "
      f"DDP {d['samples_per_sec']:.0f} samples/s (accuracy {d['test_accuracy']:.4f}): ratio {ratio:.2f}x")
PY

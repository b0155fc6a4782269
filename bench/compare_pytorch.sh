#!/usr/bin/env bash
# troupe against PyTorch (Debian's python3-torch, CPU) on the same two models,
# the same data, batch size, optimizers and thread count, back to back in one
# run, with the machine's ceilings measured in the same run. Prints each one's
# samples/s and test quality, the ratio, the MLP's model FLOP utilisation and
# the DLRM's roofline efficiency; writes everything to $OUT/compare.json.
#
#   bench/compare_pytorch.sh                    # defaults below
#   THREADS=2 MLP_EPOCHS=3 DLRM_ROWS=500000 OUT=/tmp/cmp bench/compare_pytorch.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
threads="${THREADS:-2}"
mlp_epochs="${MLP_EPOCHS:-3}"
mlp_batch="${MLP_BATCH:-128}"
dlrm_rows="${DLRM_ROWS:-500000}"
dlrm_batch="${DLRM_BATCH:-256}"
out="${OUT:-$here/runs/compare-pytorch}"
mkdir -p "$out"

# The peer is a benchmark dependency, not a runtime one: installed here only.
TROUPE_EXTRA_PACKAGES="python3-torch python3-numpy" scripts/setup.sh
cmake --build build -j "${TROUPE_JOBS:-2}" --target troupe troupe_ceilings >/dev/null
py=/usr/bin/python3   # Debian's python, the one python3-torch installs into

echo "== ceilings ($threads threads)"
build/bench/troupe_ceilings --threads="$threads" | tee "$out/ceilings.json"

echo "== MLP 784-256-128-10 on Fashion-MNIST: $mlp_epochs epochs, batch $mlp_batch"
build/bin/troupe train --config configs/mlp-fashion-mnist.toml --threads "$threads" \
  --set train.epochs="$mlp_epochs" --set train.batch_size="$mlp_batch" --set train.eval_each_epoch=false \
  --set run.dir="$out/runs" --summary-json "$out/troupe_mlp.json" --log-level warn
"$py" bench/pytorch/mlp_fashion_mnist.py --epochs "$mlp_epochs" --batch "$mlp_batch" --threads "$threads" \
  | tee "$out/pytorch_mlp.json"

echo "== DLRM on synthetic Criteo: $dlrm_rows rows, batch $dlrm_batch"
dlrm_sets=(--set data.synthetic.rows="$dlrm_rows" --set train.batch_size="$dlrm_batch" --threads "$threads")
data_dir="$(build/bin/troupe gen-data criteo-synthetic --config configs/dlrm-synthetic.toml "${dlrm_sets[@]}" \
  --log-level warn | sed -n 's/.* rows, .* tables, in \(.*\)$/\1/p')"
build/bin/troupe train --config configs/dlrm-synthetic.toml "${dlrm_sets[@]}" --set run.dir="$out/runs" \
  --summary-json "$out/troupe_dlrm.json" --log-level warn
"$py" bench/pytorch/dlrm_synthetic.py --dir "$data_dir" --batch "$dlrm_batch" --threads "$threads" \
  | tee "$out/pytorch_dlrm.json"

# Ceilings again at the end: the machine is shared, so the report takes the
# better of the two measurements (the higher ceiling, the lower efficiency).
build/bench/troupe_ceilings --threads="$threads" | tee "$out/ceilings_end.json"

"$py" bench/pytorch/report.py "$out"

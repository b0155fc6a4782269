#!/usr/bin/env bash
# End-to-end PS overhead: the default DLRM on a 1M-row cut of the synthetic
# data, in one process against 1 worker + 1 shard process, in the same run;
# then W=2, S=2 in bsp, ssp (s=4) and asp. Prints samples/s and test AUC.
# Usage: bench/ps_e2e.sh [rows]   (from the repository root, after a build)
set -euo pipefail
rows="${1:-1000000}"
bin=build/bin/troupe
out=$(mktemp -d)
common=(--config configs/dlrm-synthetic.toml --set data.synthetic.rows="$rows" --set run.dir="$out/runs")
run() {
  local name=$1; shift
  "$bin" train "${common[@]}" "$@" --summary-json "$out/$name.json" > "$out/$name.log" 2>&1
  python3 - "$out/$name.json" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:>22}: {s['samples_per_sec']:9.0f} samples/s  test AUC {s['test_auc']:.5f}  (oracle {s['oracle_auc']:.5f})")
PY
}
run single-process
run "1 worker + 1 shard" --set cluster.workers=1 --set cluster.servers=1
run single-process-again
for mode in bsp ssp asp; do
  run "W=2 S=2 $mode" --set cluster.workers=2 --set cluster.servers=2 --set ps.consistency=$mode
done
rm -rf "$out"

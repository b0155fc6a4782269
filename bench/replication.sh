#!/usr/bin/env bash
# What replicated shards cost, and how fast a backup takes over: the README's
# main job (DLRM, 3M synthetic rows, W=2, S=2, BSP, ps mode) for one epoch
# with ps.replicas = 1 and = 2, alternating (`rounds` of each, so that the
# machine's drift hits both alike); then once with replicas and ps 0 killed
# (SIGKILL) `kill_at` seconds in: the seconds from the kill to the
# promotion, to training going on (the first progress report of a step
# taken after it), and the state transfer to the replacement.
# Usage: bench/replication.sh [rounds] [kill_at] [mode]
#        (from the repository root, after a build; mode: ps or hybrid)
set -euo pipefail
rounds="${1:-2}"
kill_at="${2:-20}"
mode="${3:-ps}"
bin=build/bin/troupe
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--config configs/dlrm-synthetic.toml --set cluster.workers=2 --set cluster.servers=2
        --set train.mode="$mode" --set collectives.backend=ring --set train.epochs=1 --set run.dir="$out/runs")
for i in $(seq 1 "$rounds"); do
  for r in 1 2; do
    "$bin" train "${common[@]}" --set ps.replicas="$r" --set run.name="r$r-$i" \
      --summary-json "$out/r$r-$i.json" > "$out/r$r-$i.log" 2>&1
  done
done
"$bin" train "${common[@]}" --set ps.replicas=2 --set run.name=kill --set train.progress_every=20 \
  --fault "kind=kill,target=ps:0,at_s=$kill_at" \
  --summary-json "$out/kill.json" > "$out/kill.log" 2>&1
python3 - "$out" "$rounds" "$kill_at" <<'PY'
import json, sys
out, rounds, kill_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
one = [json.load(open(f"{out}/r1-{i}.json")) for i in range(1, rounds + 1)]
two = [json.load(open(f"{out}/r2-{i}.json")) for i in range(1, rounds + 1)]
for i, (a, b) in enumerate(zip(one, two), 1):
    print(f"round {i}: 1 copy {a['samples_per_sec']:9.0f} samples/s  2 copies {b['samples_per_sec']:9.0f} samples/s"
          f"  ratio {b['samples_per_sec'] / a['samples_per_sec']:.3f}  AUC {a['test_auc']:.5f} / {b['test_auc']:.5f}")
m1 = sum(a["samples_per_sec"] for a in one) / rounds
m2 = sum(b["samples_per_sec"] for b in two) / rounds
print(f"mean: 2 copies / 1 copy = {m2 / m1:.3f}")
k = json.load(open(f"{out}/kill.json"))
faults = json.load(open(f"{out}/runs/kill/faults.json"))
hit = faults["injections"][0]
print(f"ps 0 killed at {hit['at_s']:.3f} s: found {hit['detect_s']:.3f} s later; rollbacks {len(k['rollbacks'])}; "
      f"ledger exact {k['ledger']['exact']}; AUC {k['test_auc']:.5f} (fault-free: {one[0]['test_auc']:.5f})")
for p in k["promotions"]:
    went_on = "-" if p["training_at_s"] is None else f"{p['training_at_s'] - hit['at_s']:.3f}"
    print(f"  shard {p['shard']}: promoted on ps {p['to_ps']} {p['at_s'] - hit['at_s']:.3f} s after the kill; "
          f"training went on {went_on} s after it")
for c in k["copies_built"]:
    print(f"  shard {c['shard']}: new backup on ps {c['backup_ps']} {c['at_s'] - hit['at_s']:.2f} s after the kill "
          f"(state moved in {c['transfer_s']:.2f} s)")
PY

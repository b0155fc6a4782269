#!/usr/bin/env bash
# Where a DLRM step's time goes at 1 and 2 threads (train.profile: the wall
# time inside every kernel call of training, in one process), and the
# scaling Amdahl's law predicts from it: a phase that takes T1 s at 1 thread
# and T2 at 2 has the parallel share p = 2 (1 - T2 / T1); the step's share P
# gives S(N) = 1 / ((1 - P) + P / N). Where no many-core host is lent, this
# stands in for measuring 4, 8 and 16 threads.
# Usage: bench/step_profile.sh   (ROWS=500000 REPEATS=2 MODEL=dlrm|mlp; from
# the repository root, after a build)
set -euo pipefail
bin=${TROUPE:-build/bin/troupe}
rows=${ROWS:-500000}
repeats=${REPEATS:-2}
model=${MODEL:-dlrm}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [[ $model == mlp ]]; then
  args=(--config configs/mlp-fashion-mnist.toml --set train.epochs=2)
else
  args=(--config configs/dlrm-synthetic.toml --set data.synthetic.rows="$rows")
fi
"$bin" version | grep "BLAS core"
for ((r = 0; r < repeats; ++r)); do
  for t in 1 2; do
    "$bin" train "${args[@]}" --threads "$t" --set train.profile=true --set run.dir="$out/runs" \
      --summary-json "$out/t$t-r$r.json" > "$out/log" 2>&1 || { cat "$out/log"; exit 1; }
  done
done
python3 - "$out" "$repeats" "$model" <<'PY'
import json, sys
out, repeats, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(t):
    phases, train, sps = {}, 0.0, 0.0
    for r in range(repeats):
        s = json.load(open(f"{out}/t{t}-r{r}.json"))
        train += s["train_seconds"] / repeats
        sps += s["samples_per_sec"] / repeats
        # Wall time (calls side by side counted once) where the summary has it.
        # The per-table pieces less the wall of the kernels they call (in one
        # process of the DLRM, whose tables share a shape, uniqueKeys and
        # dedupGradients run inside them), so that the rows about add up to
        # the training time. Approximate: the two kernels' walls may overlap
        # on 2 threads (the worker's pull pieces beside the table actor's
        # push pieces), and then too much is taken off.
        inside = s.get("kernel_wall_seconds")
        if inside is not None and s.get("side_by_side", {}).get("calls"):
            k = "per-table pieces less their kernels (approx.)"
            own = s["side_by_side"]["wall_seconds"] - sum(
                e["wall_seconds"] for e in s["kernel_profile"] if e["kernel"] in ("uniqueKeys", "dedupGradients"))
            phases[k] = phases.get(k, 0.0) + max(0.0, own) / repeats
        for e in s["kernel_profile"]:
            v = e.get("wall_seconds", e["seconds"])
            phases[e["kernel"]] = phases.get(e["kernel"], 0.0) + v / repeats
        if inside is None:
            inside = sum(e["seconds"] for e in s["kernel_profile"])
        phases["(not in a kernel)"] = phases.get("(not in a kernel)", 0.0) + max(0.0, s["train_seconds"] - inside) / repeats
    return phases, train, sps
p1, t1, s1 = load(1)
p2, t2, s2 = load(2)
print(f"{model}: mean of {repeats} runs each; training {t1:.2f} s at 1 thread ({s1:.0f} samples/s), "
      f"{t2:.2f} s at 2 ({s2:.0f} samples/s): {t1 / t2:.2f}x")
print("(wall seconds)")
print("| phase | 1 thread s | share | 2 threads s | speedup | parallel share p |")
print("|---|---:|---:|---:|---:|---:|")
def share(a, b):
    return max(0.0, min(1.0, 2 * (1 - b / a))) if a > 0 else 0.0
for k in sorted(p1, key=lambda k: -p1[k]):
    a, b = p1[k], p2.get(k, 0.0)
    print(f"| {k} | {a:.3f} | {100 * a / t1:.1f}% | {b:.3f} | {a / b if b else float('nan'):.2f}x | {share(a, b):.2f} |")
P = share(t1, t2)
print(f"\nstep: parallel share P = {P:.2f}; Amdahl's prediction against 1 thread: " +
      ", ".join(f"{n} threads {1 / ((1 - P) + P / n):.2f}x" for n in (2, 4, 8, 16)))
serial = sum(p1[k] * (1 - share(p1[k], p2.get(k, 0.0))) for k in p1)
print(f"serial seconds at 1 thread by phase, summed: {serial:.2f} of {t1:.2f} "
      f"(the largest: " + ", ".join(f"{k} {p1[k] * (1 - share(p1[k], p2.get(k, 0.0))):.2f}"
                                   for k in sorted(p1, key=lambda k: -p1[k] * (1 - share(p1[k], p2.get(k, 0.0))))[:3]) + ")")
PY

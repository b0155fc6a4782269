#!/usr/bin/env bash
# What OpenBLAS's core costs the dense layers: the MLP (Fashion-MNIST, 2
# epochs) and the DLRM (a 500K-row cut of the synthetic data, 1 epoch) in
# one process, run on each core in the same run:
#   Prescott  the SSE3 fallback Debian's OpenBLAS 0.3.21 picked on the lent
#             Sapphire Rapids host (forced here with OPENBLAS_CORETYPE);
#   Haswell   AVX2;
#   auto      as troupe starts: its own choice (kernels/cpu/blas_core.h),
#             the widest core the CPU runs.
# Each pair alternates REPEATS times; prints samples/s and the ratio to
# Prescott.
# Usage: bench/blas_core.sh   (from the repository root, after a build)
set -euo pipefail
bin=${TROUPE:-build/bin/troupe}
repeats=${REPEATS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" version | grep -E "OpenBLAS|BLAS core"
run() {  # model core -> "samples/s core" in $out/result
  local model=$1 core=$2 args=()
  if [[ $model == mlp ]]; then
    args=(--config configs/mlp-fashion-mnist.toml --set train.epochs=2)
  else
    args=(--config configs/dlrm-synthetic.toml --set data.synthetic.rows=500000)
  fi
  local envs=(env -u OPENBLAS_CORETYPE -u TROUPE_BLAS_CORE_CHOSEN_FROM -u TROUPE_BLAS_CORE)
  [[ $core != auto ]] && envs+=(OPENBLAS_CORETYPE="$core")
  "${envs[@]}" "$bin" train "${args[@]}" --set run.dir="$out/runs" --summary-json "$out/s.json" \
    > "$out/log" 2>&1 || { cat "$out/log" >&2; echo "bench/blas_core.sh: $model on $core failed" >&2; exit 1; }
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"{s['samples_per_sec']:.0f} {s['blas_core']}\")" \
    "$out/s.json" > "$out/result"
}
for model in mlp dlrm; do
  declare -A sum=()
  for ((r = 0; r < repeats; ++r)); do
    for core in Prescott Haswell auto; do
      run "$model" "$core"
      read -r sps name < "$out/result"
      echo "$model  run $r  $core -> OpenBLAS $name: $sps samples/s"
      sum[$core]=$(python3 -c "print(${sum[$core]:-0} + $sps)")
    done
  done
  python3 - "$model" "${sum[Prescott]}" "${sum[Haswell]}" "${sum[auto]}" "$repeats" <<'PY'
import sys
m, p, h, a, r = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5])
print(f"{m}: mean samples/s  Prescott {p/r:.0f}  Haswell {h/r:.0f} ({h/p:.2f}x)  auto {a/r:.0f} ({a/p:.2f}x)")
PY
  unset sum
done

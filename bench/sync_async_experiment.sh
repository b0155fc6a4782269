#!/usr/bin/env bash
# Sync against async on the DLRM, as one command (issue 17's experiment):
# BSP, SSP with bounds 1, 4 and 16, ASP, hybrid and allreduce, and the
# staleness-aware updates (ps.stale_lr = inverse, ps.delay_compensation)
# (the rate on ASP and SSP(16), the compensation on ASP); every setting without and with one worker slowed 2x
# (a slow fault on worker 1 from its step 20: each step sleeps as long as
# its work took before).
# Two `troupe experiment` runs, each evaluating every EVAL_STEPS steps of
# worker 0: $OUT/plain and $OUT/straggler (experiment.csv, report.md, PNGs).
#   ROWS (training rows, default 1000000), EVAL_STEPS (default 100),
#   REPEATS (1), WORKERS (2), SERVERS (2), TARGET (auc=0.767)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
out="${OUT:-$here/runs/sync-async}"
mkdir -p "$out"
[ -x build/bin/troupe ] || { scripts/setup.sh && cmake -S . -B build >/dev/null && \
  cmake --build build -j "${TROUPE_JOBS:-2}" --target troupe >/dev/null; }
common=(--config configs/dlrm-synthetic.toml
        --set "cluster.workers=${WORKERS:-2}" --set "cluster.servers=${SERVERS:-2}"
        --set "data.synthetic.rows=${ROWS:-1000000}" --set "data.synthetic.test_rows=20000"
        --set data.synthetic.tables=8 --set data.synthetic.max_vocab=20000
        --set train.batch_size=256 --set "train.eval_every_steps=${EVAL_STEPS:-100}"
        --set "data.cache_dir=$out/cache" --repeats "${REPEATS:-1}" --target "${TARGET:-auc=0.767}")
settings='train.mode|ps.consistency|ps.staleness|ps.stale_lr|ps.delay_compensation='
settings+='ps|bsp|4|none|0,ps|ssp|1|none|0,ps|ssp|4|none|0,ps|ssp|16|none|0,ps|asp|4|none|0,'
settings+='ps|asp|4|inverse|0,ps|asp|4|none|0.5,ps|ssp|16|inverse|0,hybrid|bsp|4|none|0,allreduce|bsp|4|none|0'
echo "== no straggler"
build/bin/troupe experiment "${common[@]}" --sweep "$settings" --out "$out/plain" || true
echo "== worker 1 slowed 2x"
build/bin/troupe experiment "${common[@]}" --sweep "$settings" --fault kind=slow,target=worker:1,factor=2,at_step=20 \
  --out "$out/straggler" || true
echo "reports: $out/plain/report.md $out/straggler/report.md"

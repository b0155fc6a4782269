#!/usr/bin/env bash
# What transport.integrity costs (issue 22): actor-to-actor bandwidth at
# 4 KiB and 1 MiB and the small-request round trip (`troupe bench
# transport`, two processes on loopback) under off, crc32c and hmac, in one
# run, each against off. Twice: over UCX shared memory (one host) and over
# TCP (transport.shared_memory=false, as between hosts). The modes take
# turns (off, crc32c, hmac, then again in reverse order), and each figure
# is the better of its two passes, so a slow moment of the machine does not
# land on one mode.
#
#   bench/integrity_cost.sh [--seconds S] [--trials N]
#
# Writes $OUT/integrity.json (default runs/integrity/; its own files there
# from an earlier run are removed first) and prints a table.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
troupe="${TROUPE:-$here/build/bin/troupe}"
out="${OUT:-$here/runs/integrity}"
seconds=1
trials=3
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --trials) trials=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "integrity_cost.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$troupe" ] || { echo "integrity_cost.sh: no $troupe (build first)" >&2; exit 2; }
mkdir -p "$out"
rm -f "$out"/true-*.json "$out"/false-*.json "$out/integrity.json"  # each figure from this run's passes only
export TROUPE_JOB_TOKEN="${TROUPE_JOB_TOKEN:-$("$troupe" token)}"
for shm in true false; do
  for mode in off crc32c hmac hmac crc32c off; do
    n=$(ls "$out" | grep -c "^$shm-$mode-" || true)
    echo "== shared_memory=$shm integrity=$mode (pass $((n + 1)))" >&2
    "$troupe" bench transport --no-perftest --sizes 4096,1048576 --seconds "$seconds" --trials "$trials" \
      --round-trips 20000 --set transport.integrity="$mode" --set transport.shared_memory="$shm" \
      --json "$out/$shm-$mode-$n.json" >&2
  done
done
python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
res = {}
for shm in ("true", "false"):
    for mode in ("off", "crc32c", "hmac"):
        runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{shm}-{mode}-*.json"))]
        bw = {}
        for r in runs:
            for row in r["rows"]:
                bw[row["bytes"]] = max(bw.get(row["bytes"], 0), row["troupe_mbps"])
        rtt = min(r["latency"]["troupe_roundtrip_us"] for r in runs)
        res.setdefault(shm, {})[mode] = {"mbps": bw, "roundtrip_us": rtt}
table = []
print(f"{'transport':14} {'integrity':9} {'4 KiB MiB/s':>12} {'vs off':>7} {'1 MiB MiB/s':>12} {'vs off':>7} {'RTT us':>8} {'vs off':>7}")
for shm, name in (("true", "shared memory"), ("false", "tcp")):
    off = res[shm]["off"]
    for mode in ("off", "crc32c", "hmac"):
        r = res[shm][mode]
        a, b = r["mbps"][4096], r["mbps"][1048576]
        ra, rb = a / off["mbps"][4096], b / off["mbps"][1048576]
        rr = r["roundtrip_us"] / off["roundtrip_us"]
        print(f"{name:14} {mode:9} {a:12.1f} {ra:7.2f} {b:12.1f} {rb:7.2f} {r['roundtrip_us']:8.1f} {rr:7.2f}")
        table.append({"transport": name, "integrity": mode, "mbps_4k": a, "mbps_1m": b, "roundtrip_us": r["roundtrip_us"],
                      "vs_off_4k": round(ra, 3), "vs_off_1m": round(rb, 3), "roundtrip_vs_off": round(rr, 3)})
json.dump({"rows": table}, open(os.path.join(out, "integrity.json"), "w"), indent=2)
EOF

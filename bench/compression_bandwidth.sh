#!/usr/bin/env bash
# Gradient compression where bandwidth is the limit (issue 15): a job across
# two network namespaces made here (ip netns + veth), the veth capped in
# both directions by a token bucket (tc qdisc tbf; netem is not in this
# machine's kernel), the transport over TCP only (UCX_TLS=tcp: UCX would
# reach the other namespace's processes by shared memory otherwise). Each job runs uncompressed and
# compressed at each rate, and uncompressed on loopback with shared memory
# as the baseline of "no slower where bandwidth is plenty".
#
#   mlp   allreduce, worker 0 in A (with the coordinator), worker 1 in B:
#         every all-reduce crosses the veth. compression.allreduce.
#   dlrm  ps (BSP), the coordinator and the shard in A, both workers in B:
#         every push and pull crosses it. compression.push and .pull
#         (fp16 with either codec). 200000 training rows, 20000 test rows
#         (the evaluation's pulls go whole: DLRM_ROWS, DLRM_TEST_ROWS).
#
# Needs root (network namespaces). Writes $OUT/bandwidth.jsonl, one line a
# run (wall seconds, the final metric, each path's wire bytes), and prints
# a table. RATES="1gbit 100mbit" JOBS="mlp dlrm" select what runs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
out="${OUT:-$here/runs/compression-bandwidth}"
mkdir -p "$out"
troupe="$here/build/bin/troupe"
[ "$(id -u)" = 0 ] || { echo "needs root (ip netns)" >&2; exit 2; }
rates="${RATES-1gbit 100mbit}"  # RATES="" runs the shared-memory jobs only
jobs="${JOBS:-mlp dlrm}"
tag=$$
A=trbwA$tag B=trbwB$tag VA=tbwa$tag VB=tbwb$tag
addrA=10.233.$((tag % 200 + 16)).1 addrB=10.233.$((tag % 200 + 16)).2
pids=()
runs=0
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$A"
ip netns add "$B"
ip link add "$VA" netns "$A" type veth peer name "$VB" netns "$B"
ip -n "$A" addr add "$addrA/24" dev "$VA"
ip -n "$B" addr add "$addrB/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up
for i in $(seq 1 300); do
  ip -n "$A" link show "$VA" | grep -q 'state UP' && ip -n "$B" link show "$VB" | grep -q 'state UP' && break
  sleep 0.02
done

cap() {  # cap RATE: both ends of the veth
  for end in "$A $VA" "$B $VB"; do
    set -- $end
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
    tc -n "$1" qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 200ms
  done
}

settings() {  # settings JOB CODEC
  local job=$1 codec=$2
  if [ "$job" = mlp ]; then
    echo --config configs/mlp-fashion-mnist.toml --set train.epochs="${MLP_EPOCHS:-2}" --set cluster.workers=2 \
      --set train.mode=allreduce --set compression.allreduce="$codec"
  else
    local pull=none
    [ "$codec" != none ] && pull=fp16
    echo --config configs/dlrm-synthetic.toml --set data.synthetic.rows="${DLRM_ROWS:-200000}" \
      --set data.synthetic.test_rows="${DLRM_TEST_ROWS:-20000}" \
      --set cluster.workers=2 --set cluster.servers=1 --set ps.consistency=bsp \
      --set compression.push="$codec" --set compression.pull="$pull"
  fi
}

record() {  # record JOB CODEC RATE WALL SUMMARY
  python3 - "$@" >>"$out/bandwidth.jsonl" <<'EOF'
import json, sys
job, codec, rate, wall, path = sys.argv[1:6]
s = json.load(open(path))
print(json.dumps({"job": job, "codec": codec, "rate": rate, "wall_s": float(wall),
                  "metric": s.get("test_auc") or s.get("test_accuracy"),
                  "wire": {w["path"]: w["wire_bytes"] for w in s.get("wire", [])}}))
EOF
}

netnsRun() {  # netnsRun JOB CODEC: the job across the namespaces
  runs=$((runs + 1))  # a port of its own: the last run's may still be in TIME_WAIT
  local job=$1 codec=$2 name="$1-$2-$RATE" port=$((21000 + (tag * 7 + runs) % 20000))
  local summary="$out/$name.json" args
  read -r -a args <<<"$(settings "$job" "$codec")"
  args+=(--set run.dir="$out/runs" --set run.name="$name" --summary-json "$summary")
  export TROUPE_JOB_TOKEN="bandwidth-bench-$tag-0123456789abcdef"
  # TCP only: UCX would otherwise reach a process of the other namespace by
  # shared memory (one host), past the capped veth.
  export UCX_TLS=tcp
  local start=$(date +%s.%N)
  ip netns exec "$A" "$troupe" launch --role coordinator --coordinator "$addrA:$port" "${args[@]}" \
    >"$out/$name.coordinator.log" 2>&1 &
  local coord=$!
  pids+=("$coord")
  if [ "$job" = mlp ]; then
    ip netns exec "$A" "$troupe" launch --role worker --coordinator "$addrA:$port" --listen "$addrA" \
      >"$out/$name.w0.log" 2>&1 &
    pids+=($!)
    sleep 0.5  # rank 0 in A
    ip netns exec "$B" "$troupe" launch --role worker --coordinator "$addrA:$port" --listen "$addrB" \
      >"$out/$name.w1.log" 2>&1 &
    pids+=($!)
  else
    ip netns exec "$A" "$troupe" launch --role ps --coordinator "$addrA:$port" --listen "$addrA" \
      >"$out/$name.ps.log" 2>&1 &
    pids+=($!)
    for w in 0 1; do
      ip netns exec "$B" "$troupe" launch --role worker --coordinator "$addrA:$port" --listen "$addrB" \
        >"$out/$name.w$w.log" 2>&1 &
      pids+=($!)
    done
  fi
  # Bounded: a run that has not ended in 30 minutes is killed (cleanup).
  local waited=0
  while kill -0 "$coord" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if [ $waited -gt 1800 ]; then echo "$name: no end in 30 minutes" >&2; exit 1; fi
  done
  wait "$coord" || { echo "$name failed:" >&2; tail -5 "$out/$name.coordinator.log" >&2; exit 1; }
  local wall=$(python3 -c "import sys; print(float(sys.argv[1]) - float(sys.argv[2]))" "$(date +%s.%N)" "$start")
  # The others end with the job; any still there after 60 s is killed.
  for i in $(seq 1 600); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  record "$job" "$codec" "$RATE" "$wall" "$summary"
  tail -n 1 "$out/bandwidth.jsonl"
}

localRun() {  # localRun JOB CODEC: one host, shared memory
  local job=$1 codec=$2 name="$1-$2-local"
  unset UCX_TLS
  local summary="$out/$name.json" args
  read -r -a args <<<"$(settings "$job" "$codec")"
  args+=(--set run.dir="$out/runs" --set run.name="$name" --summary-json "$summary")
  local start=$(date +%s.%N)
  timeout 1800 "$troupe" train "${args[@]}" >/dev/null 2>"$out/$name.log"
  record "$job" "$codec" local "$(python3 -c "import sys; print(float(sys.argv[1]) - float(sys.argv[2]))" "$(date +%s.%N)" "$start")" "$summary"
  tail -n 1 "$out/bandwidth.jsonl"
}

for job in $jobs; do
  codecs="none int8 topk"
  for codec in $codecs; do localRun "$job" "$codec"; done
  for RATE in $rates; do
    cap
    for codec in $codecs; do netnsRun "$job" "$codec"; done
  done
done
python3 - "$out/bandwidth.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = {}
for r in rows:
    last[(r["job"], r["rate"], r["codec"])] = r
print("| job | link | codec | wall s | x faster | metric | bytes on the wire |")
print("|---|---|---|---|---|---|---|")
for (job, rate, codec), r in sorted(last.items()):
    base = last.get((job, rate, "none"))
    speed = base["wall_s"] / r["wall_s"] if base else float("nan")
    wire = ", ".join("%s %.0f MB" % (k, v / 1e6) for k, v in r["wire"].items())
    print("| %s | %s | %s | %.1f | %.2f | %.4f | %s |" % (job, rate, codec, r["wall_s"], speed, r["metric"], wire))
EOF

#!/usr/bin/env bash
# Issue 21's figures on the `device` tool's many-core host (its CPU only), in one call:
#   1. the host, troupe's BLAS core (chosen at start), PyTorch's version;
#   2. troupe against PyTorch (the host's, 2.11) on the MLP and the DLRM at 2 and at 16 threads,
#      with the sgemm and memcpy ceilings of the same run (bench/pytorch/report.py reads each);
#   3. one process's scaling with threads (1, 2, 4, 8, 12, all), with train.profile on, and the
#      DLRM at batch 1024 on 2, 8 and all;
#   4. multi-process jobs on all the cores against one process in the same run, and the same
#      jobs with their cores split between workers and shards in other ways (cluster.worker_threads);
#   5. the transport and the parameter server against ucx_perftest;
#   (6. on request, PARTS=ab: the DLRM on this bundle against an earlier one, thread by thread.)
# (7. on request, PARTS=cores: on 4, 8 and all the cores, C compute threads against C - 1.)
# SCALING_THREADS and AB_THREADS name the thread counts below all the cores (all of them always
# run; defaults "1 2 4 8 12" and "1 2 4 8"); AB_REPEATS runs each A/B pair that many times, and
# AB_PROFILE (any non-empty value) runs them with train.profile on (the report then gives the dense
# layers' wall time).
# BUDGET (seconds, default 420: leave the call's timeout_s room for the last step) bounds the
# whole: a step that would start after it is skipped and says so, so the device call ends with
# everything that ran packed.
# Built here and carried (the host has none of our Debian packages):
#   TROUPE_DEVICE_CUDA=OFF TROUPE_DEVICE_MARCH=x86-64-v4 scripts/device_pack.sh troupe troupe_ceilings
#   mkdir -p .devdata/bin .devdata/lib && cp -r /usr/share/datasets/fashion-mnist .devdata/ &&
#   cp /usr/bin/ucx_perftest .devdata/bin/ &&
#   cp -L /lib/x86_64-linux-gnu/lib{gomp.so.1,numa.so.1} .devdata/lib/   (.devdata: add to .git/info/exclude)
# and run with the device tool:
#   run  command: "bash bench/device_cpu.sh"  carry: [".gpu", ".devdata"]  timeout_s: 540
# Everything lands in $OUT/device.tgz (packed on exit, so a timeout keeps what ran); read it here with bench/device_cpu_report.py DIR.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# The device tool returns only a few files from $OUT: everything is written to a folder of its own
# and packed into $OUT/device.tgz at the end. PARTS picks the parts (default all of them).
out=/tmp/troupe-device-cpu/device
rm -rf "$out"
parts=" ${PARTS:-compare scaling jobs bench} "
want() { [[ $parts == *" $1 "* ]]; }
pack() {  # (a new archive, then renamed: a kill while packing keeps the last one)
  local dest="${OUT:-/tmp/out}"
  mkdir -p "$dest" && tar -czf "$dest/.device.tgz.part" -C "$(dirname "$out")" device &&
    mv -f "$dest/.device.tgz.part" "$dest/device.tgz"
}
trap pack EXIT
trap 'echo "stopped by SIGTERM" >>"$out/steps.log"; exit 143' TERM
trap 'echo "stopped by SIGINT" >>"$out/steps.log"; exit 130' INT
budget=${BUDGET:-420}
mkdir -p "$out"/{scaling,jobs}
rows="${DLRM_ROWS:-400000}"
all=$(nproc)
# LOCAL_BUILD=build tries the script here, on the binaries of a build folder.
bin() {
  if [ -n "${LOCAL_BUILD:-}" ]; then local n=$1; shift; "$(find "$LOCAL_BUILD" -name "$n" -type f -perm -u+x | head -1)" "$@"
  else bash .gpu/run.sh "$@"; fi
}
troupe() { bin troupe "$@"; }
py=""  # the first python with torch: PyTorch is the peer
for c in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$c" -c 'import torch' 2>/dev/null; then py=$c; break; fi
done
[ -n "$py" ] || echo "FAILED: no python with torch" | tee -a "$out/steps.log"
step() { pack 2>/dev/null; echo "== $(date +%T) ${SECONDS}s $*" | tee -a "$out/steps.log"; }  # (packed as it goes: a kill keeps what ran)
runlog() {  # runlog NAME CMD...: the command's output to NAME.log, a failure noted and passed over
  local name=$1; shift
  if [ "$SECONDS" -ge "$budget" ]; then echo "SKIPPED (past the ${budget} s budget): $name" | tee -a "$out/steps.log"; return; fi
  "$@" >"$out/$name.log" 2>&1 || echo "FAILED ($?): $name" | tee -a "$out/steps.log"
}

step host
{ lscpu; echo; nproc; free -g; echo; troupe version; $py -c 'import torch; print("torch", torch.__version__, torch.__config__.parallel_info())'; } \
  >"$out/host.txt" 2>&1
grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|Flags" "$out/host.txt" | cut -c1-200
grep -E "BLAS|torch " "$out/host.txt"

mlp=(--config configs/mlp-fashion-mnist.toml --set data.train=.devdata/fashion-mnist --set train.epochs=2
     --set train.eval_each_epoch=false --set run.dir=/tmp/runs)
dlrm=(--config configs/dlrm-synthetic.toml --set data.synthetic.rows="$rows" --set run.dir=/tmp/runs)

step "gen-data $rows rows"
data_dir="$(troupe gen-data criteo-synthetic "${dlrm[@]}" --log-level warn | sed -n 's/.* rows, .* tables, in \(.*\)$/\1/p')"
echo "data: $data_dir"

want compare && for t in 2 "$all"; do
  d="$out/t$t"
  mkdir -p "$d"
  step "ceilings, $t threads"
  runlog "t$t/ceilings_run" eval "bin troupe_ceilings --threads=$t > $d/ceilings.json"
  step "MLP, $t threads: troupe"
  runlog "t$t/troupe_mlp" troupe train "${mlp[@]}" --log-level warn --threads "$t" --summary-json "$d/troupe_mlp.json"
  step "MLP, $t threads: pytorch"
  runlog "t$t/pytorch_mlp_run" sh -c "$py bench/pytorch/mlp_fashion_mnist.py --dir .devdata/fashion-mnist --epochs 2 --threads $t > $d/pytorch_mlp.json"
  step "DLRM, $t threads: troupe"
  runlog "t$t/troupe_dlrm" troupe train "${dlrm[@]}" --log-level warn --threads "$t" --summary-json "$d/troupe_dlrm.json"
  step "DLRM, $t threads: pytorch"
  runlog "t$t/pytorch_dlrm_run" sh -c "$py bench/pytorch/dlrm_synthetic.py --dir $data_dir --threads $t > $d/pytorch_dlrm.json"
  runlog "t$t/ceilings_end_run" eval "bin troupe_ceilings --threads=$t > $d/ceilings_end.json"
  $py bench/pytorch/report.py "$d" 2>&1 | tail -4 | tee -a "$out/steps.log"
done

threadCounts() {  # threadCounts N...: those below the cores, then all the cores, once each
  local t; for t in "$@"; do [ "$t" -lt "$all" ] && echo "$t"; done; echo "$all"
}
want scaling && for t in $(threadCounts ${SCALING_THREADS:-1 2 4 8 12}); do
  step "scaling, $t threads (profiled)"
  runlog "scaling/dlrm-t$t" troupe train "${dlrm[@]}" --threads "$t" --set train.profile=true \
    --summary-json "$out/scaling/dlrm-t$t.json"
  runlog "scaling/mlp-t$t" troupe train "${mlp[@]}" --threads "$t" --set train.profile=true \
    --summary-json "$out/scaling/mlp-t$t.json"
done
# Does a step with more work per call scale further? The DLRM at batch 1024 (its rate only: the
# quality of a 4x larger batch at the same learning rates is not the point).
want scaling && for t in $(threadCounts 2 8); do
  step "scaling, batch 1024, $t threads (profiled)"
  runlog "scaling/dlrm1024-t$t" troupe train "${dlrm[@]}" --set train.batch_size=1024 --threads "$t" \
    --set train.profile=true --summary-json "$out/scaling/dlrm1024-t$t.json"
done

# A/B (PARTS=ab, not in the default): the DLRM at each thread count on the bundle in .gpu and on
# an earlier one in .gpu-old (its run.sh edited to unpack into /tmp/troupe-gpu-old), alternating.
if want ab; then
  mkdir -p "$out/ab"
  for t in $(threadCounts ${AB_THREADS:-1 2 4 8}); do
    for r in $(seq 1 "${AB_REPEATS:-1}"); do
      for v in old new; do
        b=.gpu; [ "$v" = old ] && b=.gpu-old
        n=dlrm-$v-t$t; [ "$r" -gt 1 ] && n=$n-r$r
        step "A/B: $v, $t threads (round $r)"
        runlog "ab/$n" bash "$b/run.sh" troupe train "${dlrm[@]}" --threads "$t" --summary-json "$out/ab/$n.json" \
          ${AB_PROFILE:+--set train.profile=true}
      done
    done
  done
  step "A/B: new, $all threads, profiled"
  runlog ab/profile-new troupe train "${dlrm[@]}" --threads "$all" --set train.profile=true \
    --summary-json "$out/ab/profile-new.json"
fi

# PARTS=cores (not in the default): on C of the host's cores (taskset), one process with C compute
# threads against C - 1, alternating, CORE_ROUNDS rounds (default 3); C is 4, 8 and all of them.
# Does a core left to the loader and the actor threads help? (Measured 2026-11-28: no; RESULTS.md,
# "Dense layers in tiles, and whether a core left free helps".)
if want cores; then
  mkdir -p "$out/cores"
  command -v taskset >/dev/null || echo "FAILED: no taskset" | tee -a "$out/steps.log"
  tbin=(bash .gpu/run.sh troupe)
  [ -n "${LOCAL_BUILD:-}" ] && tbin=("$(find "$LOCAL_BUILD" -name troupe -type f -perm -u+x | head -1)")
  for c in $(threadCounts 4 8); do
    for r in $(seq 1 "${CORE_ROUNDS:-3}"); do
      for t in $((c - 1)) "$c"; do
        for m in dlrm mlp; do
          [ "$m" = mlp ] && [ "$c" -ne "$all" ] && continue  # (the MLP on all the cores only)
          step "cores: $m on $c cores, $t threads (round $r)"
          if [ "$m" = dlrm ]; then args=("${dlrm[@]}"); else args=("${mlp[@]}"); fi
          runlog "cores/$m-c$c-t$t-r$r" taskset -c "0-$((c - 1))" "${tbin[@]}" train "${args[@]}" \
            --threads "$t" --summary-json "$out/cores/$m-c$c-t$t-r$r.json"
        done
      done
    done
  done
fi

job() {  # job NAME SETTINGS...: the DLRM on all the cores (one-process: as run.threads = 0 runs it)
  step "job $1"
  local name=$1; shift
  runlog "jobs/$name" troupe train "${dlrm[@]}" --log-level info "$@" --summary-json "$out/jobs/$name.json"
}
declare -A splitDone=()
split() {  # split W S WORKER_THREADS: a ps job with each worker's compute threads named (0 and repeats skipped)
  [ "$3" -ge 1 ] && [ -z "${splitDone[$1-$2-$3]:-}" ] || return 0
  splitDone[$1-$2-$3]=1
  job "ps-W$1-S$2-wt$3" --set cluster.workers="$1" --set cluster.servers="$2" --set cluster.worker_threads="$3"
}
if want jobs; then
  # The default split gives each worker cores / workers threads and each shard one: more threads
  # than cores (W=4 S=4 on 16 cores: 4 x 4 + 4 = 20). The splits beside it: the workers' threads
  # cut so that workers and shards together fit the cores, and cut further.
  job one-process
  job ps-W2-S2 --set cluster.workers=2 --set cluster.servers=2
  split 2 2 $(( (all - 2) / 2 ))
  job ps-W4-S4 --set cluster.workers=4 --set cluster.servers=4
  split 4 4 $(( (all - 4) / 4 ))
  split 4 4 $(( all / 8 ))
  job ps-W8-S4 --set cluster.workers=8 --set cluster.servers=4
  split 8 4 $(( (all - 4) / 8 ))
  job allreduce-W4 --set cluster.workers=4 --set train.mode=allreduce
  job allreduce-W8 --set cluster.workers=8 --set train.mode=allreduce
  job one-process-8 --threads 8
  job one-process-all --threads "$all"
  job one-process-again
fi

# The transport and the parameter server against ucx_perftest (carried in .devdata/bin, with the
# two libraries it loads that the bundle lacks) on many cores: are the 2-core figures the cores?
export PATH="$root/.devdata/bin:$PATH"
export LD_LIBRARY_PATH="$root/.devdata/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
want bench && step "bench transport" && runlog bench-transport troupe bench transport --seconds 0.5 --trials 3 --json "$out/bench-transport.json"
want bench && step "bench ps" && runlog bench-ps troupe bench ps --seconds 0.5 --json "$out/bench-ps.json"
step done

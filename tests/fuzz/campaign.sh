#!/bin/bash
# A fuzzing campaign over every target in tests/fuzz: builds them with clang,
# libFuzzer and AddressSanitizer (build-fuzz/, TROUPE_FUZZ=ON), runs each for
# RUNS executions (default 10 million) from the checked-in corpus, and
# prints one line per target: executions, seconds, corpus size, crashes.
# With --merge it then folds what each run found that adds coverage into
# tests/fuzz/corpus/NAME (libFuzzer -merge=1), which the ordinary build
# replays as a test (fuzz_replay_NAME). Inputs that once crashed a target
# live in tests/fuzz/corpus/NAME/regressions/ and are never merged away.
#
#   tests/fuzz/campaign.sh [--runs N] [--merge] [--jobs J] [TARGET ...]
#
# A crash leaves its input in OUT (default runs/fuzz/NAME/) and makes the
# script exit 1. Needs clang (Debian: clang); nothing else beyond the build's
# own packages.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=10000000
merge=0
jobs=2
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(frame_fuzz message_fuzz handshake_fuzz config_fuzz manifest_fuzz fault_plan_fuzz)
command -v clang++ >/dev/null || { echo "campaign.sh: needs clang++ (apt-get install clang)" >&2; exit 2; }
build=${BUILD:-$root/build-fuzz}
out=${OUT:-$root/runs/fuzz}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_FUZZ=ON -DTROUPE_BUILD_TESTS=OFF -DTROUPE_BUILD_BENCH=OFF \
    -DTROUPE_CUDA=OFF >/dev/null
fi
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
status=0
printf '%-16s %12s %8s %8s %s\n' target executions seconds corpus result
for t in "${targets[@]}"; do
  work=$out/$t
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  find "$root/tests/fuzz/corpus/$t" -type f -exec cp {} "$work/corpus/" \;
  start=$(date +%s)
  set +e
  # (-rss_limit_mb: ASan's shadow memory counts; 4 GiB leaves room for it.)
  "$build/tests/fuzz/$t" -runs="$runs" -max_len=4096 -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1
  rc=$?
  set -e
  seconds=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$' || echo "?")
  size=$(ls "$work/corpus" | wc -l)
  if [ $rc -eq 0 ]; then result=ok; else result="FAILED (exit $rc; see $work/log and $work/artifacts)"; status=1; fi
  printf '%-16s %12s %8s %8s %s\n' "$t" "$execs" "$seconds" "$size" "$result"
  if [ $merge -eq 1 ] && [ $rc -eq 0 ]; then
    mkdir -p "$work/merged"
    "$build/tests/fuzz/$t" -merge=1 -max_len=4096 "$work/merged" "$root/tests/fuzz/corpus/$t" "$work/corpus" \
      >"$work/merge.log" 2>&1
    # (Files directly in the corpus directory are replaced by the merge; its
    # subdirectories, regressions/ among them, are kept as they are.)
    if [ -n "$(ls -A "$work/merged")" ]; then
      find "$root/tests/fuzz/corpus/$t" -maxdepth 1 -type f -delete
      cp "$work/merged/"* "$root/tests/fuzz/corpus/$t/"
    else
      echo "$t: the merge kept nothing (see $work/merge.log); the corpus is left as it was" >&2
    fi
  fi
done
exit $status

#!/bin/bash
# The whole test suite under load: RUNS times (default 5) `ctest -j2` in
# BUILD (default build/) while stress-ng keeps 2 CPU workers busy beside
# it, as on a shared machine. Prints one line per run (passed, failed,
# seconds) and the names of any test that failed; exits 1 if any run had a
# failure. stress-ng comes from Debian (installed here if missing; it is a
# bench tool, not a dependency of troupe).
#
#   bench/stress_suite.sh [--runs N] [--build DIR] [--cpu N]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=5
build=$root/build
cpu=2
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --cpu) cpu=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "stress_suite.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! command -v stress-ng >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get install -y -qq --no-install-recommends stress-ng >/dev/null
fi
out=${OUT:-$root/runs/stress}
mkdir -p "$out"
stress-ng --cpu "$cpu" --timeout 0 --quiet &
hog=$!
trap 'kill $hog 2>/dev/null; wait $hog 2>/dev/null || true' EXIT
sleep 1
kill -0 $hog || { echo "stress_suite.sh: stress-ng did not start" >&2; exit 2; }
echo "stress-ng --cpu $cpu (pid $hog) beside ctest -j2 in $build, $runs runs"
bad=0
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  set +e
  (cd "$build" && ctest -j2 --output-on-failure) >"$out/run-$i.log" 2>&1
  rc=$?
  set -e
  seconds=$(( $(date +%s) - start ))
  summary=$(grep -E '^[0-9]+% tests passed' "$out/run-$i.log" || echo "no summary")
  echo "run $i: $summary, $seconds s, exit $rc"
  if [ $rc -ne 0 ]; then
    bad=1
    grep -E '^\s+[0-9]+ - ' "$out/run-$i.log" || true
  fi
done
exit $bad

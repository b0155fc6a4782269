#!/usr/bin/env bash
# README command 2: install what is missing, build, and run the whole test
# suite. Exits non-zero on any failure. Extra arguments go to ctest,
# e.g.  scripts/test.sh -L unit   or   scripts/test.sh -R kernels
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
cd "$here"
exec ctest --test-dir "$here/build" --output-on-failure --timeout 600 -j "${TROUPE_TEST_JOBS:-2}" "$@"

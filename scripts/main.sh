#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job.
# Extra arguments go to the job, e.g.  scripts/main.sh --set data.synthetic.rows=200000
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
cd "$here"
exec "$here/build/bin/troupe" gen-data criteo-synthetic --config configs/dlrm-synthetic.toml "$@"

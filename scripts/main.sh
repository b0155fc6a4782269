#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job:
# train the DLRM of configs/dlrm-synthetic.toml (generating its synthetic data
# set into cache/data the first time) and print the test metrics next to the
# oracle's. Extra arguments go to `troupe train`, e.g.
#   scripts/main.sh --set data.synthetic.rows=200000
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
cd "$here"
exec "$here/build/bin/troupe" train --config configs/dlrm-synthetic.toml \
  --set cluster.workers=2 --set cluster.servers=2 "$@"

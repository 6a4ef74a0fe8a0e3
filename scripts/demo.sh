#!/usr/bin/env bash
# The main job on its built-in default, on a fresh Debian bookworm machine: install the
# dependencies, build, write the demo dataset on first use, and train the tiny model on it
# (configs/demo.yaml, CPU, a few minutes). Extra arguments go to `vlmtrain train`
# (e.g. --set train.max_steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
VLM_BUILD_TARGETS=vlmtrain bash scripts/build.sh
if [ ! -f data/demo/train.jsonl ]; then
  ./build/vlmtrain make-demo-data --out data/demo >/dev/null
  echo "demo: wrote data/demo (train.jsonl, val.jsonl, images/)"
fi
./build/vlmtrain train --config configs/demo.yaml "$@"

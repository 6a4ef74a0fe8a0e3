#!/usr/bin/env bash
# The main job on its built-in default, on a fresh Debian bookworm machine: dependencies,
# build, then the demo config. Extra arguments are passed to vlmtrain (e.g. --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/vlmtrain config --config configs/demo.yaml "$@"

#!/usr/bin/env bash
# Configures and builds vlmtrain (Release, Ninja) into build/. Extra arguments go to cmake's
# configure step, e.g. -DCMAKE_PREFIX_PATH=/path/to/libtorch for a CUDA LibTorch.
# VLM_BUILD_TARGETS="vlmtrain" builds only those targets (default: everything, tests included);
# VLM_BUILD_JOBS sets the parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${VLM_BUILD_JOBS:-$(nproc)}
read -r -a targets <<< "${VLM_BUILD_TARGETS:-all}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs" --target "${targets[@]}"

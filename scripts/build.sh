#!/usr/bin/env bash
# Configures and builds vlmtrain (Release, Ninja) into build/. Extra arguments go to cmake's
# configure step, e.g. -DCMAKE_PREFIX_PATH=/path/to/libtorch for a CUDA LibTorch.
# VLM_BUILD_TARGETS="vlmtrain" builds only those targets (default: everything, tests included);
# VLM_BUILD_JOBS sets the parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${VLM_BUILD_JOBS:-$(nproc)}
read -r -a targets <<< "${VLM_BUILD_TARGETS:-all}"
# The configure step's output (LibTorch's CMake files warn about what a C++ build never uses:
# kineto, CUDA architectures) goes to build/configure.log, shown in full when it fails.
mkdir -p build
if ! cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > build/configure.log 2>&1; then
  cat build/configure.log >&2
  echo "build: configuring failed (build/configure.log)" >&2
  exit 1
fi
grep -h '^-- vlmtrain: LibTorch' build/configure.log || true
cmake --build build -j "$jobs" --target "${targets[@]}"

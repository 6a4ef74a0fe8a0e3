#!/usr/bin/env bash
# The tests that hold on LibTorch 1.13 only, on Debian's 1.13.1, in build-1.13/: those named
# "... (LibTorch 1.13)" and tagged [libtorch1.13], whose expectations are 1.13's allocations
# (the memory model's byte-exact tests and the whole runs that check every step's prediction
# to the byte). A 2.x build leaves them out; they run here until the memory model replays 2.x
# (docs/development.md, "Two LibTorch versions"). Builds only what they need: the executable
# and the three suites that hold them.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${VLM_BUILD_JOBS:-$(nproc)}
cmake -S . -B build-1.13 -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLM_LIBTORCH=system \
  -DVLM_BUILD_BENCH=OFF >/dev/null
cmake --build build-1.13 -j "$jobs" --target vlmtrain test_cli test_train test_memory_accuracy
build-1.13/vlmtrain --version | sed -n 2p
cd build-1.13
ctest -j "$jobs" --output-on-failure --timeout 900 --no-tests=error -R ' \(LibTorch 1\.13\)$'

#!/usr/bin/env bash
# The whole test suite on a fresh Debian bookworm machine: dependencies (the Debian packages and
# the pinned LibTorch 2.x, scripts/install-deps.sh), the build against that LibTorch with its
# CUDA-only files, every test, then the tests that hold on LibTorch 1.13 only against Debian's
# 1.13 (scripts/test-libtorch-1.13.sh), the torch-free tests again under ASan + UBSan
# (scripts/test-sanitizers.sh), and every libFuzzer harness for 10 s on its seed corpus
# (scripts/fuzz.sh). This is the README's second command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
# The suite below is the pinned LibTorch's, CUDA compiled in: say so, and stop if it is not.
pinned=$(sed -n 's/^torch==\([0-9.]*\) .*/\1/p' third_party/libtorch.txt)
platform=$(build/vlmtrain --version | sed -n 2p)
echo "test: $platform"
case "$platform" in
  "LibTorch $pinned, CUDA "*" compiled in, "*) ;;
  *) echo "test: build/ is not built against the pinned LibTorch $pinned with CUDA" \
          "(third_party/libtorch.txt); configure it afresh: rm -rf build" >&2
     exit 1 ;;
esac
bash scripts/lint-scripts.sh
(cd build && ctest -j "$(nproc)" --output-on-failure --timeout 900)
bash scripts/test-libtorch-1.13.sh
bash scripts/test-sanitizers.sh
bash scripts/fuzz.sh 10

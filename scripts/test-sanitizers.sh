#!/usr/bin/env bash
# The torch-free layers (spec, core, data, memory, sampler, estimate, report) and their test suites built with
# AddressSanitizer + UndefinedBehaviorSanitizer (CMake option VLM_SANITIZE) into build-asan/,
# then those tests run: any memory error, leak or undefined behaviour fails them. LibTorch is
# not built with the sanitizers, so the torch layers stay out, and so do
# report/browser-and-tensorboard and data/hf-to-shards, which run the vlmtrain executable (a
# torch target not built here). Part of scripts/test.sh (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${VLM_BUILD_JOBS:-$(nproc)}
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVLM_SANITIZE=ON \
  -DVLM_BUILD_BENCH=OFF "$@" >/dev/null
cmake --build build-asan -j "$jobs" --target test_spec test_core test_repo test_data test_memory test_sampler test_estimate \
  test_report
cd build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest -j "$jobs" --output-on-failure --timeout 900 -R '^(spec|core|repo|data|memory|sampler|estimate|report)/' \
  -E '^(report/browser-and-tensorboard|data/hf-to-shards)$'

#!/usr/bin/env bash
# The whole test suite on a fresh Debian bookworm machine: dependencies, build, every test,
# then the torch-free tests again under ASan + UBSan (scripts/test-sanitizers.sh), then every
# libFuzzer harness for 10 s on its seed corpus (scripts/fuzz.sh). This is the README's second
# command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/lint-scripts.sh
(cd build && ctest -j "$(nproc)" --output-on-failure --timeout 900)
bash scripts/test-sanitizers.sh
bash scripts/fuzz.sh 10

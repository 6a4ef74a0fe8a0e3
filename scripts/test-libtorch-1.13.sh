#!/usr/bin/env bash
# The tests that hold on LibTorch 1.13 only, on Debian's 1.13.1, in build-1.13/: those named
# "... (LibTorch 1.13)" and tagged [libtorch1.13], whose expectations are 1.13's allocations
# (bf16 products, which the memory model replays on 1.13 only, and 1.13-only behaviour), and
# every memory_accuracy probe (the byte-exact tests, which follow the version they run on). A
# 2.x build leaves the tagged ones out (docs/development.md, "Two LibTorch versions"). Builds
# only what they need: the executable and the three suites that hold them.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${VLM_BUILD_JOBS:-$(nproc)}
cmake -S . -B build-1.13 -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLM_LIBTORCH=system \
  -DVLM_BUILD_BENCH=OFF >/dev/null
cmake --build build-1.13 -j "$jobs" --target vlmtrain test_cli test_train test_memory_accuracy
build-1.13/vlmtrain --version | sed -n 2p
# oneDNN no further than AVX-512 with bf16: the kernels the memory model replays
# (docs/memory.md, "oneDNN's scratchpads"). On a CPU with AMX (Sapphire Rapids and later)
# Debian's oneDNN 2.6.3 otherwise picks AMX and AMX-era brgemm kernels, fp32 convolutions
# included, whose scratchpads the model does not know, and under a hypervisor that does not
# grant the AMX tile state its first AMX instruction kills the process (SIGILL). On CPUs
# without AMX the cap changes nothing.
export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16
cd build-1.13
ctest -j "$jobs" --output-on-failure --timeout 900 --no-tests=error \
  -R ' \(LibTorch 1\.13\)$|^memory_accuracy/'

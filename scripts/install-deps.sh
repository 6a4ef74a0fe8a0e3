#!/usr/bin/env bash
# Installs the Debian (bookworm) packages vlmtrain needs to build and test; installs only what
# is missing, and does nothing when everything is there. Run as root (or with sudo available).
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config git ccache
  # LibTorch 1.13 (CPU) and what its c10d headers need; OpenBLAS so matmuls are not run on
  # the single-threaded reference BLAS
  libtorch-dev libgloo-dev libopenblas0-openmp
  # config, logging, JSON, CLI, tests
  libyaml-cpp-dev libspdlog-dev nlohmann-json3-dev libcli11-dev catch2
  # images and tokenizer
  libturbojpeg0-dev libpng-dev libstb-dev libpcre2-dev
  # lint of the job scripts (CI)
  shellcheck
  # fuzzing (scripts/fuzz.sh, CI): clang and its libFuzzer and sanitizer runtimes
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (missing: ${missing[*]})" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

#!/usr/bin/env bash
# Installs what vlmtrain needs to build and test: the Debian (bookworm) packages, then the
# pinned LibTorch 2.x of third_party/libtorch.txt into .deps/libtorch/ (the PyPI torch wheel,
# unpacked by pip --target: no Python environment is touched) and the tests' Python tools of
# third_party/python-tools.txt into .deps/python/ the same way. Installs only what is missing
# and does nothing when everything is there. Run as root (or with sudo available).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config git ccache
  # LibTorch 1.13 (CPU), for the memory model's byte-exact tests until they hold on 2.x
  # (docs/development.md); OpenBLAS so its matmuls are not run on the single-threaded
  # reference BLAS. Gloo's headers serve both LibTorch versions' c10d headers.
  libtorch-dev libgloo-dev libopenblas0-openmp
  # config, logging, JSON, CLI, tests
  libyaml-cpp-dev libspdlog-dev nlohmann-json3-dev libcli11-dev catch2
  # images and tokenizer; WebDataset tar shards (libarchive) and their WebP images (libwebp)
  libturbojpeg0-dev libpng-dev libstb-dev libpcre2-dev libarchive-dev libwebp-dev
  # TensorBoard event files: protobuf-lite and its compiler (lib/report)
  libprotobuf-dev protobuf-compiler
  # lint of the job scripts (CI); xz for the recorded GPU traces the tests replay (bench/gpu/)
  shellcheck xz-utils
  # the report's test opens it in a real headless browser (tests/report/browser_check.py)
  chromium
  # fuzzing (scripts/fuzz.sh, CI): clang and its libFuzzer and sanitizer runtimes
  clang libclang-rt-14-dev
)

# pip, which fetches the LibTorch wheel (below), where the system's Python lacks it.
python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

sudo=()
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (missing: ${missing[*]})" >&2; exit 1; }
  sudo=(sudo)
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: Debian packages done"
fi

bash scripts/install-libtorch.sh

# The tests' Python tools (third_party/python-tools.txt), once per change of that file.
tools=third_party/python-tools.txt
stamp=.deps/python/.installed-from
want=$(sha256sum "$tools" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install-deps: the tests' Python tools present in .deps/python"
else
  rm -rf .deps/python.partial
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --no-compile -r "$tools" --target .deps/python.partial
  echo "$want" > .deps/python.partial/.installed-from
  rm -rf .deps/python
  mv .deps/python.partial .deps/python
  echo "install-deps: the tests' Python tools installed in .deps/python"
fi

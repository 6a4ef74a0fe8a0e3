#!/usr/bin/env bash
# Installs the LibTorch pinned in third_party/libtorch.txt into .deps/libtorch/ (git-ignored):
# pip unpacks the wheels there with --target, checked against their hashes, for the wheel's
# own platform whatever this machine's Python is, and touches no Python environment. A stamp
# (the pin file's hash) makes a second run free; a changed pin installs anew. CMake finds the
# result by itself (third_party/dependencies.cmake). Called by scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=third_party/libtorch.txt
dest=.deps/libtorch
stamp="$dest/.installed-from"
want=$(sha256sum "$pins" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install-libtorch: $(grep -o '^torch==[^ ]*' "$pins") present in $dest"
  exit 0
fi

start=$(date +%s)
rm -rf "$dest.partial"
mkdir -p .deps
# The wheel's tags, not this machine's: the same files, and so the same hashes, everywhere.
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --no-compile \
  --only-binary=:all: --implementation cp --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  --require-hashes -r "$pins" --target "$dest.partial"
# What a C++ build does not use: the Python bindings' sources and the wheel's metadata.
rm -rf "$dest.partial"/torch/{_inductor,_dynamo,testing,onnx,distributed/_tools} \
       "$dest.partial"/*.dist-info
echo "$want" > "$dest.partial/.installed-from"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "install-libtorch: $(grep -o '^torch==[^ ]*' "$pins") installed in $dest" \
     "($(du -sh "$dest" | cut -f1), $(( $(date +%s) - start )) s)"

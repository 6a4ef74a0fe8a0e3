#!/usr/bin/env bash
# Records nanoVLM's reference for a parity case and compares vlmtrain with it (docs/parity.md).
#
#   scripts/parity/regenerate.sh --nanovlm PATH [--preset NAME] [--vision-layers N]
#                                [--language-layers N] [--out FILE]
#
# PATH: a checkout of github.com/huggingface/nanoVLM. Default case: the tiny preset, written to
# tests/parity/reference_tiny.json (the committed reference of the parity tests). Other presets
# need --out. Needs the built parity_check (build/tests/) and python3 with torch (Debian:
# python3-torch); PYTHON overrides the interpreter, BUILD_DIR the build folder.
set -euo pipefail
cd "$(dirname "$0")/../.."

nanovlm="" preset=tiny out="" custom=0 case_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nanovlm) nanovlm=$2; shift 2 ;;
    --preset) preset=$2; case_args+=(--preset "$2"); shift 2 ;;
    --vision-layers|--language-layers) custom=1; case_args+=("$1" "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "regenerate: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$nanovlm" ] || { echo "regenerate: --nanovlm PATH is required" >&2; exit 2; }
if [ -z "$out" ]; then
  if [ "$preset" != tiny ] || [ "$custom" = 1 ]; then
    echo "regenerate: give --out for a case other than the tiny preset" >&2
    exit 2
  fi
  out=tests/parity/reference_tiny.json
fi
check=${BUILD_DIR:-build}/tests/parity_check
[ -x "$check" ] || { echo "regenerate: build $check first (cmake --build build --target parity_check)" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$check" "${case_args[@]}" --write-case "$work/case.safetensors"
# nanoVLM prints a warning per attention module under torch < 2.0 (no SDPA): kept out of sight.
"${PYTHON:-python3}" scripts/parity/make_reference.py --nanovlm "$nanovlm" \
  --case "$work/case.safetensors" --out "$out" > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
grep -v 'scaled dot product attention not available' "$work/log" || true
for precision in fp32 bf16; do
  "$check" "${case_args[@]}" --precision "$precision" --reference "$out"
done

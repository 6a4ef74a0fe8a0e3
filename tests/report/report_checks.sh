#!/usr/bin/env bash
# The report and the TensorBoard file of a real run, checked by the tools people use: a short
# demo run with evaluations (configs/demo.yaml, 12 steps), its `vlmtrain report` opened in
# headless chromium (browser_check.py) and its event file read back with the `tensorboard`
# package (tensorboard_readback.py). CTest runs it as report/browser-and-tensorboard.
# Usage: report_checks.sh VLMTRAIN PYTHON_PACKAGES_DIR
set -euo pipefail
exe=$1
export PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}"
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$exe" make-demo-data --out "$work/data" --samples 96 --val-samples 8 --seed 11 >/dev/null
"$exe" train --config configs/demo.yaml --no-color \
  --set "data.train=[{path: $work/data/train.jsonl}]" \
  --set "data.validation=[{path: $work/data/val.jsonl}]" \
  --set train.max_steps=12 --set train.warmup_steps=2 --set train.eval_every=4 \
  --set train.threads=1 --set data.workers=1 --set output.checkpoint_every=0 \
  --set "output.dir=$work/run" >"$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
"$exe" report "$work/run"
python3 tests/report/tensorboard_readback.py "$work/run"
python3 tests/report/browser_check.py "$work/run/report.html"

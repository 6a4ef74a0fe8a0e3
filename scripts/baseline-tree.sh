#!/usr/bin/env bash
# The source tree of revision REV in .baseline/ (git-ignored), for gpu-check.sh --baseline: a
# lent GPU machine gets the working tree without git history, so the other revision travels as
# files (run's `carry: [".baseline"]`; a few MB).
#   scripts/baseline-tree.sh REV
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: scripts/baseline-tree.sh REV" >&2; exit 2; }
commit=$(git rev-parse --verify "$1^{commit}") || { echo "baseline-tree: no revision '$1'" >&2; exit 2; }
rm -rf .baseline
mkdir .baseline
git archive "$commit" | tar -x -C .baseline
echo "$commit" > .baseline/BASELINE_COMMIT
echo "baseline-tree: $commit in .baseline ($(du -sh .baseline | cut -f1))"

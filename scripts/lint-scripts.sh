#!/usr/bin/env bash
# Every shell script of the repository passes `bash -n` and shellcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t scripts < <(find scripts tests -type f \( -name '*.sh' -o -name '*.sbatch' \) | sort; echo .ci/run)
for s in "${scripts[@]}"; do
  bash -n "$s"
done
shellcheck -x "${scripts[@]}"
echo "lint-scripts: ${#scripts[@]} scripts pass bash -n and shellcheck"

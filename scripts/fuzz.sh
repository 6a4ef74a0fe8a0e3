#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/: clang, -fsanitize=fuzzer,address,undefined, -O1 with
# assertions on) into build-fuzz/ and runs each for SECONDS (default 600) on a scratch copy of
# its seed corpus (fuzz/corpus/<harness>/, so runs never grow the committed corpus), with its
# dictionary (fuzz/dict/<harness>.dict) when there is one: one process, one worker, one harness
# at a time. Prints executions per harness and every crash, timeout, out-of-memory or leak
# input; exits 1 when there is any. docs/development.md, "Fuzzing". Usage:
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]      # e.g. bash scripts/fuzz.sh 60 config image
# Environment: VLM_BUILD_JOBS (build parallelism), VLM_FUZZ_BUILD_DIR (default build-fuzz),
# VLM_FUZZ_RSS_MB (memory limit of a harness, default 2048), VLM_FUZZ_TIMEOUT (seconds one
# input may take, default 10), VLM_FUZZ_OUT (logs and finding inputs; default
# <build dir>/fuzz-runs/<UTC time>).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
case $seconds in
  '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac
jobs=${VLM_BUILD_JOBS:-$(nproc)}
build=${VLM_FUZZ_BUILD_DIR:-build-fuzz}
rss_mb=${VLM_FUZZ_RSS_MB:-2048}
timeout_s=${VLM_FUZZ_TIMEOUT:-10}
all=(config estimate_memory calibration_file memory_records report manifest shard length_stream
     tokenizer chat_template image safetensors checkpoint_state)
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=("${all[@]}")

for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz.sh: $tool not found (bash scripts/install-deps.sh installs it)" >&2
    exit 2
  fi
done
# -O1 with line tables: quicker to build than -O2 -g; no NDEBUG, so assertions (nlohmann::json's
# preconditions among them) stay on and a broken one is a finding too.
flags="-O1 -gline-tables-only"
cmake -S . -B "$build" -G Ninja -DVLM_FUZZ=ON -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_C_FLAGS_FUZZ="$flags" \
  -DCMAKE_CXX_FLAGS_FUZZ="$flags" >/dev/null
cmake --build "$build" -j "$jobs" --target fuzzers

out=${VLM_FUZZ_OUT:-$build/fuzz-runs/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

findings=0
printf '%-18s %12s %10s  %s\n' harness executions exec/s result
for h in "${harnesses[@]}"; do
  exe=$build/fuzz/fuzz_$h
  [ -x "$exe" ] || { echo "fuzz.sh: no harness '$h' (have: ${all[*]})" >&2; exit 2; }
  corpus=$scratch/$h
  mkdir -p "$corpus"
  cp fuzz/corpus/"$h"/* "$corpus"/
  args=(-max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout="$timeout_s"
        -print_final_stats=1 -artifact_prefix="$out/$h-")
  [ -f fuzz/dict/"$h".dict ] && args+=(-dict=fuzz/dict/"$h".dict)
  log=$out/$h.log
  rc=0
  # libFuzzer stops itself after -max_total_time; the outer limit only catches a harness that
  # does not.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    timeout -k 10 $((seconds + 4 * timeout_s + 60)) \
    "$exe" "${args[@]}" "$corpus" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  mapfile -t found < <(find "$out" -maxdepth 1 -name "$h-*" -type f | sort)
  if [ "$rc" -ne 0 ] || [ ${#found[@]} -gt 0 ]; then
    findings=$((findings + 1))
    printf '%-18s %12s %10s  FINDING (exit %s): %s\n' "$h" "${execs:-?}" "${speed:-?}" "$rc" \
      "${found[*]:-see $log}"
    grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|fuzz_.*:' \
      "$log" || true
  else
    printf '%-18s %12s %10s  ok\n' "$h" "$execs" "$speed"
  fi
done
echo "fuzz.sh: ${#harnesses[@]} harnesses, $seconds s each; logs in $out"
if [ "$findings" -gt 0 ]; then
  echo "fuzz.sh: $findings harnesses found a problem; reproduce: $build/fuzz/fuzz_<harness> FILE" >&2
  exit 1
fi

#!/usr/bin/env bash
# On a machine with a CUDA GPU, one command: build vlmtrain against the PyTorch (or LibTorch)
# found, run the test suite, then check the CUDA paths in turn and write a JSON report
# (docs/gpu.md): a bf16 training step of each preset; injected OOMs in forward, backward and the
# optimizer recovered with the same weights; a real OOM under a capped allocator recovered;
# activation checkpointing on and off equal; the fused AdamW equal to LibTorch's; a resume equal
# to a straight run; allocated and reserved peaks against the memory model; useful tokens/s and
# MFU of the 222M and 460M presets.
#
#   scripts/gpu-check.sh [--build-dir DIR] [--report FILE] [--work DIR] [--no-build]
#                        [--no-ctest] [--only CHECKS] [--presets LIST] [--nanovlm PATH]
#                        [--record DIR] [--record-runs NAMES] [--target TARGET]
#                        [--throughput-steps N] [--stream FILE] [--stream-steps N]
#                        [--baseline SRC] [--auto-steps N]
#
# --record DIR, the recording mode: the `record` check runs the recording matrix (tiny, 222M
# and 460M; fp32 and bf16; checkpointing, ViT and loss chunking, frozen towers, several batch
# shapes) with the allocator's trace of every step (output.memory_trace_steps) into
# DIR/memory-traces.tar, and the throughput check profiles its last steps into
# DIR/profiles.tar (docs/gpu.md, "Recording"); --record-runs names the matrix's runs to record
# (default: all). --only names checks in the order to run them.
# --target builds the named targets (comma-separated: vlmtrain,parity_check) instead of the
# whole tree.
#
# --nanovlm PATH (a nanoVLM checkout): the throughput check also times nanoVLM's own training
# step on the same tokens and crops (bench/nanovlm_throughput.py) and reports the ratio, and the
# stream check (end to end on a length stream, each tool with its own packing; --stream FILE,
# default ../shared/bench/stream-public-seed1234.jsonl) runs nanoVLM's packing and loop beside.
#
# The auto_batch check runs configs/nanovlm.yaml with `batch_size: auto` on the whole device for
# --auto-steps steps (default 50) and as an 80 GB H100 for 20, on the length stream's shapes:
# no OOM, how full the budget came, MFU.
#
# --baseline SRC (a source tree of another revision: scripts/baseline-tree.sh REV makes one)
# builds its vlmtrain beside this one ($build_dir-baseline) and the throughput check runs both
# on the same rows in the same call: a change's effect on one machine, apart from the variance
# between lent machines.
#
# LibTorch: CMAKE_PREFIX_PATH as given, else the one of python3's torch. Other dependencies:
# as for any build (scripts/install-deps.sh, or CMAKE_PREFIX_PATH); VLM_CMAKE_ARGS adds flags.
# Exit codes: 0 every check passed; 3 a check failed (the report says which and why); 4 the
# build or the test suite failed; 77 no CUDA GPU here (nothing was checked); 2 usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

build_dir=build-gpu report=gpu-check.json work=gpu-check-runs build=1 ctest=1 only="" presets=""
nanovlm="" record="" target="" throughput_steps="" record_runs="" stream="" stream_steps=""
baseline="" auto_steps=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-ctest) ctest=0; shift ;;
    --only) only=$2; shift 2 ;;
    --presets) presets=$2; shift 2 ;;
    --nanovlm) nanovlm=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --throughput-steps) throughput_steps=$2; shift 2 ;;
    --record-runs) record_runs=$2; shift 2 ;;
    --stream) stream=$2; shift 2 ;;
    --stream-steps) stream_steps=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --auto-steps) auto_steps=$2; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${gpus:-0}" -eq 0 ]; then
  echo "gpu-check: no CUDA GPU here (nvidia-smi lists none): nothing checked (exit 77)"
  exit 77
fi
mkdir -p "$work"
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
echo "gpu-check: $gpu"

# build SOURCE_DIR BUILD_DIR TARGETS LOG_NAME: configure and build, or explain and exit 4.
build_tree() {
  local prefix=${CMAKE_PREFIX_PATH:-}
  if [ -z "$prefix" ]; then
    prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
      echo "gpu-check: no CMAKE_PREFIX_PATH and no python3 torch to find LibTorch" >&2; exit 4; }
  fi
  # shellcheck disable=SC2086  # VLM_CMAKE_ARGS is a list of flags
  if ! cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_PREFIX_PATH="$prefix" ${VLM_CMAKE_ARGS:-} > "$work/configure$4.log" 2>&1 ||
     ! cmake --build "$2" -j "$(nproc)" ${3:+--target ${3//,/ }} > "$work/build$4.log" 2>&1; then
    echo "gpu-check: the build of $1 failed; see $work/configure$4.log and $work/build$4.log" >&2
    grep -E -A3 'error:|CMake Error' "$work/configure$4.log" "$work/build$4.log" | head -40 >&2
    exit 4
  fi
  echo "gpu-check: built $2/vlmtrain"
}
if [ "$build" = 1 ]; then
  build_tree . "$build_dir" "$target" ""
  [ -n "$baseline" ] && build_tree "$baseline" "$build_dir-baseline" vlmtrain "-baseline"
fi

ctest_json='null'
if [ "$ctest" = 1 ]; then
  # The suite is the CPU suite (its expectations are the CPU's: the tracking allocator, Gloo):
  # on this build it checks that LibTorch's CPU side and the compat layer hold on this version.
  started=$(date +%s)
  CUDA_VISIBLE_DEVICES='' ctest --test-dir "$build_dir" -j "$(nproc)" --timeout 900 \
      > "$work/ctest.log" 2>&1
  ctest_rc=$?
  failed=$(grep -E '^\s+[0-9]+ - ' "$work/ctest.log" | sed -E 's/^\s+[0-9]+ - //; s/ \(.*//' |
           python3 -c 'import json,sys; print(json.dumps([l.strip() for l in sys.stdin]))')
  summary=$(grep -E 'tests passed' "$work/ctest.log" | tail -1)
  ctest_json="{\"exit\": $ctest_rc, \"summary\": \"$summary\", \"failed\": $failed, \
\"seconds\": $(( $(date +%s) - started ))}"
  echo "gpu-check: ctest: $summary"
fi

torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
header="{\"gpu\": \"$gpu\", \"torch\": \"$torch_version\", \"ctest\": $ctest_json, \
\"vlmtrain\": \"$("$build_dir/vlmtrain" --version | head -1)\"}"
args=(--vlmtrain "$build_dir/vlmtrain" --work "$work" --report "$report" --header "$header")
[ -x "$build_dir/tests/parity_check" ] && args+=(--parity-check "$build_dir/tests/parity_check")
[ -n "$only" ] && args+=(--only "$only")
[ -n "$presets" ] && args+=(--presets "$presets")
[ -n "$nanovlm" ] && args+=(--nanovlm "$nanovlm")
[ -n "$record" ] && args+=(--artifacts "$record")
[ -n "$throughput_steps" ] && args+=(--throughput-steps "$throughput_steps")
[ -n "$record_runs" ] && args+=(--record-runs "$record_runs")
[ -n "$stream" ] && args+=(--stream "$stream")
[ -n "$stream_steps" ] && args+=(--stream-steps "$stream_steps")
[ -n "$auto_steps" ] && args+=(--auto-steps "$auto_steps")
[ -n "$baseline" ] && args+=(--baseline-vlmtrain "$build_dir-baseline/vlmtrain")
python3 scripts/gpu_check.py "${args[@]}"
rc=$?
if [ "$ctest" = 1 ] && [ "$ctest_rc" != 0 ] && [ "$rc" = 0 ]; then rc=4; fi
exit $rc

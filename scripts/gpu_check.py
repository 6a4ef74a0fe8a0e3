#!/usr/bin/env python3
"""The checks of scripts/gpu-check.sh, run on a machine with a CUDA GPU after the build.

Each check trains with the built `vlmtrain` on the demo dataset and records what it measured;
the report (JSON) holds every check's figures and whether it passed (docs/gpu.md). Python's
standard library only: weights are compared by reading the checkpoints' safetensors files.

  python3 scripts/gpu_check.py --vlmtrain build-gpu/vlmtrain --work DIR --report FILE
"""
import argparse
import json
import os
import subprocess
import sys
import time

# The checks live beside this file, one module per kind (scripts/gpucheck/).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpucheck.common import CheckFailed, Runner  # noqa: E402
from gpucheck.filling import check_auto_batch  # noqa: E402
from gpucheck.kernels import check_vit_kernels  # noqa: E402
from gpucheck.correctness import (  # noqa: E402
    check_attention, check_bf16_steps, check_checkpointing, check_fp16, check_fused_optimizer,
    check_injected_ooms, check_real_oom, check_resume)
from gpucheck.recording import check_record  # noqa: E402
from gpucheck.throughput import STREAM, check_stream, check_throughput  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vlmtrain", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--presets", default="tiny,nanovlm-222m,nanovlm-460m")
    p.add_argument("--throughput-steps", type=int, default=20)
    p.add_argument("--record-runs", default="", help="comma-separated names of the "
                   "recording matrix to run (default: all)")
    p.add_argument("--device", default="cuda", help="cpu: run the checks' logic on the CPU "
                   "(a smoke test of this script; the figures mean nothing)")
    p.add_argument("--artifacts", default="", help="recording mode: a folder for the memory "
                   "traces of the recording matrix and the throughput runs' profiles")
    p.add_argument("--only", default="", help="comma-separated check names")
    p.add_argument("--header", default="{}", help="JSON merged into the report (the build's)")
    p.add_argument("--parity-check", default="", help="the built tests/parity_check (the "
                   "attention check)")
    p.add_argument("--nanovlm", default="", help="a nanoVLM checkout: its training step's "
                   "tokens/s beside ours in the throughput and stream checks")
    p.add_argument("--baseline-vlmtrain", default="", help="another build's vlmtrain: the "
                   "throughput check runs it too, on the same rows")
    p.add_argument("--stream", default=STREAM, help="the length stream of the stream check")
    p.add_argument("--auto-steps", type=int, default=50, help="optimizer steps of the "
                   "auto_batch check on the whole device (16 packs each)")
    p.add_argument("--stream-steps", type=int, default=8, help="timed optimizer steps of the "
                   "stream check (16 rows each), after 2 untimed")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    data = os.path.join(a.work, "demo-data")
    if not os.path.exists(os.path.join(data, "train.jsonl")):
        subprocess.check_call([a.vlmtrain, "make-demo-data", "--out", data],
                              stdout=subprocess.DEVNULL)
    r = Runner(os.path.abspath(a.vlmtrain), os.path.abspath(a.work), os.path.abspath(data),
               a.device)
    presets = a.presets.split(",")
    big = [x for x in presets if x != "tiny"]
    if a.artifacts:
        os.makedirs(a.artifacts, exist_ok=True)
    checks = [
        ("record", lambda: check_record(r, a.artifacts, presets,
                                        list(filter(None, a.record_runs.split(","))))),
        ("bf16_step", lambda: check_bf16_steps(r, presets)),
        ("injected_oom", lambda: check_injected_ooms(r)),
        ("real_oom", lambda: check_real_oom(r)),
        ("checkpointing_equal", lambda: check_checkpointing(r)),
        ("fused_optimizer", lambda: check_fused_optimizer(r)),
        ("resume", lambda: check_resume(r)),
        ("attention", lambda: check_attention(r, a.parity_check)),
        ("throughput", lambda: check_throughput(r, big, a.throughput_steps, a.nanovlm,
                                                a.artifacts,
                                                baseline=a.baseline_vlmtrain)),
        # The same rows with the grouped attention of before (no nanoVLM, no profile): what
        # the varlen kernel changes, on the same machine.
        ("throughput_grouped", lambda: check_throughput(r, big, a.throughput_steps, "", "",
                                                        "grouped", ["model.attention=grouped"])),
        # More rows per step (2 x 4096 tokens): the GPU fuller, MFU with it.
        ("throughput_2rows", lambda: check_throughput(r, big, a.throughput_steps, "", "",
                                                      "2rows", [], rows=2)),
        ("fp16_step", lambda: check_fp16(r)),
        # batch_size: auto filling the device to its budget (no OOM), and the MFU it gives.
        ("auto_batch", lambda: check_auto_batch(r, a.stream, a.auto_steps,
                                                artifacts=a.artifacts)),
        # End to end on the public length stream, each tool with its own packing.
        ("stream", lambda: check_stream(r, a.stream_steps, a.nanovlm, a.stream)),
        # The ViT's kernels one by one (attention backends, LayerNorm and the residual by stream
        # dtype, the GELU epilogue, the GEMMs): issue 30's next kernel-level change.
        ("vit_kernels", lambda: check_vit_kernels(a.device, a.artifacts)),
    ]
    report = json.loads(a.header)
    report.update({"date": time.strftime("%Y-%m-%d"), "checks": {}})
    if not a.artifacts:  # the recording check needs somewhere to put what it records
        checks = [c for c in checks if c[0] != "record"]
    # --only runs the named checks in the order named (the most valuable first when the GPU's
    # time is short); unknown names are a usage error.
    wanted = list(filter(None, a.only.split(",")))
    unknown = [w for w in wanted if w not in dict(checks)]
    if unknown:
        print(f"gpu-check: unknown checks {unknown}; known: {[c[0] for c in checks]}",
              file=sys.stderr)
        return 2
    if wanted:
        checks = [(w, dict(checks)[w]) for w in wanted]
    failed = []
    for name, run in checks:
        print(f"check {name}", flush=True)
        started = time.time()
        try:
            result = {"passed": True, **run()}
        except CheckFailed as e:
            result = {"passed": False, "reason": str(e), **e.figures}
            failed.append(name)
        except Exception as e:  # a check's own failure must not lose the others' figures
            result = {"passed": False, "reason": f"{type(e).__name__}: {e}"}
            failed.append(name)
        result["seconds"] = round(time.time() - started, 1)
        report["checks"][name] = result
        print(f"  {'ok' if result['passed'] else 'FAILED: ' + result['reason']}", flush=True)
        with open(a.report, "w") as f:  # after every check, so a cut-off run keeps the rest
            json.dump(report, f, indent=2)
    report["passed"] = not failed
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
    print(f"gpu-check: {len(report['checks']) - len(failed)} of {len(report['checks'])} "
          f"checks passed; report {a.report}")
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`batch_size: auto` on a GPU: the memory-aware sampler fills the device to its budget with the
CUDA step replay's predictions (issue 26), without an OOM, and what MFU that gives (issue 30)."""
import os
import re
import shutil
import statistics

from gpucheck.common import (NANOVLM, CheckFailed, device_peak, nanovlm, prediction_errors,
                             summary_of)
from gpucheck.recording import add_to_tar, xz
from gpucheck.throughput import stream_dataset

# Decoding threads: an auto-filled 460M step decodes about 800 crops from PNG files.
AUTO_WORKERS = "data.workers=12"
# The H100 80GB HBM3's memory (81,559 MiB, bench/gpu/2026-11-28-h100/machine.txt): the budget
# of issue 30's MFU target, run as that device on a larger one (memory.simulate_device_bytes).
H100_BYTES = "81559MiB"


def _step_fields(s):
    keys = ("step", "micro_steps", "oom_retries", "tokens", "crops", "samples", "mfu",
            "time/step_ms", "time/data_wait_ms", "throughput/tokens_per_s",
            "memory/budget_bytes", "memory/peak_allocated_bytes", "memory/peak_reserved_bytes",
            "memory/device_overhead_bytes", "memory/predicted_peak_bytes",
            "memory/predicted_reserved_bytes", "memory/predicted_device_bytes")
    return {k: s.get(k) for k in keys}


def _ratio(values):
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)} \
        if values else None


def summarise(steps, fill_target=0.85):
    """What a run of `batch_size: auto` shows beside the usual summary (medians, peaks): OOMs,
    how full each step's peaks came to the budget (allocated, and the device figure the budget
    bounds: device_peak), the predictions' errors as ranges, and every step's figures."""
    fills, allocated, predicted = [], [], []
    for s in steps:
        budget = s.get("memory/budget_bytes")
        if not budget:
            continue
        for into, value in ((fills, device_peak(s)),
                            (allocated, s.get("memory/peak_allocated_bytes")),
                            (predicted, s.get("memory/predicted_device_bytes"))):
            if value:
                into.append(value / budget)
    fill = _ratio(fills)
    out = summary_of(steps)
    out.update({
        "oom_retries": sum(s.get("oom_retries") or 0 for s in steps),
        "micro_steps": sorted({s["micro_steps"] for s in steps if s.get("micro_steps")}),
        "budget_bytes": steps[-1].get("memory/budget_bytes"),
        "device_fill": fill,
        "allocated_fill": _ratio(allocated),
        "predicted_device_fill": _ratio(predicted),
        "fill_target": fill_target,
        "fill_target_met": bool(fill and fill["mean"] >= fill_target),
        "prediction_error": {k: _ratio(v) for k, v in prediction_errors(steps).items()},
        "per_step": [_step_fields(s) for s in steps],
    })
    return out


def _said_at_start(log_path):
    """The log's lines on the budget and the preflight (what a user reads at start)."""
    wanted = re.compile(r"memory budget|preflight|model states|micro-batch|replay|modelled")
    with open(log_path, errors="replace") as f:
        return [line.rstrip() for line in f if wanted.search(line)][:12]


def check_auto_batch(r, stream, steps=50, h100_steps=20, artifacts="", samples=3000):
    """configs/nanovlm.yaml with `batch_size: auto` (16 packs a step, as nanoVLM's 2 x 8) on
    the whole device for `steps` steps, then as an 80 GB H100 for `h100_steps` (its first 2
    steps' allocator trace kept with `artifacts`), on the public stream's shapes as a real
    dataset: passes when the preflight accepts the preset and no step meets an OOM; reports how
    full the budget came (issue 26's target: a mean of 85% or more) and MFU (issue 30's: 40%
    or more on the H100's budget). On the CPU (--device cpu, a smoke test of this script) the
    tiny preset in fp32 under a simulated 1 GiB device."""
    data, made = stream_dataset(r, stream, samples)
    if r.device == "cuda":
        model = nanovlm("nanovlm-460m") + ["train.precision=bf16"]
        runs = [("whole-device", [], steps), ("h100-80gb", [
            f"memory.simulate_device_bytes={H100_BYTES}"], h100_steps)]
    else:
        model = NANOVLM + ["model.preset=tiny", "data.max_img_size=256", "train.precision=fp32"]
        runs = [("cpu-1gib", ["memory.simulate_device_bytes=1GiB"], min(steps, 4))]
    out = {"dataset": made}
    for label, extra, n in runs:
        if n <= 0:
            continue
        trace = label == "h100-80gb" and artifacts
        overrides = model + [
            f"data.train=[{{path: {data}/train.jsonl}}]", "train.batch_size=auto",
            "train.global_batch_size=16", AUTO_WORKERS, f"train.max_steps={n}",
            *(["output.memory_trace_steps=2"] if trace else []), *extra]
        code, run, recs = r.train(f"auto-{label}", "configs/nanovlm.yaml", overrides,
                                  expect_ok=False)
        entry = {"exit": code, "overrides": overrides, "said": _said_at_start(run + ".log"),
                 **(summarise(recs) if recs else {"steps": 0})}
        out[label] = entry
        if trace:
            for name in ("memory-trace.rank0.txt", "metrics.jsonl", "config.yaml"):
                path = os.path.join(run, name)
                if os.path.exists(path):
                    add_to_tar(os.path.join(artifacts, "memory-traces.tar"),
                               f"460m-bf16-auto-h100/{name}.xz", xz(path))
        shutil.rmtree(os.path.join(run, "checkpoints"), ignore_errors=True)
    failed = [f"{label}: exit {e['exit']}" for label, e in out.items()
              if label != "dataset" and e["exit"] != 0]
    failed += [f"{label}: {e['oom_retries']} OOM retries" for label, e in out.items()
               if label != "dataset" and e.get("oom_retries")]
    if failed:
        raise CheckFailed("; ".join(failed), out)
    return out

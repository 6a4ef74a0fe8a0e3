"""Speed: vlmtrain's throughput on the same rows beside nanoVLM's, with profiles, and end to
end on a length stream with each tool's own packing."""
import json
import os
import shutil
import statistics
import subprocess
import sys

from gpucheck.common import CheckFailed, NANOVLM, ROOT, nanovlm, summary_of
from gpucheck.recording import add_to_tar, xz


# Decoding threads for the throughput runs: nanoVLM's step is given its rows as tensors, so
# ours must not wait for its decoder either. With the default 2, a 460M row of 60 crops from
# 2048-px images waited for data on the H100 of 2026-11-28 (272 of 464 ms at step 10).
THROUGHPUT_WORKERS = "data.workers=8"


def check_throughput(r, presets, steps, nanovlm_path, artifacts="", variant="", extra=(),
                     rows=1, baseline=""):
    """Useful tokens/s and MFU of `rows` 4096-token rows per step, bf16; with artifacts the
    last 3 steps are profiled, with nanovlm_path nanoVLM's own step runs on the same tokens and
    crops, with `baseline` (another build's vlmtrain) that build on the same rows, unprofiled.
    `variant` names runs with `extra` overrides (the grouped attention, say)."""
    out = {}
    for preset in presets:
        # The last 3 steps are profiled (output.profile_steps); the throughput figures are the
        # steps before them (the profiler slows the host).
        profiled = 3 if artifacts else 0
        label = f"{preset}{'-' + variant if variant else ''}"
        _, run, recs = r.train(f"throughput-{label}", "configs/nanovlm.yaml",
                               nanovlm(preset) + [f"train.batch_size={rows}",
                                                  "train.precision=bf16", THROUGHPUT_WORKERS,
                                                  f"train.max_steps={steps + profiled}",
                                                  f"output.profile_steps={profiled}",
                                                  f"output.profile_warmup_steps={steps}",
                                                  *extra])
        ours = summary_of(recs[:steps], skip=3)
        out[preset] = ours
        summary_file = os.path.join(run, "profile-summary.rank0.json")
        if profiled and os.path.exists(summary_file):
            with open(summary_file) as f:
                ours["profile"] = json.load(f)
            add_to_tar(os.path.join(artifacts, "profiles.tar"), f"{label}/profile.rank0.json.xz",
                       xz(os.path.join(run, "profile.rank0.json")))
        shutil.rmtree(os.path.join(run, "checkpoints"), ignore_errors=True)
        if baseline:
            _, base_run, base = r.train(f"throughput-{label}-baseline", "configs/nanovlm.yaml",
                                        nanovlm(preset) + [f"train.batch_size={rows}",
                                                           "train.precision=bf16",
                                                           THROUGHPUT_WORKERS,
                                                           f"train.max_steps={steps}", *extra],
                                        vlmtrain=baseline)
            ours["baseline"] = summary_of(base, skip=3)
            ours["useful_tokens_per_s_vs_baseline"] = (
                ours["useful_tokens_per_s"] / ours["baseline"]["useful_tokens_per_s"])
            shutil.rmtree(os.path.join(base_run, "checkpoints"), ignore_errors=True)
        if not nanovlm_path:
            continue
        # nanoVLM's own training step on a row of the same tokens and crops (the median step's).
        # Its failure is reported beside our figures rather than losing them.
        report = os.path.join(r.work, f"nanovlm-{preset}.json")
        run = subprocess.run([sys.executable,
                              os.path.join(ROOT, "bench", "nanovlm_throughput.py"),
                              "--nanovlm", nanovlm_path, "--preset", preset,
                              "--tokens", str(int(ours["tokens_per_step"])),
                              "--crops", str(int(ours["crops_per_step"])),
                              "--steps", str(steps), "--json", report],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            ours["nanovlm_error"] = run.stderr.strip().splitlines()[-5:]
            continue
        with open(report) as f:
            theirs = json.load(f)
        ours["nanovlm"] = theirs
        ours["useful_tokens_per_s_vs_nanovlm"] = (ours["useful_tokens_per_s"] /
                                                  theirs["useful_tokens_per_s"])
    return out


STREAM = os.path.join(ROOT, "..", "shared", "bench", "stream-public-seed1234.jsonl")


def stream_dataset(r, stream, samples=3000):
    """The stream's first `samples` samples as a real dataset under the work folder
    (bench/stream_dataset.py: PNG files and a manifest), written once per call; returns its
    folder and what the writer said of it."""
    if not os.path.exists(stream):
        raise CheckFailed(f"no length stream at {stream}")
    data = os.path.join(r.work, f"stream-data-{samples}")
    said = os.path.join(data, "made.json")
    if os.path.exists(said):
        with open(said) as f:
            return data, json.load(f)
    made = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "stream_dataset.py"),
                           stream, "--out", data, "--samples", str(samples)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise CheckFailed(f"stream_dataset.py: {made.stderr.strip()[-500:]}")
    with open(said, "w") as f:
        f.write(made.stdout)
    return data, json.loads(made.stdout)


def check_stream(r, steps, nanovlm_path, stream, samples=3000, warmup=2):
    """End to end on a length stream, each tool with its own packing (issue 30): the stream's
    first `samples` samples as a real dataset (bench/stream_dataset.py: PNG files and a
    manifest), trained by vlmtrain with configs/nanovlm.yaml as it stands (460M, 2 rows per
    micro-batch, 8 micro-batches per step, bf16; 8 decoding threads: its images are decoded and
    resized from PNG files, at about 100 ms an image a core, where nanoVLM's are given), and
    with nanoVLM's packer, collator and train.py loop on the same samples' shapes
    (bench/nanovlm_throughput.py --stream). Useful tokens (supervised + image slots) per second
    over `steps` optimizer steps after `warmup`. On the CPU (--device cpu, a smoke test of this
    script, figures meaningless) the tiny preset with 64-px crops on the same grids, one row per
    step."""
    if r.device == "cuda":
        preset, rows, accumulation, per_crop = "nanovlm-460m", 2, 8, 64
        model = nanovlm(preset)
    else:
        preset, rows, accumulation, per_crop = "tiny", 1, 1, 16
        model = NANOVLM + ["model.preset=tiny", "data.max_img_size=256"]
    data, made = stream_dataset(r, stream, samples)
    out = {"dataset": made}
    overrides = model + [
        f"data.train=[{{path: {data}/train.jsonl}}]", f"train.batch_size={rows}",
        f"train.gradient_accumulation_steps={accumulation}", "train.precision=bf16",
        THROUGHPUT_WORKERS,
        f"train.max_steps={warmup + steps}"]
    _, run, recs = r.train(f"stream-{preset}", "configs/nanovlm.yaml", overrides)
    timed = recs[warmup:warmup + steps]
    if len(timed) < steps:
        raise CheckFailed(f"vlmtrain recorded {len(recs)} steps, wanted {warmup + steps}")
    seconds = sum(s["time/step_ms"] for s in timed) / 1000
    useful = sum(s["supervised_tokens"] + per_crop * s["crops"] for s in timed)
    ours = {
        "steps": steps, "warmup_steps": warmup, "seconds": seconds,
        "step_ms": 1000 * seconds / steps, "useful_tokens": useful,
        "supervised_tokens": sum(s["supervised_tokens"] for s in timed),
        "image_tokens": per_crop * sum(s["crops"] for s in timed),
        "tokens": sum(s["tokens"] for s in timed),
        "padding_tokens": sum(s.get("padding_tokens", 0) for s in timed),
        "samples": sum(s["samples"] for s in timed),
        "rows": rows * sum(s["micro_steps"] for s in timed),
        "useful_tokens_per_s": useful / seconds,
        "tokens_per_s": sum(s["tokens"] for s in timed) / seconds,
        "data_wait_ms": sum(s.get("time/data_wait_ms", 0) for s in timed),
        "mfu": statistics.median(s["mfu"] for s in timed if s.get("mfu") is not None)
        if any(s.get("mfu") is not None for s in timed) else None,
        "peak_allocated_bytes": max(s.get("memory/peak_allocated_bytes") or 0 for s in timed),
        "peak_reserved_bytes": max(s.get("memory/peak_reserved_bytes") or 0 for s in timed),
    }
    ours["crops_per_row"] = sum(s["crops"] for s in timed) / max(ours["rows"], 1)
    ours["padding_pct"] = 100 * ours["padding_tokens"] / max(ours["padding_tokens"] +
                                                            ours["tokens"], 1)
    out["vlmtrain"] = ours
    shutil.rmtree(os.path.join(run, "checkpoints"), ignore_errors=True)
    if not nanovlm_path:
        return out
    report = os.path.join(r.work, "nanovlm-stream.json")
    theirs = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "nanovlm_throughput.py"),
                             "--nanovlm", nanovlm_path, "--preset", preset,
                             "--stream", os.path.join(data, "lengths.jsonl"), "--rows", str(rows),
                             "--accumulation", str(accumulation), "--steps", str(steps),
                             "--device", r.device,
                             "--warmup", str(warmup), "--json", report],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if theirs.returncode != 0:
        out["nanovlm_error"] = theirs.stderr.strip().splitlines()[-5:]
        return out
    with open(report) as f:
        out["nanovlm"] = json.load(f)
    out["useful_tokens_per_s_vs_nanovlm"] = (ours["useful_tokens_per_s"] /
                                             out["nanovlm"]["useful_tokens_per_s"])
    return out

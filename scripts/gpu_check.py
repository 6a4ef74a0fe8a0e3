#!/usr/bin/env python3
"""The checks of scripts/gpu-check.sh, run on a machine with a CUDA GPU after the build.

Each check trains with the built `vlmtrain` on the demo dataset and records what it measured;
the report (JSON) holds every check's figures and whether it passed (docs/gpu.md). Python's
standard library only: weights are compared by reading the checkpoints' safetensors files.

  python3 scripts/gpu_check.py --vlmtrain build-gpu/vlmtrain --work DIR --report FILE
"""
import argparse
import array
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small, fast runs of the tiny model (the demo config with shorter rows).
TINY = [
    "model.preset=tiny", "data.max_img_size=128", "packing.max_seq_len=512",
    "data.max_sample_length=512", "packing.max_images_per_knapsack=8", "train.batch_size=4",
    "train.gradient_accumulation_steps=1", "train.warmup_steps=2", "train.seed=3",
    "train.eval_every=0", "data.validation=[]", "output.checkpoint_every=1000",
]
# nanoVLM's configuration (configs/nanovlm.yaml: 4096-token rows, images resized to 2048 px and
# split into 512-px crops) with random weights and the byte tokenizer, on the demo images.
NANOVLM = [
    "model.tokenizer=builtin:bytes", "model.vision_weights=''", "model.language_weights=''",
    "train.gradient_accumulation_steps=1", "train.warmup_steps=2", "train.eval_every=0",
    "data.validation=[]", "output.checkpoint_every=1000",
]


def nanovlm(preset):
    """NANOVLM for a preset: images resized to 4 crops on the long side (2048 px for the 460M
    model's 512-px crops, as nanoVLM; 896 px for the 222M model's 224-px crops)."""
    side = 2048 if preset == "nanovlm-460m" else 896
    return NANOVLM + [f"model.preset={preset}", f"data.max_img_size={side}"]


class Runner:
    def __init__(self, vlmtrain, work, data, device="cuda"):
        self.vlmtrain, self.work, self.data, self.device = vlmtrain, work, data, device

    def train(self, name, config, overrides, env=None, expect_ok=True, resume=False,
              vlmtrain=None):
        """Runs `vlmtrain train` (`vlmtrain`: another build of it) in a fresh run dir
        (`resume`: continue the one there); returns (exit code, run dir, step records)."""
        out = os.path.join(self.work, name)
        if not resume:  # a run dir left by an earlier gpu-check would be resumed
            shutil.rmtree(out, ignore_errors=True)
            if os.path.exists(out + ".log"):
                os.remove(out + ".log")
        args = [vlmtrain or self.vlmtrain, "--no-color", "train", "--config", os.path.join(ROOT, config),
                "--set", f"data.train=[{{path: {self.data}/train.jsonl}}]",
                "--set", f"train.device={self.device}", "--set", f"output.dir={out}"]
        for item in overrides:
            args += ["--set", item]
        started = time.time()
        with open(out + ".log", "a") as log:
            log.write("$ " + " ".join(args) + "\n")
            log.flush()
            code = subprocess.call(args, stdout=log, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, **(env or {})))
        print(f"  {name}: exit {code} in {time.time() - started:.0f} s", flush=True)
        if expect_ok and code != 0:
            raise CheckFailed(f"{name}: vlmtrain exited {code} (log: {out}.log)")
        return code, out, records(out, "step")


class CheckFailed(Exception):
    pass


def records(run_dir, kind):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("type") == kind]


def final_weights(run_dir):
    """{name: array of floats} from the newest checkpoint's model.safetensors."""
    ckpt = os.path.join(run_dir, "checkpoints")
    steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step-") and ".tmp" not in d)
    with open(os.path.join(ckpt, steps[-1], "model.safetensors"), "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        body = f.read()
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        raw = body[begin:end]
        if meta["dtype"] == "F32":
            values = array.array("f", raw)
        elif meta["dtype"] == "BF16":  # the high half of an fp32
            halves = array.array("H", raw)
            values = array.array("f", array.array("I", (h << 16 for h in halves)).tobytes())
        else:
            raise CheckFailed(f"unexpected dtype {meta['dtype']} of {name}")
        tensors[name] = values
    return tensors


def max_difference(a, b):
    if a.keys() != b.keys() or any(len(a[n]) != len(b[n]) for n in a):
        raise CheckFailed("the checkpoints hold different tensors")
    worst = 0.0
    for n in a:
        for x, y in zip(a[n], b[n]):
            d = abs(x - y)
            if not d <= worst:  # also a NaN
                worst = d if d == d else math.inf
    return worst


def finite_losses(steps):
    return bool(steps) and all(s.get("loss") is not None and math.isfinite(s["loss"])
                               for s in steps)


def prediction_errors(steps):
    """(predicted - measured) / measured of the allocated and reserved peaks per step."""
    out = {"allocated": [], "reserved": []}
    for s in steps:
        if s.get("oom_retries", 0):
            continue
        for kind, pred, meas in (("allocated", "memory/predicted_peak_bytes",
                                  "memory/peak_allocated_bytes"),
                                 ("reserved", "memory/predicted_reserved_bytes",
                                  "memory/peak_reserved_bytes")):
            if s.get(pred) and s.get(meas):
                out[kind].append((s[pred] - s[meas]) / s[meas])
    return out


def summary_of(steps, skip=0):
    if not steps:
        raise CheckFailed("the run recorded no step")
    kept = steps[skip:] or steps
    def median(key):
        values = [s[key] for s in kept if s.get(key) is not None]
        return statistics.median(values) if values else None
    errors = prediction_errors(steps)
    return {
        "steps": len(steps),
        "loss_first": steps[0]["loss"] if steps else None,
        "loss_last": steps[-1]["loss"] if steps else None,
        "tokens_per_step": median("tokens"),
        "crops_per_step": median("crops"),
        "useful_tokens_per_s": median("throughput/tokens_per_s"),
        "mfu": median("mfu"),
        "step_ms": median("time/step_ms"),
        "data_wait_ms": median("time/data_wait_ms"),
        "peak_allocated_bytes": max((s.get("memory/peak_allocated_bytes") or 0) for s in steps),
        "peak_reserved_bytes": max((s.get("memory/peak_reserved_bytes") or 0) for s in steps),
        "predicted_peak_bytes": max((s.get("memory/predicted_peak_bytes") or 0) for s in steps),
        "predicted_reserved_bytes": max((s.get("memory/predicted_reserved_bytes") or 0)
                                        for s in steps),
        "prediction_error_allocated": errors["allocated"],
        "prediction_error_reserved": errors["reserved"],
    }


def check_bf16_steps(r, presets):
    out = {}
    for preset in presets:
        if preset == "tiny":
            _, _, steps = r.train("bf16-tiny", "configs/demo.yaml",
                                  TINY + ["train.precision=bf16", "train.max_steps=10"])
        else:
            _, _, steps = r.train(f"bf16-{preset}", "configs/nanovlm.yaml",
                                  nanovlm(preset) + ["train.batch_size=1", "train.max_steps=4"])
        if not finite_losses(steps):
            raise CheckFailed(f"bf16 {preset}: a step's loss is not finite")
        out[preset] = summary_of(steps)
    return out


def check_injected_ooms(r):
    base = TINY + ["train.precision=fp32", "train.max_steps=8"]
    _, clean, _ = r.train("oom-clean", "configs/demo.yaml", base)
    reference = final_weights(clean)
    out = {}
    for kind, step in (("oom_forward", 2), ("oom_backward", 3), ("oom_optimizer", 4)):
        _, run, steps = r.train(f"oom-{kind}", "configs/demo.yaml", base,
                                env={"VLMTRAIN_INJECT_FAULT": f"{kind}@{step}"})
        diff = max_difference(reference, final_weights(run))
        out[kind] = {"max_weight_difference": diff,
                     "oom_retries": sum(s.get("oom_retries", 0) for s in steps)}
        if diff > 1e-5:
            raise CheckFailed(f"{kind}: weights differ by {diff:g} from the clean run")
    return out


def check_real_oom(r):
    """A cap under the measured peak (the caching allocator's memory fraction): the trainer
    splits the micro-batch after real CUDA OOMs and reaches the uncapped run's weights."""
    # A budget far above the cap, so the sampler splits nothing ahead and the OOMs happen.
    base = TINY + ["train.precision=fp32", "train.max_steps=6", "train.batch_size=8",
                   "memory.device_memory=1TiB"]
    _, free_run, steps = r.train("real-oom-free", "configs/demo.yaml", base)
    if not steps:
        raise CheckFailed("the uncapped run recorded no step")
    peak = max(s["memory/peak_allocated_bytes"] for s in steps)
    static = max(s.get("memory/predicted_static_bytes") or 0 for s in steps)
    outside = max(s.get("memory/device_overhead_bytes") or 0 for s in steps)
    # simulate_device_bytes is a device size: the allocator gets it less what the device holds
    # outside the allocator (the CUDA context).
    cap = int(outside + static + 0.6 * (peak - static))
    _, capped, capped_steps = r.train(
        "real-oom-capped", "configs/demo.yaml",
        base + [f"memory.simulate_device_bytes={cap}", "train.preflight=false"])
    diff = max_difference(final_weights(free_run), final_weights(capped))
    retries = sum(s.get("oom_retries", 0) for s in capped_steps)
    if retries == 0:
        raise CheckFailed(f"a cap of {cap} bytes (peak {peak}) caused no OOM")
    if diff > 1e-5:
        raise CheckFailed(f"weights after real OOMs differ by {diff:g}")
    return {"cap_bytes": cap, "uncapped_peak_bytes": peak, "oom_retries": retries,
            "max_weight_difference": diff}


def check_checkpointing(r):
    base = TINY + ["train.precision=fp32", "train.max_steps=6"]
    _, plain, _ = r.train("ckpt-off", "configs/demo.yaml", base)
    _, ckpt, _ = r.train("ckpt-on", "configs/demo.yaml",
                         base + ["model.checkpoint_vision=true", "model.checkpoint_language=true"])
    diff = max_difference(final_weights(plain), final_weights(ckpt))
    if diff > 1e-5:
        raise CheckFailed(f"checkpointing changes the weights by {diff:g}")
    return {"max_weight_difference": diff}


def check_fused_optimizer(r):
    """The fused AdamW kernel (train.fused_optimizer, LibTorch >= 2.1) against LibTorch's
    per-parameter AdamW: the same weights up to rounding, and the optimizer phase's time."""
    base = TINY + ["train.precision=fp32", "train.max_steps=6"]
    _, fused, fused_steps = r.train("adamw-fused", "configs/demo.yaml", base)
    _, plain, plain_steps = r.train("adamw-plain", "configs/demo.yaml",
                                    base + ["train.fused_optimizer=false"])
    diff = max_difference(final_weights(plain), final_weights(fused))
    ms = lambda steps: statistics.median(s["time/optimizer_ms"] for s in steps[1:])
    if diff > 1e-5:
        raise CheckFailed(f"the fused AdamW ends {diff:g} away from LibTorch's")
    return {"max_weight_difference": diff, "optimizer_ms_fused": ms(fused_steps),
            "optimizer_ms_plain": ms(plain_steps)}


def check_resume(r):
    # A constant rate, so that the first part's shorter max_steps does not change the schedule.
    base = TINY + ["train.precision=bf16", "output.checkpoint_every=3", "train.schedule=constant",
                   "train.warmup_steps=0"]
    _, straight, _ = r.train("resume-straight", "configs/demo.yaml", base + ["train.max_steps=6"])
    r.train("resume-split", "configs/demo.yaml", base + ["train.max_steps=3"])
    _, split, steps = r.train("resume-split", "configs/demo.yaml", base + ["train.max_steps=6"],
                              resume=True)
    diff = max_difference(final_weights(straight), final_weights(split))
    if diff > 1e-6:
        raise CheckFailed(f"a resumed run ends {diff:g} away from the straight one")
    return {"max_weight_difference": diff, "steps_after_resume": len(steps)}


# The recording matrix (docs/gpu.md, "Recording"): each run records the allocator's trace of its
# steps (output.memory_trace_steps) beside the measured peaks and the model's predictions.
# (name, config, overrides, steps); no preflight and no byte cap, so every step runs as planned.
def record_matrix():
    tiny = TINY + ["train.preflight=false", "memory.device_memory=1TiB"]
    big = lambda preset: nanovlm(preset) + ["train.batch_size=1", "train.preflight=false",
                                            "memory.device_memory=1TiB"]
    ckpt = ["model.checkpoint_vision=true", "model.checkpoint_language=true"]
    bf16, fp32 = ["train.precision=bf16"], ["train.precision=fp32"]
    demo, nano = "configs/demo.yaml", "configs/nanovlm.yaml"
    return [
        ("tiny-fp32", demo, tiny + fp32, 3),
        ("tiny-bf16", demo, tiny + bf16, 3),
        ("tiny-fp32-ckpt", demo, tiny + fp32 + ckpt, 3),
        ("tiny-bf16-ckpt", demo, tiny + bf16 + ckpt, 3),
        ("tiny-bf16-vitchunk8", demo, tiny + bf16 + ["model.vision_chunk_crops=8"], 3),
        ("tiny-bf16-losschunk256", demo, tiny + bf16 + ["model.loss_chunk_tokens=256"], 3),
        ("tiny-bf16-frozen-vision-bf16", demo,
         tiny + bf16 + ["model.freeze_vision=true", "model.frozen_dtype=bf16"], 3),
        ("tiny-fp32-batch8", demo, tiny + fp32 + ["train.batch_size=8"], 3),
        ("tiny-bf16-accum2", demo, tiny + bf16 + ["train.gradient_accumulation_steps=2"], 3),
        ("222m-bf16", nano, big("nanovlm-222m") + bf16, 2),
        ("222m-bf16-ckpt", nano, big("nanovlm-222m") + bf16 + ckpt, 2),
        ("222m-bf16-batch2", nano, big("nanovlm-222m") + bf16 + ["train.batch_size=2"], 2),
        ("222m-fp32", nano, big("nanovlm-222m") + fp32, 2),
        ("460m-bf16", nano, big("nanovlm-460m") + bf16, 2),
        ("460m-bf16-ckpt", nano, big("nanovlm-460m") + bf16 + ckpt, 2),
        ("460m-bf16-frozen-vision", nano, big("nanovlm-460m") + bf16 + ["model.freeze_vision=true"], 2),
        ("460m-bf16-vitchunk16", nano, big("nanovlm-460m") + bf16 + ["model.vision_chunk_crops=16"], 2),
        # What the CUDA step replay does not cover yet (docs/memory.md, "The CUDA step replay"):
        # the loss in chunks (16 tokens: every micro-batch chunks it), LLaVA's first stage (the
        # projector alone trained, the towers frozen in bf16), a checkpointed ViT in chunks.
        ("tiny-bf16-losschunk16", demo, tiny + bf16 + ["model.loss_chunk_tokens=16"], 3),
        ("tiny-bf16-projector-only", demo,
         tiny + bf16 + ["model.freeze_vision=true", "model.freeze_language=true",
                        "model.frozen_dtype=bf16"], 3),
        ("222m-bf16-projector-only", nano,
         big("nanovlm-222m") + bf16 + ["model.freeze_vision=true", "model.freeze_language=true",
                                        "model.frozen_dtype=bf16"], 2),
        ("tiny-bf16-vitchunk8-ckpt", demo,
         tiny + bf16 + ["model.vision_chunk_crops=8", "model.checkpoint_vision=true"], 3),
    ]


def add_to_tar(tar_path, name, data):
    """Appends one member (bytes) to an uncompressed tar, so a run cut short keeps the rest."""
    import io
    os.makedirs(os.path.dirname(tar_path) or ".", exist_ok=True)
    with tarfile.open(tar_path, "a") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))


def xz(path):
    import lzma
    with open(path, "rb") as f:
        return lzma.compress(f.read(), preset=9)


def check_record(r, artifacts, presets, only_runs=()):
    """The recording mode: every run of record_matrix() with its memory trace, step records and
    resolved config appended to ARTIFACTS/memory-traces.tar (each file xz-compressed)."""
    tar_path = os.path.join(artifacts, "memory-traces.tar")
    out = {}
    short = {"tiny": "tiny", "nanovlm-222m": "222m", "nanovlm-460m": "460m"}
    kept = {short.get(p, p) for p in presets}
    for name, config, overrides, steps in record_matrix():
        if name.split("-")[0] not in kept or (only_runs and name not in only_runs):
            continue
        started = time.time()
        try:
            code, run, recs = r.train(f"record-{name}", config,
                                      overrides + [f"train.max_steps={steps}",
                                                   f"output.memory_trace_steps={steps}"],
                                      expect_ok=False)
        except Exception as e:  # one run's failure must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        trace = os.path.join(run, "memory-trace.rank0.txt")
        entry = {"exit": code, "seconds": round(time.time() - started, 1),
                 "overrides": overrides, "steps": []}
        for s in recs:
            entry["steps"].append({k: s.get(k) for k in (
                "step", "tokens", "crops", "micro_steps", "oom_retries",
                "memory/peak_allocated_bytes", "memory/peak_reserved_bytes",
                "memory/predicted_peak_bytes", "memory/predicted_reserved_bytes",
                "memory/device_overhead_bytes")})
        if os.path.exists(trace):
            add_to_tar(tar_path, f"{name}/memory-trace.rank0.txt.xz", xz(trace))
        for extra in ("metrics.jsonl", "config.yaml"):
            if os.path.exists(os.path.join(run, extra)):
                add_to_tar(tar_path, f"{name}/{extra}.xz", xz(os.path.join(run, extra)))
        add_to_tar(tar_path, f"{name}/run.log.xz", xz(run + ".log"))
        shutil.rmtree(os.path.join(run, "checkpoints"), ignore_errors=True)  # GBs at 460M
        out[name] = entry
    failed = [n for n, e in out.items() if e.get("exit") != 0]
    if failed:
        raise CheckFailed(f"runs failed: {', '.join(failed)} (results so far: {json.dumps(out)})")
    return {"runs": out, "archive": tar_path}


def check_fp16(r):
    """fp16 autocast with the dynamic loss scaler: finite losses, and the scale reported."""
    _, _, steps = r.train("fp16-tiny", "configs/demo.yaml",
                          TINY + ["train.precision=fp16", "train.max_steps=8"])
    if not finite_losses(steps):
        raise CheckFailed("fp16: a step's loss is not finite")
    scales = [s.get("loss_scale") for s in steps]
    if any(x is None for x in scales):
        raise CheckFailed("fp16: a step without loss_scale in its metrics")
    return {"losses": [s["loss"] for s in steps], "loss_scales": scales,
            "skipped_steps": steps[-1].get("skipped_steps", 0)}


def check_attention(r, parity_check):
    """The varlen FlashAttention path (model.attention=varlen) against the grouped path on the
    same packed batch, same weights, bf16 autocast on the GPU: the loss and every gradient
    within docs/parity.md's bf16 bounds (every logit's difference reported beside them) (tests/parity/parity_check.cpp
    --compare-attention), for the tiny preset and for 2-block versions of the 222M and 460M
    presets (their head sizes and grouped-query layouts). Beside it, not gating: the tiny case on
    the GPU against nanoVLM's reference recorded on a CPU (tests/parity/reference_tiny.json)."""
    if not parity_check or not os.path.exists(parity_check):
        raise CheckFailed("no parity_check binary (build it: --target vlmtrain,parity_check)")
    out = {}
    cases = [("tiny", []), ("nanovlm-222m", ["--vision-layers", "2", "--language-layers", "2"]),
             ("nanovlm-460m", ["--vision-layers", "2", "--language-layers", "2"])]
    failed = []
    for preset, layers in cases:
        run = subprocess.run([parity_check, "--preset", preset, *layers, "--device", "cuda",
                              "--precision", "bf16", "--attention", "varlen",
                              "--compare-attention", "grouped"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out[preset] = {"exit": run.returncode, "output": run.stdout.strip().splitlines()}
        if run.returncode != 0:
            failed.append(preset)
    for precision in ("fp32", "bf16"):
        run = subprocess.run([parity_check, "--device", "cuda", "--precision", precision,
                              "--reference", os.path.join(ROOT, "tests", "parity",
                                                          "reference_tiny.json")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out[f"tiny-against-nanovlm-{precision}"] = {"exit": run.returncode,
                                                    "output": run.stdout.strip().splitlines()}
    if failed:
        raise CheckFailed(f"varlen against grouped beyond the bounds: {failed} "
                          f"({json.dumps(out)})")
    return out


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
    if not os.path.exists(stream):
        raise CheckFailed(f"no length stream at {stream}")
    data = os.path.join(r.work, "stream-data")
    made = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "stream_dataset.py"),
                           stream, "--out", data, "--samples", str(samples)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise CheckFailed(f"stream_dataset.py: {made.stderr.strip()[-500:]}")
    out = {"dataset": json.loads(made.stdout)}
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
        # End to end on the public length stream, each tool with its own packing.
        ("stream", lambda: check_stream(r, a.stream_steps, a.nanovlm, a.stream)),
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
            result = {"passed": False, "reason": str(e)}
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

"""What every check of scripts/gpu_check.py shares: the runs' settings, the runner of the built
vlmtrain, reading a run's records and checkpoints."""
import array
import json
import math
import os
import shutil
import statistics
import subprocess
import time


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project


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
    """A check that did not pass; `figures` (what it measured before it failed) still go into
    the report."""
    def __init__(self, reason, figures=None):
        super().__init__(reason)
        self.figures = figures or {}


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


def device_peak(s):
    """A step's measured device figure, what the memory budget bounds: on CUDA the reserved peak
    and what the device holds outside the allocator; on the CPU the tensor bytes."""
    if s.get("memory/peak_reserved_bytes"):
        return s["memory/peak_reserved_bytes"] + (s.get("memory/device_overhead_bytes") or 0)
    return s.get("memory/peak_allocated_bytes")


def prediction_errors(steps):
    """(predicted - measured) / measured of the allocated, reserved and (CUDA) device peaks per
    step."""
    out = {"allocated": [], "reserved": [], "device": []}
    for s in steps:
        if s.get("oom_retries", 0):
            continue
        device = device_peak(s) if s.get("memory/peak_reserved_bytes") else None
        for kind, pred, meas in (
                ("allocated", s.get("memory/predicted_peak_bytes"),
                 s.get("memory/peak_allocated_bytes")),
                ("reserved", s.get("memory/predicted_reserved_bytes"),
                 s.get("memory/peak_reserved_bytes")),
                ("device", s.get("memory/predicted_device_bytes"), device)):
            if pred and meas:
                out[kind].append((pred - meas) / meas)
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

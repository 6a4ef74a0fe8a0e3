"""The checks of correctness on the GPU: bf16 steps, OOM recovery (injected and real),
checkpointing, the fused optimizer, resume, fp16, the varlen attention against the grouped path."""
import json
import os
import statistics
import subprocess

from gpucheck.common import (CheckFailed, ROOT, TINY, final_weights, finite_losses, max_difference,
                             nanovlm, summary_of)


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

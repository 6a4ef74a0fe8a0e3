"""The recording mode (docs/gpu.md, "Recording"): the matrix of configurations whose allocator
traces and measured peaks the memory model is checked against on the CPU."""
import json
import os
import shutil
import tarfile
import time

from gpucheck.common import CheckFailed, TINY, nanovlm


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
        # The rest (2026-11-28, night): an untied head (replayed from the code), the decoder
        # or the projector frozen alone, a chunked loss over two micro-steps and at 460M's
        # sizes, fp32 at 460M, a checkpointed ViT in chunks at 460M.
        ("tiny-bf16-untied", demo, tiny + bf16 + ["model.language.tie_embeddings=false"], 3),
        ("222m-bf16-untied", nano,
         big("nanovlm-222m") + bf16 + ["model.language.tie_embeddings=false"], 2),
        ("tiny-bf16-frozen-language", demo, tiny + bf16 + ["model.freeze_language=true"], 3),
        ("tiny-bf16-frozen-language-bf16", demo,
         tiny + bf16 + ["model.freeze_language=true", "model.frozen_dtype=bf16"], 3),
        ("tiny-bf16-frozen-projector", demo, tiny + bf16 + ["model.freeze_projector=true"], 3),
        ("tiny-bf16-losschunk16-accum2", demo,
         tiny + bf16 + ["model.loss_chunk_tokens=16", "train.gradient_accumulation_steps=2"], 3),
        ("460m-bf16-losschunk1024", nano,
         big("nanovlm-460m") + bf16 + ["model.loss_chunk_tokens=1024"], 2),
        ("460m-fp32", nano, big("nanovlm-460m") + fp32, 2),
        ("460m-bf16-vitchunk16-ckpt", nano,
         big("nanovlm-460m") + bf16 + ["model.vision_chunk_crops=16",
                                        "model.checkpoint_vision=true"], 2),
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

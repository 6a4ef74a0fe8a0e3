#!/usr/bin/env python3
"""Useful tokens/s of nanoVLM's own training step, for comparison with vlmtrain's on one GPU.

    python3 bench/nanovlm_throughput.py --nanovlm PATH --preset nanovlm-460m \\
        --tokens 4096 --crops 60 --steps 20 --json OUT.json

nanoVLM (github.com/huggingface/nanoVLM, never vendored here) is imported with the shims of
scripts/parity/make_reference.py. Each step is train.py's: forward under
torch.autocast(bfloat16) with targets, loss.backward(), clip_grad_norm_(1.0) over the parameter
groups, AdamW (projector, vision and language groups), zero_grad. No torch.compile (train.py's
default), no gradient accumulation (one micro-batch per step, as vlmtrain's throughput check).

The batch is synthetic, shaped like a packed row of nanoVLM's: `--rows` rows of `--tokens`
tokens (no padding, so every token is useful, as vlmtrain counts them), `--crops` crops per row
spread over its images, their image tokens placed where nanoVLM's processor puts them, and every
text token supervised. Weights are random (no download). Match `--tokens` and `--crops` to the
tokens and crops per step that vlmtrain's gpu-check reports, to compare like with like.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                                "parity"))
from make_reference import import_nanovlm  # noqa: E402

# vlmtrain's presets (lib/spec/presets.cpp) as nanoVLM VLMConfig fields; the rest are
# VLMConfig's defaults, which are the 460M model.
PRESETS = {
    "nanovlm-460m": {},
    "nanovlm-222m": {"vit_img_size": 224, "mp_pixel_shuffle_factor": 2,
                     "mp_image_token_length": 49, "lm_hidden_dim": 576, "lm_inter_dim": 1536,
                     "lm_n_blocks": 30, "lm_n_heads": 9, "lm_n_kv_heads": 3,
                     "extra_token_amount": 1, "lm_vocab_size": 49152 + 1},
    # For a CPU smoke test of this script (vlmtrain's tiny preset).
    "tiny": {"vit_hidden_dim": 64, "vit_inter_dim": 256, "vit_patch_size": 8, "vit_img_size": 64,
             "vit_n_heads": 2, "vit_n_blocks": 2, "lm_hidden_dim": 128, "lm_inter_dim": 384,
             "lm_n_heads": 4, "lm_n_kv_heads": 2, "lm_n_blocks": 4, "lm_re_base": 10000,
             "lm_max_position_embeddings": 4096, "lm_base_vocab_size": 259,
             "extra_token_amount": 66, "lm_vocab_size": 325, "mp_pixel_shuffle_factor": 2,
             "mp_image_token_length": 16},
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nanovlm", required=True)
    p.add_argument("--preset", choices=sorted(PRESETS), default="nanovlm-460m")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per row")
    p.add_argument("--crops", type=int, default=60, help="crops per row")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args()

    fields = PRESETS[a.preset]
    image_token_id = fields.get("lm_base_vocab_size", 49152)  # the first extra token
    VLMConfig, VisionLanguageModel = import_nanovlm(os.path.abspath(a.nanovlm), image_token_id)
    cfg = VLMConfig(**fields, vlm_load_backbone_weights=False)
    device = torch.device(a.device)
    model = VisionLanguageModel(cfg, load_backbone=False).to(device)
    model.train()
    groups = [{"params": list(model.MP.parameters()), "lr": 0.00512},
              {"params": list(model.vision_encoder.parameters()), "lr": 5e-5},
              {"params": list(model.decoder.parameters()), "lr": 5e-5}]
    optimizer = torch.optim.AdamW(groups)
    params = [q for g in optimizer.param_groups for q in g["params"]]

    per_crop = cfg.mp_image_token_length
    if a.crops * per_crop >= a.tokens:
        raise SystemExit(f"{a.crops} crops of {per_crop} tokens do not fit {a.tokens} tokens")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, image_token_id, (a.rows, a.tokens), generator=gen)
    # Crops in runs spread over the row (one image's crops together, text between images).
    stride = a.tokens // max(a.crops, 1)
    for c in range(a.crops):
        start = c * stride
        ids[:, start:start + per_crop] = image_token_id
    labels = torch.where(ids == image_token_id, torch.full_like(ids, -100), ids.roll(-1, 1))
    labels[:, -1] = -100
    mask = torch.ones_like(ids)
    images = torch.randn(a.rows * a.crops, 3, cfg.vit_img_size, cfg.vit_img_size, generator=gen)
    ids, labels, mask, images = (t.to(device) for t in (ids, labels, mask, images))

    def step():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            _, loss = model(ids, images, attention_mask=mask, targets=labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    seconds = (time.perf_counter() - started) / a.steps
    tokens = int(mask.sum())
    out = {
        "preset": a.preset, "torch": torch.__version__, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "rows": a.rows, "tokens_per_row": a.tokens, "crops_per_row": a.crops,
        "step_ms": 1000 * seconds, "useful_tokens_per_s": tokens / seconds,
        "loss": float(loss),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device.type == "cuda" else None,
    }
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

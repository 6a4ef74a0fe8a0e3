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

`--stream LENGTHS` runs end to end instead, with nanoVLM's own packing: the samples of a length
stream written by bench/stream_dataset.py (DIR/lengths.jsonl, the shapes of the manifest that
vlmtrain trains on) go through nanoVLM's ConstantLengthDataset (max_sample_length 4096, 4 images
per sample, 18 per knapsack, num_of_sequences = 4 x batch size), its VQACollator (rows padded
to 4096 tokens) and a DataLoader as train.py sets them up (3 workers, pinned memory), and
train.py's loop: --accumulation micro-batches of --rows rows per optimizer step, with its
per-micro-batch loss.item() and token count. Each sample's tokens are random ids with
64 <|image|> slots per crop, its supervised tokens last, and its images random crops
([4r + 1, 3, 512, 512] per image of r grid rows, views of one shared tensor: nanoVLM's data
costs nothing here, where vlmtrain decodes and resizes real files). Useful tokens are
supervised + image slots; padding is what the collator adds.
"""
import argparse
import json
import os
import sys
import time
import types

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
    p.add_argument("--stream", help="end to end on this length stream (bench/stream_dataset.py's "
                   "lengths.jsonl) with nanoVLM's packing; --steps optimizer steps after --warmup")
    p.add_argument("--accumulation", type=int, default=8, help="--stream: micro-batches per "
                   "optimizer step (train.py's gradient_accumulation_steps)")
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
    if a.stream:
        out = run_stream(a, cfg, model, optimizer, params, image_token_id, device)
        print(json.dumps(out, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        return

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


def load_nanovlm_module(path, name):
    """A module of nanoVLM's data/ folder, loaded from its file (make_reference's shims stand
    in for the package `data`, which the rest of data/ needs with its tokenizer downloads)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"nanovlm_{name}",
                                                  os.path.join(path, "data", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StreamSamples:
    """The base dataset ConstantLengthDataset wraps: sample i of the length stream as nanoVLM's
    VQADataset returns it (input_ids, labels, attention_mask, images)."""

    def __init__(self, path, cfg, image_token_id, pad_token_id):
        with open(path) as f:
            self.shapes = [json.loads(line) for line in f if line.strip()]
        self.dataset = self.shapes  # ConstantLengthDataset asks whether this has a length
        self.mp_image_token_length = cfg.mp_image_token_length
        self.tokenizer = types.SimpleNamespace(pad_token_id=pad_token_id)
        self.image_token_id = image_token_id
        self.crops = torch.randn(17, 3, cfg.vit_img_size, cfg.vit_img_size,
                                 generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.shapes)

    def __getitem__(self, i):
        shape = self.shapes[i]
        tokens, supervised = shape["tokens"], shape["supervised"]
        rows = shape.get("grid_rows") or []
        ids = torch.randint(0, self.image_token_id, (tokens,),
                            generator=torch.Generator().manual_seed(i))
        # After a few header tokens, each image: a marker token and 64 slots per crop.
        at = 5
        for r in rows:
            for _ in range(4 * r + 1):
                ids[at + 1:at + 1 + self.mp_image_token_length] = self.image_token_id
                at += 1 + self.mp_image_token_length
        labels = torch.full((tokens,), -100)
        labels[tokens - supervised:] = ids[tokens - supervised:]
        images = [self.crops[:4 * r + 1] for r in rows]
        return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones(tokens,
                dtype=torch.long), "images": images}


def run_stream(a, cfg, model, optimizer, params, image_token_id, device):
    """train.py's loop over nanoVLM's packing of the stream; figures over the timed steps."""
    packing = load_nanovlm_module(os.path.abspath(a.nanovlm), "advanced_datasets")
    collators = load_nanovlm_module(os.path.abspath(a.nanovlm), "collators")
    pad = image_token_id - 1  # any text id: padding is masked and never supervised
    samples = StreamSamples(a.stream, cfg, image_token_id, pad)
    packed = packing.ConstantLengthDataset(
        samples, infinite=True, max_sample_length=4096, seq_length=cfg.lm_max_length,
        num_of_sequences=a.rows * 4, queue_size=8, max_images_per_example=4,
        max_images_per_knapsack=18)
    collate = collators.VQACollator(types.SimpleNamespace(pad_token_id=pad), cfg.lm_max_length)
    loader = torch.utils.data.DataLoader(packed, batch_size=a.rows, collate_fn=collate,
                                         num_workers=3, pin_memory=device.type == "cuda",
                                         drop_last=True)
    batches = iter(loader)
    timed = {"useful_tokens": 0, "supervised_tokens": 0, "image_tokens": 0, "tokens": 0,
             "padding_tokens": 0, "crops": 0, "micro_batches": 0}
    started = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
        for _ in range(a.accumulation):
            batch = next(batches)
            images = batch["images"]
            input_ids = batch["input_ids"].to(device)
            labels = batch["labels"].to(device)
            attention_mask = batch["attention_mask"].to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                _, loss = model(input_ids, images, attention_mask=attention_mask, targets=labels)
            (loss / a.accumulation).backward()
            loss.item()  # train.py reads each micro-batch's loss
            real = int(torch.sum(attention_mask).item())  # and counts its tokens
            if step >= a.warmup:
                supervised = int((batch["labels"] != -100).sum())
                image = int((batch["input_ids"] == image_token_id).sum())
                timed["supervised_tokens"] += supervised
                timed["image_tokens"] += image
                timed["useful_tokens"] += supervised + image
                timed["tokens"] += real
                timed["padding_tokens"] += batch["input_ids"].numel() - real
                timed["crops"] += sum(int(img.shape[0]) for sample in images for img in sample)
                timed["micro_batches"] += 1
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    rows = timed["micro_batches"] * a.rows
    return {
        "preset": a.preset, "torch": torch.__version__, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "mode": "stream", "stream": a.stream, "rows_per_micro_batch": a.rows,
        "accumulation": a.accumulation, "steps": a.steps, "warmup_steps": a.warmup,
        "seconds": seconds, "step_ms": 1000 * seconds / a.steps, **timed,
        "useful_tokens_per_s": timed["useful_tokens"] / seconds,
        "tokens_per_s": timed["tokens"] / seconds,
        "padding_pct": 100 * timed["padding_tokens"] / max(rows * cfg.lm_max_length, 1),
        "crops_per_row": timed["crops"] / max(rows, 1),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device.type == "cuda" else None,
    }


if __name__ == "__main__":
    main()

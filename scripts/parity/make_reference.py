#!/usr/bin/env python3
"""Records nanoVLM's outputs on a parity case written by vlmtrain (docs/parity.md).

    python3 scripts/parity/make_reference.py --nanovlm PATH --case CASE.safetensors --out REF.json

PATH is a checkout of github.com/huggingface/nanoVLM (never vendored here). The case
(`parity_check --write-case`) holds the weights under nanoVLM's names, the batch, and the
dimensions as nanoVLM VLMConfig fields. The script builds nanoVLM's VisionLanguageModel with
them, loads the weights, runs forward and backward in fp32 and under CPU bf16 autocast, and writes
the loss, a fixed subset of the logits, every gradient's norm and sum, the loss of the packed
rows, and the two ways of averaging two micro-batches.

Shims, the smallest that let nanoVLM's model run without its data and Hub dependencies:
- `data.processors.get_tokenizer` would download a tokenizer; the model only reads
  `image_token_id` from it, so a stand-in with the case's id is installed instead.
- `safetensors.torch` (imported for save/load helpers this script does not call) is stubbed
  when the package is missing; the case is read with the standard library and torch.
Works with torch 1.13 (Debian's python3-torch: nanoVLM then takes its own non-SDPA attention
path) and torch 2.x.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import types

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "BF16": torch.bfloat16, "F16": torch.float16, "U8": torch.uint8, "BOOL": torch.bool}
LOGIT_STRIDE = 5  # every 5th real position of every row
LOGIT_VOCAB = [0, 7, 31, 100, 258]  # and these vocabulary entries, plus the image token and last


def read_case(path):
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        body = bytearray(f.read())
    meta = json.loads(header.pop("__metadata__")["parity"])
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = body[begin:end]
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if raw else \
            torch.empty(0, dtype=DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).clone()
    return meta, tensors


def import_nanovlm(path, image_token_id):
    sys.path.insert(0, path)
    processors = types.ModuleType("data.processors")
    processors.get_tokenizer = lambda *a, **k: types.SimpleNamespace(image_token_id=image_token_id)
    data = types.ModuleType("data")
    data.processors = processors
    sys.modules.setdefault("data", data)
    sys.modules["data.processors"] = processors
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        st = types.ModuleType("safetensors")
        st.torch = types.ModuleType("safetensors.torch")
        st.torch.load_model = st.torch.save_model = None
        sys.modules["safetensors"], sys.modules["safetensors.torch"] = st, st.torch
    from models.config import VLMConfig
    from models.vision_language_model import VisionLanguageModel
    return VLMConfig, VisionLanguageModel


def build_model(VLMConfig, VisionLanguageModel, meta, tensors):
    cfg = VLMConfig(**meta["config"], vlm_load_backbone_weights=False)
    model = VisionLanguageModel(cfg, load_backbone=False)
    weights = {k: v for k, v in tensors.items() if not k.startswith(("batch.", "packed."))}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # The tied head is the token embedding's tensor; inv_freq is a buffer derived from the base.
    allowed_missing = {"decoder.head.weight", "decoder.rotary_embd.inv_freq"}
    if unexpected or set(missing) - allowed_missing:
        raise SystemExit(f"weights do not match nanoVLM's names: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    if cfg.lm_tie_weights and model.decoder.head.weight is not model.decoder.token_embedding.weight:
        raise SystemExit("nanoVLM's head is not tied to the token embedding")
    model.train()  # dropout is 0: the same numbers as eval()
    return model


def batch_of(tensors, prefix):
    ids, mask, targets = (tensors[f"{prefix}.{k}"] for k in ("input_ids", "attention_mask",
                                                            "targets"))
    return ids, mask, targets, tensors.get(f"{prefix}.images")


def loss_of(model, ids, mask, targets, images, image_token_id, bf16=False):
    crops = None
    if images is not None:
        crops = images
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits, loss = model(ids, crops, attention_mask=mask, targets=targets)
    return logits, loss


def record(model, tensors, image_token_id, bf16):
    model.zero_grad(set_to_none=True)
    ids, mask, targets, images = batch_of(tensors, "batch")
    logits, loss = loss_of(model, ids, mask, targets, images, image_token_id, bf16)
    loss.backward()
    vocab = logits.size(-1)
    columns = sorted({v for v in LOGIT_VOCAB + [image_token_id, vocab - 1] if v < vocab})
    samples = []
    for r in range(ids.size(0)):
        for t in range(0, int(mask[r].sum()), LOGIT_STRIDE):
            for v in columns:
                samples.append([r, t, v, float(logits[r, t, v].double())])
    grads = {name: {"norm": float(p.grad.double().norm()), "sum": float(p.grad.double().sum()),
                    "abs_sum": float(p.grad.double().abs().sum())}
             for name, p in model.named_parameters() if p.grad is not None}
    return {"loss": float(loss.double()), "logits": samples, "grads": grads}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nanovlm", required=True, help="a nanoVLM checkout")
    p.add_argument("--case", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    meta, tensors = read_case(a.case)
    image_token_id = meta["image_token_id"]
    VLMConfig, VisionLanguageModel = import_nanovlm(os.path.abspath(a.nanovlm), image_token_id)
    model = build_model(VLMConfig, VisionLanguageModel, meta, tensors)
    try:
        commit = subprocess.check_output(["git", "-C", a.nanovlm, "rev-parse", "HEAD"],
                                         text=True, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = os.environ.get("NANOVLM_COMMIT", "unknown")
    out = {"nanovlm_commit": commit, "torch": torch.__version__,
           "case": {k: meta[k] for k in ("preset", "seed", "image_token_id")},
           "config": meta["config"]}
    out["fp32"] = record(model, tensors, image_token_id, bf16=False)
    out["bf16"] = record(model, tensors, image_token_id, bf16=True)
    with torch.no_grad():
        out["packed_loss"] = float(loss_of(model, *batch_of(tensors, "packed"),
                                           image_token_id)[1].double())
        # Row 0 (both images) and rows 1-2 as two micro-batches.
        ids, mask, targets, images = batch_of(tensors, "batch")
        per_row = (ids == image_token_id).sum(1) // meta["config"]["mp_image_token_length"]
        first = int(per_row[0])
        parts = [(slice(0, 1), images[:first] if first else None),
                 (slice(1, None), images[first:] if images is not None and
                  images.size(0) > first else None)]
        losses, counts = [], []
        for rows, crops in parts:
            _, loss = loss_of(model, ids[rows], mask[rows], targets[rows], crops, image_token_id)
            losses.append(float(loss.double()))
            counts.append(int((targets[rows] != -100).sum()))
    out["two_micro_batches"] = {
        "losses": losses, "supervised_tokens": counts,
        "mean_of_means": sum(losses) / len(losses),
        "token_weighted": sum(l * n for l, n in zip(losses, counts)) / sum(counts)}
    text = json.dumps(out, indent=1)
    # One line per logit sample: [row, position, vocabulary index, value].
    text = re.sub(r"\[\s+([^\[\]{}]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                  text)
    with open(a.out, "w") as f:
        f.write(text + "\n")
    print(f"make_reference: {a.out}: loss fp32 {out['fp32']['loss']:.9f}, "
          f"bf16 {out['bf16']['loss']:.6f}, packed {out['packed_loss']:.6f}, "
          f"{len(out['fp32']['grads'])} gradients, {len(out['fp32']['logits'])} logits")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A real dataset (a manifest and PNG files) whose samples have the shapes of a length stream.

    python3 bench/stream_dataset.py ../shared/bench/stream-public-seed1234.jsonl \\
        --out DIR [--samples N]

A length stream (`{"tokens", "images", "crops", "supervised"}` per line, docs/BENCHMARKS.md)
says what each sample of a dataset costs, not what it holds. For an end-to-end run of
`vlmtrain train` on those shapes (decoding, resizing, splitting, tokenizing, packing and
training, as on real data) this writes, for each of the first N samples of the stream, a
manifest line whose tokens, images, crops and supervised tokens under `configs/nanovlm.yaml`
with the byte tokenizer (`model.tokenizer=builtin:bytes`) are the stream's:

- images: nanoVLM's settings (`data.resize_to_max`, 2048-px long side, 512-px crops) turn an
  image of 4 x r crops' aspect into a 4-column, r-row grid plus the global crop, 4r + 1 crops
  (5, 9, 13 or 17). A sample's crops are split over its images accordingly; one PNG per grid
  shape (1024 px wide, 256 r high) is written and shared by every sample that uses it (each use
  is decoded and resized again, as separate files would be).
- text: one user turn and one assistant reply of lowercase letters, the reply as long as the
  supervised tokens less its closing <|im_end|>, the question filling the rest. The chat
  template's fixed tokens (lib/data/tokenizer/chat_template.h) are TEMPLATE_TOKENS plus, when a
  sample has several images, the bytes of each "<image: k>" label.

A stream sample with fewer text tokens than the template needs keeps its tokens and loses
supervised tokens (counted as `inexact` in `DIR/stream.json`, with the totals). The shapes as
written, each with its images' grid rows, are `DIR/lengths.jsonl`, a length stream itself:
`bench/nanovlm_throughput.py --stream` feeds nanoVLM the same samples, and
`vlmtrain inspect-batches --lengths DIR/lengths.jsonl` packs them as the manifest is packed.
Python's standard library only (it runs on the GPU machine too).
"""
import argparse
import itertools
import json
import os
import struct
import zlib

# <|im_start|> user \n ... <|im_end|> \n <|im_start|> assistant \n ... <|im_end|> \n, in bytes
# of the byte tokenizer and its special tokens.
TEMPLATE_TOKENS = 1 + len("user\n") + 1 + 1 + 1 + len("assistant\n") + 1 + 1
IMAGE_TOKENS_PER_CROP = 64  # nanovlm-460m: (512 / 16)^2 / 4^2
GRID_CROPS = {rows: 4 * rows + 1 for rows in (1, 2, 3, 4)}  # 4 columns after resize_to_max


def png(path, width, height, seed):
    """An RGB PNG with a gradient and stripes (not a flat colour, which decodes unusually
    fast), zlib level 6."""
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")
        for x in range(width):
            row += bytes(((x + seed * 37) & 255, (y * 3) & 255, ((x ^ y) + seed) & 255))
        rows.append(bytes(row))
    raw = b"".join(rows)

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(chunk(b"IEND", b""))


def split_crops(images, crops):
    """Rows (1-4) per image whose grids sum to `crops`, or None."""
    for rows in itertools.combinations_with_replacement((4, 3, 2, 1), images):
        if sum(GRID_CROPS[r] for r in rows) == crops:
            return list(rows)
    return None


def words(n, seed):
    """n bytes of three-letter lowercase words and spaces, varied by seed."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = "".join(letters[(seed + 7 * i) % 26] + letters[(seed * 3 + i) % 26] +
                   letters[(i * i + seed) % 26] + " " for i in range(n // 4 + 1))
    return text[:n]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("stream")
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=0, help="the first N samples (0: all)")
    a = p.parse_args()
    os.makedirs(os.path.join(a.out, "images"), exist_ok=True)
    for rows in GRID_CROPS:
        path = os.path.join(a.out, "images", f"grid-4x{rows}.png")
        if not os.path.exists(path):
            png(path, 1024, 256 * rows, rows)

    totals = {"samples": 0, "tokens": 0, "images": 0, "crops": 0, "supervised": 0}
    inexact = []
    with open(a.stream) as stream, open(os.path.join(a.out, "train.jsonl"), "w") as out, \
            open(os.path.join(a.out, "lengths.jsonl"), "w") as lengths:
        for index, line in enumerate(stream):
            if a.samples and index >= a.samples:
                break
            s = json.loads(line)
            rows = split_crops(s["images"], s["crops"])
            if rows is None:
                raise SystemExit(f"{a.stream}:{index + 1}: {s['crops']} crops cannot be split "
                                 f"over {s['images']} images of 5, 9, 13 or 17 crops")
            labels = (sum(len(f"<image: {k}>") for k in range(len(rows)))
                      if len(rows) > 1 else 0)
            # Each crop: its marker token (<|global_image|> or <row_r_col_c>) and its slots.
            text = (s["tokens"] - TEMPLATE_TOKENS - labels -
                    (IMAGE_TOKENS_PER_CROP + 1) * s["crops"])
            reply = min(max(s["supervised"] - 1, 1), text - 1)
            if reply < 1 or reply + 1 != s["supervised"]:  # too few text tokens for the stream
                inexact.append(index + 1)
                reply = max(reply, 1)
            question = max(text - reply, 1)
            out.write(json.dumps({
                "images": [f"images/grid-4x{r}.png" for r in rows],
                "texts": [{"user": words(question, 2 * index),
                           "assistant": words(reply, 2 * index + 1)}]}) + "\n")
            shape = {"tokens": TEMPLATE_TOKENS + labels + (IMAGE_TOKENS_PER_CROP + 1) * s["crops"]
                     + question + reply, "images": s["images"], "crops": s["crops"],
                     "supervised": reply + 1, "grid_rows": rows}
            lengths.write(json.dumps(shape) + "\n")
            totals["samples"] += 1
            for key in ("tokens", "images", "crops", "supervised"):
                totals[key] += shape[key]
    summary = {"stream": os.path.basename(a.stream), "totals": totals,
               "inexact_lines": inexact[:50], "inexact": len(inexact)}
    with open(os.path.join(a.out, "stream.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

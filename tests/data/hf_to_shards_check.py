#!/usr/bin/env python3
"""scripts/hf_to_shards.py end to end: parquet files in the_cauldron's schema (with
FineVision's `source` and ratings columns) made here with pyarrow, converted to shards, then
every sample read back by vlmtrain (`tokenize --render N --json`: the shard reader, the image
bytes and their decoding) and compared with its parquet row: the texts, and each image's bytes
(or, for a GIF re-encoded to PNG, its size). Also: the same inputs and seed give the same bytes,
each subset keeps its order in the interleave, a sample without image bytes is skipped and
counted, the converter's offset indexes equal the ones vlmtrain builds itself, and a LLaVA JSON
with its image folder converts too.

Usage: hf_to_shards_check.py VLMTRAIN REPO_ROOT   (pyarrow and Pillow on PYTHONPATH)
Exit 0 when every check passes.
"""
import filecmp
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image


def fnv1a64(data):
    h = 14695981039346656037
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def encoded(fmt, size, colour):
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, fmt)
    return out.getvalue()


IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
SCHEMA = pa.schema([
    ("images", pa.list_(IMAGE)),
    ("texts", pa.list_(pa.struct([("user", pa.string()), ("assistant", pa.string()),
                                  ("source", pa.string())]))),
    ("source", pa.string()),
    ("relevance_ratings", pa.list_(pa.int64())),
])


def rows(subset, count, start=0):
    """Rows whose question names the subset and the row: matched back by their text."""
    out = []
    for i in range(start, start + count):
        if i % 4 == 0:
            images = [encoded("PNG", (20 + i, 10), (i * 9 % 256, 50, 90))]
        elif i % 4 == 1:
            images = [encoded("JPEG", (16, 12 + i), (200, i * 7 % 256, 10)),
                      encoded("WEBP", (8, 8), (0, 0, 255))]
        elif i % 4 == 2:
            images = []  # text only
        else:
            images = [encoded("GIF", (11, 7), (0, 255, 0))]  # re-encoded to PNG
        out.append({
            "images": [{"bytes": b, "path": None} for b in images],
            "texts": [{"user": f"{subset} question {i}?", "assistant": f"answer {i}",
                       "source": subset}],
            "source": subset,
            "relevance_ratings": [i % 5, 4],
        })
    return out


def write_parquet(path, table_rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table_rows, schema=SCHEMA), path, row_group_size=3)


def run(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, **kw)


def check_llava(vlmtrain, converter):
    """LLaVA JSON + an image folder: images from the folder, a text-only sample, a missing image
    skipped and counted."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "images/coco").mkdir(parents=True)
        jpeg = encoded("JPEG", (24, 16), (10, 200, 30))
        (tmp / "images/coco/a.jpg").write_bytes(jpeg)
        rows = [
            {"id": "a", "image": "coco/a.jpg", "conversations": [
                {"from": "human", "value": "<image>\nWhat colour?"},
                {"from": "gpt", "value": "Green."}]},
            {"id": "b", "conversations": [{"from": "human", "value": "2 plus 2?"},
                                          {"from": "gpt", "value": "4"}]},
            {"id": "c", "image": "coco/missing.jpg", "conversations": [
                {"from": "human", "value": "<image>\n?"}, {"from": "gpt", "value": "x"}]},
        ]
        (tmp / "llava.json").write_text(json.dumps(rows))
        index = json.loads(run(sys.executable, converter, tmp / "llava.json", "--llava-images",
                               tmp / "images", "--out", tmp / "out", "--name", "llava").stdout)
        if index["samples"] != 2 or index["skipped_samples"] != {"image_without_bytes": 1}:
            failures.append(f"llava: 2 samples, one skipped: {index}")
        config = tmp / "config.yaml"
        config.write_text("model: {preset: tiny, tokenizer: 'builtin:bytes'}\n"
                          f"data:\n  train: [{{path: '{tmp / 'out'}'}}]\n  max_img_size: 128\n")
        for n, row in enumerate(rows[:2]):
            got = json.loads(run(vlmtrain, "--config", config, "tokenize", "--render", n,
                                 "--json").stdout)
            turns = [{"role": "user" if m["from"] == "human" else "assistant",
                      "text": m["value"]} for m in row["conversations"]]
            if got["turns"] != turns:
                failures.append(f"llava sample {n}: turns {got['turns']}")
            digests = [i["fnv1a64"] for i in got["images"]]
            want = [fnv1a64(jpeg)] if "image" in row else []
            if digests != want:
                failures.append(f"llava sample {n}: images {got['images']}")
    for f in failures:
        print("FAIL:", f)
    return failures


def check_bad_inputs(converter):
    """Inputs that cannot be converted end with a line naming them and exit 2 (not there, not a
    dataset) or 3 (damaged), never a traceback (exit 1)."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "damaged.parquet").write_bytes(b"PAR1 not really")
        (tmp / "broken.json").write_text('[{"conversations": ')
        (tmp / "lines.jsonl").write_text('{"conversations": []}\n{oops\n')
        (tmp / "notes.txt").write_text("x")
        cases = [(tmp / "missing.parquet", 2), (tmp / "damaged.parquet", 3),
                 (tmp / "broken.json", 3), (tmp / "lines.jsonl", 3), (tmp / "notes.txt", 2)]
        for path, code in cases:
            r = subprocess.run([sys.executable, str(converter), str(path), "--out",
                                str(tmp / "out")], capture_output=True, text=True)
            named = path.name + (":2" if path.suffix == ".jsonl" else "")
            if r.returncode != code or named not in r.stderr or "Traceback" in r.stderr:
                failures.append(f"{path.name}: exit {r.returncode} (want {code}): {r.stderr}")
        # A LLaVA row whose "image" is neither a path nor a list of paths is skipped, counted.
        (tmp / "odd.json").write_text(json.dumps([
            {"image": 7, "conversations": [{"from": "human", "value": "q"},
                                           {"from": "gpt", "value": "a"}]},
            {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
        r = subprocess.run([sys.executable, str(converter), str(tmp / "odd.json"), "--out",
                            str(tmp / "odd")], capture_output=True, text=True)
        if r.returncode != 0 or json.loads(r.stdout)["skipped_samples"] != {"bad_image_field": 1}:
            failures.append(f"odd.json: {r.returncode} {r.stdout} {r.stderr}")
    for f in failures:
        print("FAIL:", f)
    return failures


def main():
    vlmtrain, root = sys.argv[1], Path(sys.argv[2])
    converter = root / "scripts" / "hf_to_shards.py"
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # Subset "alpha": a folder of two parquet files; subset "beta": one file, with a row
        # whose image has no bytes (skipped) .
        expected = {}
        alpha = rows("alpha", 7) + rows("alpha", 6, start=7)
        write_parquet(tmp / "in/alpha/train-00000.parquet", alpha[:7])
        write_parquet(tmp / "in/alpha/train-00001.parquet", alpha[7:])
        beta = rows("beta", 9)
        broken = dict(beta[5])
        broken["images"] = [{"bytes": None, "path": "nowhere.png"}]
        broken["texts"] = [{"user": "beta broken?", "assistant": "x", "source": "beta"}]
        beta.insert(5, broken)
        write_parquet(tmp / "in/beta.parquet", beta)
        for row in alpha + beta:
            expected[row["texts"][0]["user"]] = row

        args = [sys.executable, converter, tmp / "in/alpha", tmp / "in/beta.parquet",
                "--samples-per-shard", "4", "--seed", "11"]
        summary = json.loads(run(*args, "--out", tmp / "out").stdout)
        run(*args, "--out", tmp / "again")
        index = json.loads((tmp / "out/index.json").read_text())
        check(summary["samples"] == 22 and index["samples"] == 22, f"22 samples: {summary}")
        check(index["skipped_samples"] == {"image_without_bytes": 1}, f"skips: {index}")
        check(index["images_reencoded_to_png"] == 5, f"GIFs re-encoded: {index}")
        check(len(index["shards"]) == 6 and sum(s["samples"] for s in index["shards"]) == 22,
              "6 shards holding every sample")
        shards = sorted(p.name for p in (tmp / "out").glob("*.tar"))
        check(shards == [f"train-{i:06d}.tar" for i in range(6)], f"shard names {shards}")
        same = all(filecmp.cmp(tmp / "out" / n, tmp / "again" / n, shallow=False)
                   for n in shards + [n + ".idx" for n in shards])
        check(same, "the same inputs and seed give the same bytes")

        config = tmp / "config.yaml"
        config.write_text(
            "model: {preset: tiny, tokenizer: 'builtin:bytes'}\n"
            f"data:\n  train: [{{path: '{tmp / 'out'}', format: webdataset}}]\n"
            "  max_img_size: 128\n")
        order = []
        for n in range(22):
            got = json.loads(run(vlmtrain, "--config", config, "tokenize", "--render", n,
                                 "--json").stdout)
            question = got["turns"][0]["text"]
            row = expected.get(question)
            if row is None:
                check(False, f"sample {n}: unknown question {question!r}")
                continue
            order.append(question)
            check(got["turns"] == [{"role": "user", "text": question},
                                   {"role": "assistant",
                                    "text": row["texts"][0]["assistant"]}],
                  f"sample {n}: texts")
            images = [i["bytes"] for i in row["images"]]
            check(len(got["images"]) == len(images), f"sample {n}: image count")
            for k, (mine, theirs) in enumerate(zip(got["images"], images)):
                if theirs.startswith(b"GIF"):
                    with Image.open(io.BytesIO(theirs)) as gif:
                        check(mine["format"] == "PNG" and
                              (mine["width"], mine["height"]) == gif.size,
                              f"sample {n} image {k}: the GIF as PNG")
                else:
                    check(mine["bytes"] == len(theirs) and mine["fnv1a64"] == fnv1a64(theirs),
                          f"sample {n} image {k}: the parquet's bytes")
            check(f":{n:09d}" in got["where"], f"sample {n}: key in {got['where']}")
        for subset in ("alpha", "beta"):
            numbers = [int(q.split()[-1].rstrip("?")) for q in order if q.startswith(subset)
                       and "broken" not in q]
            check(numbers == sorted(numbers), f"{subset} keeps its order: {numbers}")
        check({q.split()[0] for q in order[:8]} == {"alpha", "beta"}, "the subsets interleave")

        # vlmtrain's own indexes of the same shards equal the converter's.
        (tmp / "copy").mkdir()
        for n in shards:
            shutil.copy(tmp / "out" / n, tmp / "copy" / n)
        config.write_text(config.read_text().replace(str(tmp / "out"), str(tmp / "copy")))
        run(vlmtrain, "--config", config, "tokenize", "--render", 0, "--json")
        for n in shards:
            check(filecmp.cmp(tmp / "out" / (n + ".idx"), tmp / "copy" / (n + ".idx"),
                              shallow=False), f"{n}.idx as vlmtrain builds it")

    failures += check_llava(vlmtrain, converter)
    failures += check_bad_inputs(converter)
    print("hf_to_shards_check:", "FAILED" if failures else "passed",
          f"({len(failures)} failures)" if failures else "")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

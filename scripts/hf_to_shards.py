#!/usr/bin/env python3
"""Converts Hugging Face vision-language datasets into WebDataset tar shards that vlmtrain reads
in place (`data.train: [{path: OUT, format: webdataset}]`, docs/data.md).

Inputs, one subset each:
  * the_cauldron / FineVision-style parquet: a .parquet file or a folder of them (read in name
    order), with `images` (a list of {bytes, path} structs, or of bytes) and `texts` (a list of
    {user, assistant}); every other column (FineVision's `source` and ratings) is kept in the
    sample's JSON, so that filters can use it;
  * LLaVA: a JSON file (a list of {"image", "conversations"}) or JSONL file, its images read
    from --llava-images DIR (default: the JSON's folder).

Output, in OUT: NAME-000000.tar, NAME-000001.tar, ... (NAME from --name), each with its offset
index NAME-NNNNNN.tar.idx (Megatron-Energon's layout: N + 1 little-endian uint64), and
index.json (the shards, their sample counts and the subsets they came from, the counts of
images kept, re-encoded and skipped). Sample K is `K.json` plus its images `K.0.jpg`,
`K.1.png`, ...; the JSON lists them by what follows the key ("0.jpg").

Streaming: parquet is read one row batch at a time and shards are written as they fill, so
memory holds one batch, never the dataset (a LLaVA JSON list is read whole: it is text). With
several subsets, samples are interleaved in a seeded random order that keeps each subset's own
order (each next sample comes from a subset drawn with probability proportional to the samples
it has left, as nanoVLM's FineVision_concat_shuffled mixes subsets): the same inputs and seed
give the same shards, byte for byte.

Images keep their bytes when they are JPEG, PNG or WebP (the format read from the bytes, not
the name); anything else (GIF, BMP, TIFF, ...) is re-encoded to PNG with Pillow and counted. A
sample whose image cannot be used (no bytes, or an unknown format without Pillow, or one
Pillow cannot read) is skipped and counted with its reason.

Needs pyarrow for parquet (pip install pyarrow); Pillow only to re-encode other formats.

Exit codes, as vlmtrain's: 0 done; 2 a bad command line or an input that is not there or not a
dataset of these kinds; 3 an input that cannot be read (a damaged parquet file, malformed JSON),
named with the error. Shards written before such an error stay, with their indexes.

Usage:
  hf_to_shards.py INPUT... --out DIR [--samples-per-shard N] [--seed S] [--name NAME]
                  [--llava-images DIR]
"""
import argparse
import io
import json
import os
import random
import sys
import tarfile
from pathlib import Path

KEEP_FORMATS = {"jpg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}


def image_extension(data):
    """'jpg', 'png' or 'webp' from the bytes' signature; None for anything else."""
    for extension, signature in KEEP_FORMATS.items():
        if data.startswith(signature):
            return extension
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


class InputError(Exception):
    """An input that cannot be converted: (message, exit code)."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class SkipSample(Exception):
    """A sample that cannot be converted; its message is the reason counted."""


class Counts:
    def __init__(self):
        self.samples = 0
        self.images_kept = 0
        self.images_reencoded = 0
        self.skipped = {}

    def skip(self, reason):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def reencode_to_png(data, counts):
    try:
        from PIL import Image
    except ImportError:
        raise SkipSample("image_format_needs_pillow")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            out = io.BytesIO()
            image.convert("RGBA" if "A" in image.getbands() else "RGB").save(out, "PNG")
    except Exception:  # Pillow raises many kinds for undecodable data
        raise SkipSample("undecodable_image")
    counts.images_reencoded += 1
    return out.getvalue()


def usable_image(data, counts):
    """(extension, bytes) of an image kept as it is, or re-encoded to PNG."""
    if not data:
        raise SkipSample("image_without_bytes")
    extension = image_extension(data)
    if extension is not None:
        counts.images_kept += 1
        return extension, data
    return "png", reencode_to_png(data, counts)


# --- inputs: each yields (json_object, [image bytes]) per sample, and knows its size ---------


class ParquetSubset:
    def __init__(self, path, batch_rows=64):
        try:
            import pyarrow.parquet as pq  # needed only for parquet inputs
        except ImportError:
            raise InputError("parquet inputs need pyarrow: pip install pyarrow", 2)

        path = Path(path)
        if not path.exists():
            raise InputError(f"{path}: no such file or folder", 2)
        self.name = path.stem if path.is_file() else path.name
        self.files = [path] if path.is_file() else sorted(path.glob("*.parquet"))
        if not self.files:
            raise InputError(f"{path}: no .parquet file", 2)
        self.folder = path.parent if path.is_file() else path
        self.batch_rows = batch_rows
        self.size = 0
        for f in self.files:
            try:
                self.size += pq.ParquetFile(f).metadata.num_rows
            except Exception as e:  # pyarrow's errors have no common base beyond these
                raise InputError(f"{f}: not a readable parquet file: {e}", 3)

    def image_bytes(self, image):
        if image is None:
            return None
        if isinstance(image, (bytes, bytearray)):
            return bytes(image)
        if isinstance(image, dict):
            if image.get("bytes"):
                return bytes(image["bytes"])
            if image.get("path") and (self.folder / image["path"]).is_file():
                return (self.folder / image["path"]).read_bytes()
        return None

    def _rows(self, pq, file):
        try:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=self.batch_rows):
                yield from batch.to_pylist()
        except (OSError, ValueError) as e:  # ArrowInvalid and ArrowIOError among them
            raise InputError(f"{file}: cannot read a row batch: {e}", 3)

    def samples(self):
        import pyarrow.parquet as pq

        for file in self.files:
            for row in self._rows(pq, file):
                texts = row.pop("texts", None)
                images = row.pop("images", None) or []
                if not isinstance(texts, list) or not texts:
                    yield SkipSample("no_texts"), None
                    continue
                if not isinstance(images, list):
                    yield SkipSample("bad_image_field"), None
                    continue
                record = {"texts": [dict(jsonable(t), user=t.get("user") or "",
                                         assistant=t.get("assistant") or "")
                                    for t in texts if isinstance(t, dict)]}
                record.update(jsonable(row))
                yield record, [self.image_bytes(i) for i in images]


class LlavaSubset:
    def __init__(self, path, images_dir):
        path = Path(path)
        self.name = path.stem
        self.images_dir = Path(images_dir) if images_dir else path.parent
        if not path.is_file():
            raise InputError(f"{path}: no such file", 2)
        try:
            with open(path, encoding="utf-8") as f:
                if path.suffix == ".jsonl":
                    self.rows = []
                    for number, line in enumerate(f, 1):
                        if line.strip():
                            try:
                                self.rows.append(json.loads(line))
                            except ValueError as e:
                                raise InputError(f"{path}:{number}: not JSON: {e}", 3)
                else:
                    self.rows = json.load(f)
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: cannot read: {e}", 3)
        except ValueError as e:
            raise InputError(f"{path}: not JSON: {e}", 3)
        if not isinstance(self.rows, list):
            raise InputError(f"{path}: a LLaVA file is a JSON list of samples", 3)
        self.size = len(self.rows)

    def samples(self):
        for row in self.rows:
            if not isinstance(row, dict) or not isinstance(row.get("conversations"), list):
                yield SkipSample("no_conversations"), None
                continue
            image = row.get("image")
            names = [] if image is None else [image] if isinstance(image, str) else image
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                yield SkipSample("bad_image_field"), None
                continue
            images = []
            for name in names:
                file = self.images_dir / str(name)
                try:
                    images.append(file.read_bytes() if file.is_file() else None)
                except OSError:
                    images.append(None)
            record = {k: v for k, v in row.items() if k != "image"}
            yield record, images


def jsonable(value):
    """Parquet values as JSON: bytes dropped (images live in members), the rest as is."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items() if not isinstance(v, (bytes, bytearray))}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return None
    return value


def open_input(path, llava_images):
    p = Path(path)
    if p.suffix in (".json", ".jsonl"):
        return LlavaSubset(p, llava_images)
    if p.suffix == ".parquet" or p.is_dir():
        return ParquetSubset(p)
    raise InputError(f"{path}: neither a .parquet file, a folder of them, nor a LLaVA "
                     ".json/.jsonl file", 2)


def interleave(subsets, seed):
    """(subset, item) in a seeded random order that keeps each subset's order: the next item
    comes from a subset drawn with probability proportional to what it has left."""
    rng = random.Random(seed)
    iterators = [s.samples() for s in subsets]
    left = [s.size for s in subsets]
    while sum(left) > 0:
        pick = rng.choices(range(len(subsets)), weights=left)[0]
        left[pick] -= 1
        item = next(iterators[pick], None)
        if item is None:  # fewer rows than the metadata said
            left[pick] = 0
            continue
        yield subsets[pick], item


# --- output ---------------------------------------------------------------------------------


class ShardWriter:
    def __init__(self, out, name, per_shard):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.per_shard = per_shard
        self.tar = None
        self.starts = []
        self.shards = []

    def _member(self, name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 0
        info.mode = 0o644
        info.uname = info.gname = ""
        self.tar.addfile(info, io.BytesIO(data))

    def add(self, key, record, images, subset):
        if self.tar is None:
            path = self.out / f"{self.name}-{len(self.shards):06d}.tar"
            self.tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)
            self.starts = []
            self.shards.append({"name": path.name, "samples": 0, "subsets": {}})
        self.starts.append(self.tar.offset)
        self._member(f"{key}.json", json.dumps(record, ensure_ascii=False).encode("utf-8"))
        for k, (extension, data) in enumerate(images):
            self._member(f"{key}.{k}.{extension}", data)
        shard = self.shards[-1]
        shard["samples"] += 1
        shard["subsets"][subset] = shard["subsets"].get(subset, 0) + 1
        if shard["samples"] == self.per_shard:
            self.close_shard()

    def close_shard(self):
        if self.tar is None:
            return
        end = self.tar.offset  # where the end-of-archive records start
        path = Path(self.tar.name)
        self.tar.close()
        offsets = self.starts + [end]
        # Written after the shard, so it is not older than the shard (vlmtrain rebuilds those).
        (path.parent / (path.name + ".idx")).write_bytes(
            b"".join(o.to_bytes(8, "little") for o in offsets))
        self.tar = None


def convert(inputs, out, per_shard, seed, name, llava_images):
    subsets = [open_input(p, llava_images) for p in inputs]
    names = [s.name for s in subsets]
    if len(set(names)) != len(names):
        raise InputError(f"two inputs have one subset name ({names}); rename a folder", 2)
    writer = ShardWriter(out, name, per_shard)
    counts = Counts()
    for subset, (record, images) in interleave(subsets, seed):
        if isinstance(record, SkipSample):
            counts.skip(str(record))
            continue
        try:
            usable = [usable_image(i, counts) for i in images]
        except SkipSample as reason:
            counts.skip(str(reason))
            continue
        if "texts" in record:  # the_cauldron style: the members, by what follows the key
            record = {"images": [f"{k}.{e}" for k, (e, _) in enumerate(usable)], **record}
        elif usable:  # LLaVA style
            listed = [f"{k}.{e}" for k, (e, _) in enumerate(usable)]
            record = {"image": listed[0] if len(listed) == 1 else listed, **record}
        writer.add(f"{counts.samples:09d}", record, usable, subset.name)
        counts.samples += 1
    writer.close_shard()
    index = {
        "format": "webdataset",
        "samples": counts.samples,
        "seed": seed,
        "subsets": {s.name: s.size for s in subsets},
        "images_kept": counts.images_kept,
        "images_reencoded_to_png": counts.images_reencoded,
        "skipped_samples": counts.skipped,
        "shards": writer.shards,
    }
    (Path(out) / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", metavar="INPUT")
    parser.add_argument("--out", required=True, help="folder for the shards")
    parser.add_argument("--samples-per-shard", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="the subsets' interleave")
    parser.add_argument("--name", default="train", help="shard names: NAME-000000.tar")
    parser.add_argument("--llava-images", help="the images folder of LLaVA inputs")
    args = parser.parse_args()
    if args.samples_per_shard < 1:
        parser.error("--samples-per-shard must be at least 1")
    try:
        index = convert(args.inputs, args.out, args.samples_per_shard, args.seed, args.name,
                        args.llava_images)
    except InputError as e:
        print(f"hf_to_shards: {e}", file=sys.stderr)
        return e.code
    except OSError as e:  # the output: a folder that cannot be written, a full disk
        print(f"hf_to_shards: cannot write the shards: {e}", file=sys.stderr)
        return 3
    summary = {k: v for k, v in index.items() if k != "shards"}
    summary["shards"] = len(index["shards"])
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

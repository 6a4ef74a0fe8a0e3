#!/usr/bin/env python3
"""Reads a run's TensorBoard event file back with the `tensorboard` package and checks that
every scalar of its metrics.jsonl is there, at the same step, with the same value (as the 32-bit
float an event stores), and nothing else: docs/report.md. Exit 0 when they match, 1 otherwise.

Usage: tensorboard_readback.py RUN_DIR
"""
import json
import math
import struct
import sys
from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator


def as_float32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def metrics_scalars(run_dir):
    """{tag: {step: value}} of the numeric keys of the step and eval records (the last record
    of a step wins, as the report reads them)."""
    scalars = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") not in ("step", "eval"):
            continue
        for key, value in record.items():
            if key in ("type", "step", "time") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                scalars.setdefault(key, {})[record["step"]] = as_float32(float(value))
    return scalars


def main():
    run_dir = Path(sys.argv[1])
    files = sorted(run_dir.glob("events.out.tfevents.*.vlmtrain"))
    if len(files) != 1:
        print(f"expected one event file in {run_dir}, found {len(files)}")
        return 1
    accumulator = event_accumulator.EventAccumulator(
        str(files[0]), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    read = {tag: {e.step: e.value for e in accumulator.Scalars(tag)}
            for tag in accumulator.Tags()["scalars"]}
    want = metrics_scalars(run_dir)
    problems = []
    for tag in sorted(set(want) | set(read)):
        if tag not in read:
            problems.append(f"{tag}: in metrics.jsonl, not in the event file")
            continue
        if tag not in want:
            problems.append(f"{tag}: in the event file, not in metrics.jsonl")
            continue
        if set(read[tag]) != set(want[tag]):
            problems.append(f"{tag}: steps {sorted(read[tag])} != {sorted(want[tag])}")
            continue
        for step, value in want[tag].items():
            got = read[tag][step]
            if not (got == value or (math.isnan(got) and math.isnan(value))):
                problems.append(f"{tag} at step {step}: {got} != {value}")
    points = sum(len(v) for v in want.values())
    if problems:
        print("\n".join(problems[:20]))
        return 1
    print(f"tensorboard: {len(want)} tags, {points} scalars, every one read back equal "
          f"({files[0].name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The micro-batch shapes of recorded CUDA memory traces (docs/memory-trace.md), for the CUDA
step replay's test (tests/memory/test_cuda_step.cpp): per step, per micro-batch, the tokens N,
attention segments S, supervised tokens L and crops n, read from the requests every micro-step
makes (the code path of bench/gpu/2026-11-28-h100):

- N: the first request of a micro-step, input_ids as int32 (N * 4 bytes; the prologue is nine
  requests: three int32 copies and their int64 conversions, the image-token index n*Ti*8, the
  supervised positions L*8, the crops n*3*I*I*4);
- S: the varlen backward's softmax_d, Hq * (N + 128 S) * 4 bytes.

Where the decoder's attention is not the varlen kernel (fp32: the grouped path), the trace does
not give the segments: `--plan VLMTRAIN DATA` asks the planner for them (`vlmtrain
inspect-batches --list` with the run's overrides on DATA, the demo dataset the run trained on:
`vlmtrain make-demo-data --out DATA`), checks that its micro-batches have the trace's tokens,
crops and supervised tokens, and adds each one's `segment_lengths` (row by row, each row's
samples then its padding).

Usage: trace_shapes.py [--plan VLMTRAIN DATA] DIR... > micro_batches.json (each DIR's
report.json names the presets).
"""
import json
import lzma
import os
import subprocess
import sys

PRESETS = {  # lib/spec/presets.cpp: crop side, patch, pixel shuffle, decoder query heads
    "tiny": (64, 8, 2, 4),
    "nanovlm-222m": (224, 16, 2, 9),
    "nanovlm-460m": (512, 16, 4, 15),
}


def steps_of(path):
    contexts, steps = {}, []
    with lzma.open(path, "rt") as f:
        for line in f:
            if line.startswith("#"):
                continue
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "X":
                cid, _, text = rest.partition(" ")
                contexts[cid] = text
            elif kind == "S":
                steps.append({"step": int(rest.split()[0]), "allocs": []})
            elif kind == "A":
                b, _addr, _stream, ctx = rest.split()
                steps[-1]["allocs"].append((int(b), contexts.get(ctx, "")))
    return steps


def shapes(path, preset):
    img, patch, shuffle, heads = PRESETS[preset]
    tokens_per_crop = (img // patch) ** 2 // shuffle ** 2
    out = []
    for step in steps_of(path):
        allocs = step["allocs"]
        prologue = "vlm::step;aten::to;aten::_to_copy;aten::empty_strided"
        starts = [i for i in range(len(allocs) - 8)
                  if all(allocs[i + k][1] == prologue for k in range(9))
                  and allocs[i + 1][0] == 2 * allocs[i][0]
                  and allocs[i + 8][0] % (3 * img * img * 4) == 0]
        micro = []
        for k, s0 in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(allocs)
            n_tokens = allocs[s0][0] // 4
            crops = allocs[s0 + 6][0] // (tokens_per_crop * 8)
            supervised = allocs[s0 + 7][0] // 8
            segments = None
            for s in range(1, 100000):
                want = heads * (n_tokens + 128 * s) * 4
                if any(b == want and "VarlenFlash" in c for b, c in allocs[s0:end]):
                    segments = s
                    break
            micro.append({"tokens": n_tokens, "segments": segments, "supervised": supervised,
                          "crops": crops})
        out.append({"step": step["step"], "micro_batches": micro})
    return out


# The auto_batch check's traced run (scripts/gpucheck/filling.py) under the name its trace has in
# memory-traces.tar, and the overrides of that run that the replay reads, for reports written
# before the check recorded them (commit daf81bd).
AUTO_TRACED = "460m-bf16-auto-h100"
AUTO_OVERRIDES = ["model.preset=nanovlm-460m", "train.precision=bf16", "train.batch_size=auto",
                  "train.gradient_accumulation_steps=1",
                  "train.global_batch_size=16", "memory.simulate_device_bytes=81559MiB"]


def traced_runs(report):
    """(name, overrides) of every traced run of a gpu-check report."""
    checks = report["checks"]
    for name, run in checks.get("record", {}).get("runs", {}).items():
        yield name, run["overrides"]
    auto = checks.get("auto_batch", {}).get("h100-80gb")
    if auto:
        yield AUTO_TRACED, auto.get("overrides", AUTO_OVERRIDES)


def planned_segments(vlmtrain, data, overrides, steps):
    """Per step, per micro-batch: (tokens, crops, supervised, segment lengths) as planned."""
    config = "configs/demo.yaml" if "model.preset=tiny" in overrides else "configs/nanovlm.yaml"
    args = [vlmtrain, "inspect-batches", "--config", config, "--steps", str(steps),
            "--json", "--list", "--no-decode",
            "--set", f"data.train=[{{path: {os.path.abspath(data)}/train.jsonl}}]"]
    for o in overrides:
        args += ["--set", o]
    report = json.loads(subprocess.check_output(args, stderr=subprocess.DEVNULL))
    out = {}
    for m in report["micro_batch_list"]:
        if m["rank"] != 0:  # the traces are rank 0's
            continue
        row = m["row_length"]
        lengths = []
        for pack in m["sample_tokens"]:
            lengths += pack
            if sum(pack) < row:
                lengths.append(row - sum(pack))
        out.setdefault(m["step"], []).append(
            (m["packs"] * row, m["crops"], m["supervised_tokens"], lengths, m["packs"]))
    return out


def add_planned_segments(steps, vlmtrain, data, overrides):
    planned = planned_segments(vlmtrain, data, overrides, len(steps))
    for k, step in enumerate(steps):
        if len(planned.get(k, [])) != len(step["micro_batches"]):
            raise SystemExit(f"the planner's step {k} has {len(planned.get(k, []))} micro-batches, "
                             f"the trace's {len(step['micro_batches'])} (step {step['step']})")
        for micro, plan in zip(step["micro_batches"], planned[k]):
            tokens, crops, supervised, lengths, rows = plan
            if (tokens, crops, supervised) != (micro["tokens"], micro["crops"],
                                               micro["supervised"]):
                raise SystemExit(f"the planner's micro-batch {plan[:3]} is not the trace's "
                                 f"{micro} (step {step['step']})")
            micro["segments"] = len(lengths)
            micro["rows"] = rows
            micro["segment_lengths"] = lengths


def main():
    result = {}
    argv = sys.argv[1:]
    plan = None
    if argv[:1] == ["--plan"]:
        plan, argv = argv[1:3], argv[3:]
    for folder in argv:
        report = json.load(open(os.path.join(folder, "report.json")))
        for name, overrides in traced_runs(report):
            path = os.path.join(folder, name + ".trace.xz")
            if not os.path.exists(path):
                continue
            preset = next(o.split("=", 1)[1] for o in overrides if o.startswith("model.preset="))
            steps = shapes(path, preset)
            if plan and any(m["segments"] is None for st in steps for m in st["micro_batches"]):
                add_planned_segments(steps, plan[0], plan[1], overrides)
            result[os.path.basename(os.path.normpath(folder)) + "/" + name] = {
                "overrides": [o for o in overrides
                              if o.startswith(("model.", "train.", "data.max_img_size", "packing.",
                                             "memory.simulate_device_bytes")) and
                              not o.startswith(("model.tokenizer", "model.vision_weights",
                                                "model.language_weights"))],
                "steps": steps}
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()

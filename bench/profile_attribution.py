#!/usr/bin/env python3
"""What launches a profiled step's kernels: a Chrome trace of `output.profile_steps`
(docs/profiling.md) reduced to one table per trainer phase.

    python3 bench/profile_attribution.py RUN_DIR/profile.rank0.json [--json OUT]

Each kernel, copy and memset is tied to the host op that launched it (the trace's
`External id`), and that op to the ops enclosing it on its thread; kernels are then counted by
the trainer's phase (`vlm::forward`, ...; the backward's nodes run on autograd's thread, under
`autograd::engine::evaluate_function: ...`) and by the outermost aten op that issued them (the
op the model's code called, e.g. `aten::linear`), with their device time. Launch-bound steps show
here as many kernels of little device time.

With --idle, where the device waited: every gap between the device work of the profiled steps
(kernels, copies and memsets, all streams merged), its time summed by the trainer phase the host
was in at the gap's middle ("between phases" inside a step: the trainer's own code) and by the
op that launched the work that ended it. Gaps in the backward ahead of small kernels mean the
autograd thread cannot launch as fast as the GPU runs them. Python's standard library only.
"""
import argparse
import bisect
import collections
import json
import lzma
import sys


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def attribute(events):
    # Host ops per thread, sorted by start, to find the ops enclosing a given one.
    ops_by_thread = collections.defaultdict(list)
    op_by_external = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "user_annotation"):
            continue
        ops_by_thread[e["tid"]].append(e)
        if e.get("cat") == "cpu_op" and "External id" in e.get("args", {}):
            op_by_external[e["args"]["External id"]] = e
    for ops in ops_by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
    starts = {tid: [e["ts"] for e in ops] for tid, ops in ops_by_thread.items()}

    def enclosing(op):
        """The ops of op's thread that contain it, outermost first (op included)."""
        ops, ts = ops_by_thread[op["tid"]], starts[op["tid"]]
        end = op["ts"] + op["dur"]
        chain = [o for o in ops[:bisect.bisect_right(ts, op["ts"])]
                 if o["ts"] <= op["ts"] and o["ts"] + o["dur"] >= end]
        return chain

    steps = sum(1 for e in events if e.get("name") == "vlm::step" and e.get("cat") in
                ("cpu_op", "user_annotation"))
    table = collections.defaultdict(lambda: [0, 0.0])  # (phase, op) -> [launches, device us]
    cache = {}
    for e in device_work(events):
        launcher = op_by_external.get(e.get("args", {}).get("External id"))
        key = ("(unattributed)", "(unattributed)")
        if launcher is not None:
            key = cache.get(id(launcher))
            if key is None:
                chain = [o["name"] for o in enclosing(launcher)]
                phase = next((n for n in chain if n.startswith("vlm::") and n != "vlm::step"),
                             None)
                if phase is None:
                    phase = ("vlm::backward (autograd thread)"
                             if any(n.startswith("autograd::engine") for n in chain) else
                             "(outside the phases)")
                outer = next((n for n in chain if n.startswith("aten::")), chain[-1])
                node = next((n.split(": ", 1)[1] for n in chain
                             if n.startswith("autograd::engine::evaluate_function")), "")
                key = (phase, f"{node} > {outer}" if node else outer)
                cache[id(launcher)] = key
        e["_key"] = key
        row = table[key]
        row[0] += 1
        row[1] += e["dur"]
    return steps, table


def device_work(events):
    """The kernels, copies and memsets, by start time."""
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in
                   ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])


def idle(events):
    """{(phase at the gap, what ended it): [gaps, idle us]} over the profiled steps, after
    attribute() has tagged the device work; and the steps' total idle us."""
    marks = sorted((e for e in events if e.get("cat") == "user_annotation" and
                    e.get("name", "").startswith("vlm::")), key=lambda e: e["ts"])
    steps = [m for m in marks if m["name"] == "vlm::step"]
    phases = [m for m in marks if m["name"] != "vlm::step"]

    def phase_at(ts):
        for m in phases:
            if m["ts"] <= ts <= m["ts"] + m["dur"]:
                return m["name"]
        inside = any(m["ts"] <= ts <= m["ts"] + m["dur"] for m in steps)
        return "(step, between phases)" if inside else "(between steps)"

    table = collections.defaultdict(lambda: [0, 0.0])
    total, busy_until = 0.0, None
    first = steps[0]["ts"] if steps else 0
    for e in device_work(events):
        if e["ts"] < first:
            continue
        if busy_until is not None and e["ts"] > busy_until:
            gap = e["ts"] - busy_until
            key = (phase_at(busy_until + gap / 2), e.get("_key", ("", "(unattributed)"))[1])
            table[key][0] += 1
            table[key][1] += gap
            total += gap
        busy_until = max(busy_until or 0, e["ts"] + e["dur"])
    return total, table


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--json", help="write the table as JSON")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--idle", action="store_true", help="also where the device waited")
    a = p.parse_args()
    events = load(a.trace)
    steps, table = attribute(events)
    per = max(steps, 1)
    rows = sorted(((k[0], k[1], n / per, us / per / 1000) for k, (n, us) in table.items()),
                  key=lambda r: -r[2])
    phases = collections.defaultdict(lambda: [0.0, 0.0])
    for phase, _, n, ms in rows:
        phases[phase][0] += n
        phases[phase][1] += ms
    print(f"{steps} steps; per step:")
    for phase, (n, ms) in sorted(phases.items(), key=lambda x: -x[1][0]):
        print(f"  {phase:40s} {n:8.0f} launches {ms:9.2f} ms on the device")
    print(f"the {a.top} op groups with the most launches per step:")
    for phase, op, n, ms in rows[:a.top]:
        print(f"  {n:7.0f} {ms:8.2f} ms  {phase}: {op}")
    out = {"steps": steps,
           "phases": {k: {"launches_per_step": v[0], "device_ms_per_step": v[1]}
                      for k, v in phases.items()},
           "ops": [{"phase": ph, "op": op, "launches_per_step": n, "device_ms_per_step": ms}
                   for ph, op, n, ms in rows]}
    if a.idle:
        total, gaps = idle(events)
        by_phase = collections.defaultdict(float)
        for (phase, _), (_, us) in gaps.items():
            by_phase[phase] += us / per / 1000
        print(f"device idle per step: {total / per / 1000:.2f} ms; by phase:")
        for phase, ms in sorted(by_phase.items(), key=lambda x: -x[1]):
            print(f"  {phase:40s} {ms:9.2f} ms")
        ranked = sorted(gaps.items(), key=lambda x: -x[1][1])
        print(f"the {a.top} largest idle times per step, by what ended the wait:")
        for (phase, op), (n, us) in ranked[:a.top]:
            print(f"  {us / per / 1000:8.2f} ms {n / per:7.0f} gaps  {phase}: {op}")
        out["idle"] = {"device_idle_ms_per_step": total / per / 1000,
                       "phases": dict(by_phase),
                       "gaps": [{"phase": ph, "ended_by": op, "gaps_per_step": n / per,
                                 "idle_ms_per_step": us / per / 1000}
                                for (ph, op), (n, us) in ranked]}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

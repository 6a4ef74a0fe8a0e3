#!/usr/bin/env python3
"""What launches a profiled step's kernels: a Chrome trace of `output.profile_steps`
(docs/profiling.md) reduced to one table per trainer phase.

    python3 bench/profile_attribution.py RUN_DIR/profile.rank0.json [--json OUT]

Each kernel, copy and memset is tied to the host op that launched it (the trace's
`External id`), and that op to the ops enclosing it on its thread; kernels are then counted by
the trainer's phase (`vlm::forward`, ...; the backward's nodes run on autograd's thread, under
`autograd::engine::evaluate_function: ...`) and by the outermost aten op that issued them (the
op the model's code called, e.g. `aten::linear`), with their device time. Launch-bound steps show
here as many kernels of little device time. Python's standard library only.
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
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
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
        row = table[key]
        row[0] += 1
        row[1] += e["dur"]
    return steps, table


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--json", help="write the table as JSON")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    steps, table = attribute(load(a.trace))
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
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": steps,
                       "phases": {k: {"launches_per_step": v[0], "device_ms_per_step": v[1]}
                                  for k, v in phases.items()},
                       "ops": [{"phase": ph, "op": op, "launches_per_step": n,
                                "device_ms_per_step": ms} for ph, op, n, ms in rows]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

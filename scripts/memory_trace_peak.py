#!/usr/bin/env python3
"""What a step's memory peak is made of: a CPU memory trace (docs/memory-trace.md) read back,
the live bytes after every event, and the events around the highest moment of a phase, each
with the op stack that made it.

    scripts/memory_trace_peak.py TRACE [--step N] [--phase vlm::backward] [--before 40]
                                       [--after 8] [--depth 2]

TRACE is a run's `memory-trace.rankR.txt` (`output.memory_trace_steps`) or a probe's
(`VLM_PROBE_TRACE_DIR=DIR` with the memory_accuracy tests: DIR/probe-SEED-CONFIG-STEP.txt, one
step each). Live bytes are printed above the live bytes before the phase's first event, the
figure memory::step_peaks predicts for that phase; where a prediction misses, the op that
allocated what the replay did not count is among the lines printed (docs/memory.md).
Exit 2 for a file that cannot be read or holds no such step or phase.
"""

import argparse
import sys


def read_events(path, step):
    """The step's allocations and frees: (kind, bytes, live, address, op stack)."""
    contexts, events, live, inside, found = {}, [], 0, False, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            kind = fields[0]
            if kind == "X":
                contexts[fields[1]] = line.split(" ", 2)[2].strip() if len(fields) > 2 else ""
            elif kind == "S":
                inside = int(fields[1]) == step
                found = found or inside
                live = int(fields[2])
            elif kind == "E":
                inside = False
            elif inside and kind in ("A", "F"):
                size = int(fields[1])
                live += size if kind == "A" else -size
                stack = contexts.get(fields[4], "?").split(";")
                events.append((kind, size, live, fields[2], stack))
    if not found:
        raise ValueError(f"{path} has no step {step}")
    return events


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("trace")
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--phase", default="vlm::backward",
                        help="an op-stack entry that marks the phase (vlm::forward, "
                             "vlm::backward, vlm::optimizer)")
    parser.add_argument("--before", type=int, default=40, help="events shown before the peak")
    parser.add_argument("--after", type=int, default=8, help="events shown after the peak")
    parser.add_argument("--depth", type=int, default=2, help="innermost op-stack entries shown")
    args = parser.parse_args()
    try:
        events = read_events(args.trace, args.step)
    except (OSError, ValueError, IndexError) as error:
        print(f"memory_trace_peak: {error}", file=sys.stderr)
        return 2
    inside = [i for i, e in enumerate(events) if args.phase in e[4]]
    if not inside:
        print(f"memory_trace_peak: no event of step {args.step} is inside {args.phase}",
              file=sys.stderr)
        return 2
    first, last = inside[0], inside[-1]
    base = events[first - 1][2] if first > 0 else events[first][2] - (
        events[first][1] if events[first][0] == "A" else -events[first][1])
    peak = max(range(first, last + 1), key=lambda i: events[i][2])
    print(f"{args.phase}: peak {events[peak][2] - base} bytes above {base} "
          f"(event {peak - first + 1} of {last - first + 1})")
    for i in range(max(first, peak - args.before), min(last + 1, peak + args.after + 1)):
        kind, size, live, address, stack = events[i]
        ops = " ; ".join(s.replace("autograd::engine::evaluate_function: ", "")
                         for s in stack[-args.depth:])
        print(f"{'*' if i == peak else ' '}{kind} {size:>12} {live - base:>12} {address[-6:]} {ops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

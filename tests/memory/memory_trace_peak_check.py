#!/usr/bin/env python3
"""scripts/memory_trace_peak.py against a trace written here: the peak of a phase above the
live bytes before it, the events around it with their ops, and exit 2 (one line, no
traceback) for a missing file, a missing step or phase, and a malformed trace."""

import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(sys.argv[1], "scripts", "memory_trace_peak.py")

TRACE = """# vlmtrain memory trace 1 (docs/memory-trace.md)
# probe
S 1 1000 1000
X 0 vlm::step;vlm::forward;aten::mm
X 1 vlm::step;vlm::backward;autograd::engine::evaluate_function: MmBackward0;aten::mm
X 2 vlm::step;vlm::backward
A 100 0x10 0 0
A 400 0x20 0 1
A 50 0x30 0 1
F 400 0x20 0 2
A 10 0x40 0 1
E 1 1560 1560 1160 1160
"""


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          check=False)


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "trace.txt")
        with open(good, "w", encoding="utf-8") as f:
            f.write(TRACE)
        r = run(good, "--phase", "vlm::backward")
        check(r.returncode == 0, f"backward: exit {r.returncode} {r.stderr}")
        # Before the backward 1100 are live; its peak is +450 (400 and 50), at its 2nd event.
        check("peak 450 bytes above 1100 (event 2 of 4)" in r.stdout, f"backward: {r.stdout}")
        marked = [line.split() for line in r.stdout.splitlines() if line.startswith("*")]
        check(marked[:1] == [["*A", "50", "450", "0x30", "MmBackward0", ";", "aten::mm"]],
              f"backward rows: {r.stdout}")
        r = run(good, "--phase", "vlm::forward")
        check(r.returncode == 0 and "peak 100 bytes above 1000" in r.stdout,
              f"forward: {r.stdout} {r.stderr}")
        bad = os.path.join(d, "bad.txt")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("S 1 x 0\n")
        for args, what in (([os.path.join(d, "none.txt")], "missing file"),
                           ([good, "--step", "7"], "missing step"),
                           ([good, "--phase", "vlm::optimizer"], "missing phase"),
                           ([bad], "malformed trace")):
            r = run(*args)
            check(r.returncode == 2 and "Traceback" not in r.stderr and
                  r.stderr.startswith("memory_trace_peak: "), f"{what}: {r.returncode} {r.stderr}")
    for f in failures:
        print("FAILED:", f)
    print("memory_trace_peak_check:", "ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

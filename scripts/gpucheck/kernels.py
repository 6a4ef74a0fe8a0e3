"""The ViT's kernels one by one (bench/vit_kernels.py) at the 460M preset's shapes: what each
kernel-level change of issue 30 would buy, measured before it is built."""
import json
import os
import subprocess
import sys

from gpucheck.common import ROOT, CheckFailed


def check_vit_kernels(device, artifacts):
    """Runs bench/vit_kernels.py with this Python's torch; on the CPU a small smoke run of the
    script (not a measurement). The figures go into the report and, in the recording mode, into
    ARTIFACTS/vit-kernels.json."""
    args = [sys.executable, os.path.join(ROOT, "bench", "vit_kernels.py"), "--device", device]
    if device != "cuda":
        args += ["--crops", "1", "--patches", "64", "--iters", "1"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise CheckFailed("bench/vit_kernels.py exited " + str(run.returncode) + ": " +
                          run.stderr.strip()[-500:])
    figures = json.loads(run.stdout)
    if artifacts:
        with open(os.path.join(artifacts, "vit-kernels.json"), "w") as f:
            json.dump(figures, f, indent=1)
    return figures

"""The ViT's kernels one by one, at the 460M preset's shapes (issue 30: what each kernel-level
change would buy before it is built). Times each candidate's forward and forward+backward with
CUDA events and prints one JSON object:

- attention: scaled_dot_product_attention under each backend (flash: what the trainer runs;
  cuDNN; memory-efficient), [crops, heads, patches, head_dim] in bf16;
- layer_norm: autocast's fp32 LayerNorm on the fp32 residual stream (what the trainer and
  nanoVLM run) against a bf16 stream with fp32 parameters;
- residual: the fp32 stream's add of a bf16 branch against a bf16 stream's;
- linear_gelu: fc1 then tanh-GELU as two kernels against cuBLASLt's GELU epilogue
  (at::_addmm_activation), forward;
- gemm: the block's four GEMMs forward, with their achieved TFLOP/s.

Usage: python3 bench/vit_kernels.py [--crops N] [--iters N] [--device cuda|cpu]
(`--device cpu --crops 1 --iters 1` is a smoke test of the script, not a measurement.)
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def timed(fn, iters, device):
    """Median milliseconds of fn() over iters calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return round(times[len(times) // 2], 4)


def attention(args, dev):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    n, h, p, hd = args.crops, args.heads, args.patches, args.hidden // args.heads
    q, k, v = (torch.randn(n, h, p, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(n, h, p, hd, device=dev, dtype=torch.bfloat16)
    flops = 4.0 * n * h * p * p * hd  # forward; the backward counts 2.5x
    out = {}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    for name, backend in backends.items():
        if dev == "cuda" and name == "math":
            continue
        try:
            with sdpa_kernel([backend]):
                fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v), args.iters, dev)
                both = timed(lambda: torch.autograd.grad(
                    F.scaled_dot_product_attention(q, k, v), (q, k, v), grad), args.iters, dev)
            out[name] = {"forward_ms": fwd, "forward_backward_ms": both,
                         "forward_tflops": round(flops / fwd / 1e9, 1),
                         "forward_backward_tflops": round(3.5 * flops / both / 1e9, 1)}
        except RuntimeError as e:  # a backend the GPU or the build does not offer
            out[name] = {"error": str(e).splitlines()[0][:200]}
    return out


def layer_norm(args, dev):
    rows, d = args.crops * args.patches, args.hidden
    w = torch.ones(d, device=dev)
    b = torch.zeros(d, device=dev)
    out = {}
    for name, dtype in (("fp32_stream", torch.float32), ("bf16_stream", torch.bfloat16)):
        x = torch.randn(rows, d, device=dev, dtype=dtype, requires_grad=True)
        g = torch.randn(rows, d, device=dev, dtype=dtype)
        # autocast runs layer_norm in fp32 (its fp32 list) on the fp32 stream; a bf16 stream
        # asks for it directly, its parameters held in the stream's type (no cast per call).
        wd = w.detach().to(dtype).requires_grad_()
        bd = b.detach().to(dtype).requires_grad_()
        fn = lambda: F.layer_norm(x, (d,), wd, bd)
        out[name] = {"forward_ms": timed(fn, args.iters, dev),
                     "forward_backward_ms": timed(
                         lambda: torch.autograd.grad(fn(), (x, wd, bd), g), args.iters, dev)}
    return out


def residual(args, dev):
    rows, d = args.crops * args.patches, args.hidden
    branch = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
    out = {}
    for name, dtype in (("fp32_stream", torch.float32), ("bf16_stream", torch.bfloat16)):
        x = torch.randn(rows, d, device=dev, dtype=dtype)
        out[name] = {"add_ms": timed(lambda: x + branch, args.iters, dev)}
    return out


def linear_gelu(args, dev):
    rows, d, m = args.crops * args.patches, args.hidden, args.mlp
    x = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
    w = torch.randn(m, d, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(m, device=dev, dtype=torch.bfloat16)
    out = {"separate_ms": timed(lambda: F.gelu(F.linear(x, w, bias), approximate="tanh"),
                                args.iters, dev)}
    try:
        out["epilogue_ms"] = timed(
            lambda: torch._addmm_activation(bias, x, w.t(), use_gelu=True), args.iters, dev)
    except RuntimeError as e:
        out["epilogue"] = {"error": str(e).splitlines()[0][:200]}
    return out


def gemm(args, dev):
    rows, d, m = args.crops * args.patches, args.hidden, args.mlp
    x = torch.randn(rows, max(d, m), device=dev, dtype=torch.bfloat16)
    out = {}
    for name, (i, o) in {"qkv": (d, 3 * d), "out": (d, d), "fc1": (d, m), "fc2": (m, d)}.items():
        w = torch.randn(o, i, device=dev, dtype=torch.bfloat16)
        bias = torch.randn(o, device=dev, dtype=torch.bfloat16)
        xi = x[:, :i].contiguous()
        ms = timed(lambda: F.linear(xi, w, bias), args.iters, dev)
        out[name] = {"ms": ms, "tflops": round(2.0 * rows * i * o / ms / 1e9, 1)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crops", type=int, default=60)  # one 4096-token row of the 460M preset
    ap.add_argument("--patches", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--mlp", type=int, default=3072)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = args.device
    report = {"torch": torch.__version__, "device": dev,
              "gpu": torch.cuda.get_device_name() if dev == "cuda" else None,
              "shapes": vars(args)}
    for name, fn in (("attention", attention), ("layer_norm", layer_norm),
                     ("residual", residual), ("linear_gelu", linear_gelu), ("gemm", gemm)):
        report[name] = fn(args, dev)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

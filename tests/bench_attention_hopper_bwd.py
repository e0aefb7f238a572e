"""Quick timing of the Hopper attention backward (H200): the issue's three shapes, fwd+bwd of the
packed op (what training runs) for tk (Hopper fwd + Hopper bwd), tk with the portable backward,
and SDPA's cuDNN and FA2 backends on the same (B, T, 3, H, D) views; plus each backward alone.

    python tests/bench_attention_hopper_bwd.py [--json out.json]

CUDA events, median of 20 calls after 5 warm-ups, FLOPs as issue 5 counts them (causal forward
4·B·H·T²·D/2, fwd+bwd 3.5x, bwd alone 2.5x). Not a pytest file (no timing in tests); bench.py
--ops attention is the full table (graph replay, rotating inputs).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = {"gpt2": (16, 12, 1024, 64), "shakespeare-char": (64, 6, 256, 64), "t4096-d128": (4, 16, 4096, 128)}


def median_ms(fn, reps=20, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--only", default="", help="time only the step with this label")
    args = ap.parse_args()
    import kernels
    from kernels import attention_hopper as AH, attention_op as A
    kernels.configure("auto", attention="tk")
    results = {}
    for name in args.shapes.split(","):
        B, H, T, D = SHAPES[name]
        fwd_flops = 4 * B * H * T * T * D / 2
        qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.detach().permute(2, 0, 3, 1, 4).unbind(0)
        scale = 1 / math.sqrt(D)

        def tk(backend):
            def step():
                old = A.set_backend(backend)
                try:
                    y = A.attention_qkv(qkv)
                finally:
                    A.set_backend(old)
                torch.autograd.grad(y, qkv, dy)
            return step

        def sdpa(backend):
            def step():
                qq, kk, vv = qkv.permute(2, 0, 3, 1, 4).unbind(0)
                with sdpa_kernel(backend):
                    y = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
                torch.autograd.grad(y, qkv, dy.transpose(1, 2))
            return step

        o, lse = AH.forward(q, k, v, True, scale)
        d_o = dy.transpose(1, 2)
        dqkv = torch.empty_like(qkv)
        out = tuple(dqkv.permute(2, 0, 3, 1, 4).unbind(0))
        row = {}

        def hopper_fwd_portable_bwd():
            y, _ = A._AttentionQKVEager.apply(qkv, True, scale, "hopper", "portable")
            torch.autograd.grad(y, qkv, dy.transpose(1, 2))
        steps = {"tk (hopper fwd+bwd)": (tk("hopper"), 3.5),
                 "tk (hopper fwd, portable bwd)": (hopper_fwd_portable_bwd, 3.5),
                 "sdpa-cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), 3.5),
                 "sdpa-flash": (sdpa(SDPBackend.FLASH_ATTENTION), 3.5),
                 "hopper bwd alone (default)": (lambda: AH.backward(d_o, q, k, v, o, lse, True, scale, out=out), 2.5),
                 "hopper bwd alone, variant 1": (lambda: AH.backward(d_o, q, k, v, o, lse, True, scale, out=out,
                                                                     variant=1), 2.5),
                 "hopper bwd alone, variant 3": (lambda: AH.backward(d_o, q, k, v, o, lse, True, scale, out=out,
                                                                     variant=3), 2.5),
                 "portable bwd alone": (lambda: A._portable_backward(d_o, q, k, v, o, lse, True, scale, out=out), 2.5)}
        for label, (fn, mult) in steps.items():
            if args.only and label != args.only:
                continue
            try:
                ms = median_ms(fn)
                row[label] = {"ms": ms, "tflops": fwd_flops * mult / ms / 1e9}
                print(f"{name:17s} {label:32s} {ms:8.3f} ms {row[label]['tflops']:7.1f} TFLOP/s", flush=True)
            except Exception as e:
                print(f"{name:17s} {label:32s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        if "sdpa-cudnn" in row and "tk (hopper fwd+bwd)" in row:
            print(f"{name:17s} tk / cudnn fwd+bwd = {row['tk (hopper fwd+bwd)']['tflops'] / row['sdpa-cudnn']['tflops']:.2f}x")
        results[name] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""Attention benchmark: tk portable kernel vs torch SDPA's FA2, cuDNN and memory-efficient backends,
in one run (absolute figures drift between runs; compare within a run). Not a test: run it as
`python tests/bench_attention.py` on a GPU. (A stand-in until bench.py has an op registry.)

FLOPs (anchors.md): forward 4*B*H*T^2*D, halved when causal; forward+backward 3.5x forward.
Inputs are strided views of one (B, T, 3, H, D) tensor, as the model produces them.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernels import attention_op as A  # noqa: E402

SHAPES = [(16, 12, 1024, 64), (64, 6, 256, 64), (4, 16, 4096, 128)]
SDPA = {"sdpa-fa2": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}


def median_ms(fn, warmup=3, reps=15):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def inputs(B, H, T, D):
    qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return qkv, qkv.permute(2, 0, 3, 1, 4)


def bench(name, attend, B, H, T, D, causal=True):
    flops = 4 * B * H * T * T * D / (2 if causal else 1)
    qkv, (q, k, v) = inputs(B, H, T, D)
    grad = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    try:
        with torch.no_grad():
            fwd = median_ms(lambda: attend(q, k, v))

        def step():
            qkv.grad = None
            attend(q, k, v).backward(grad)
        both = median_ms(step)
    except Exception as e:   # a backend that does not take this shape
        print(f"{B:3d} {H:3d} {T:5d} {D:4d}  {name:22s} unavailable: {str(e).splitlines()[0][:80]}")
        return
    print(f"{B:3d} {H:3d} {T:5d} {D:4d}  {name:22s} fwd {fwd * 1e3:8.1f} us {flops / fwd / 1e9:6.1f} TFLOP/s"
          f"   fwd+bwd {both * 1e3:8.1f} us {3.5 * flops / both / 1e9:6.1f} TFLOP/s", flush=True)


def tk_portable(q, k, v):
    return A.attention_fwd(q, k, v, True, 1 / math.sqrt(q.shape[-1]), "portable", "portable")[0]


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print("  B   H     T    D  implementation (causal)")
    for B, H, T, D in SHAPES:
        for variant, label in (("0", "tk-portable"), ("1", "tk-portable 8 warps"), ("2", "tk-portable BLOCK_N 128"),
                               ("3", "tk-portable 2 row tiles")):
            if variant != "0" and (B, H, T, D) != SHAPES[0] and not (variant == "3" and D == 64):
                continue   # the block-shape sweep at the GPT-2 shape; 2 row tiles at every D = 64 shape
            os.environ["TK_ATTENTION_FWD_VARIANT"] = variant
            bench(label, tk_portable, B, H, T, D)
        os.environ.pop("TK_ATTENTION_FWD_VARIANT")
        os.environ["TK_ATTENTION_BWD_VARIANT"] = "0"
        bench("tk-portable bwd 4 warps", tk_portable, B, H, T, D)
        os.environ.pop("TK_ATTENTION_BWD_VARIANT")
        for label, backend in SDPA.items():
            if label == "sdpa-efficient" and (B, H, T, D) != SHAPES[0]:
                continue   # the slowest backend, shown once for reference
            def sdpa(q, k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            bench(label, sdpa, B, H, T, D)


if __name__ == "__main__":
    main()

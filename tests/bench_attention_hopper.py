"""Time the Hopper attention forward against torch SDPA's backends, in one run (H200).

    python tests/bench_attention_hopper.py [--json out.json]

Causal forward, bf16, FLOPs = 4·B·H·T²·D / 2, fresh random inputs. Two figures per case:
"eager" = median of 20 CUDA-event-timed calls after 5 warm-ups (includes what the host adds when
it cannot keep ahead of the GPU), "graph" = the same 10 calls captured in a CUDA graph and
replayed (median of 5 replays / 10): the GPU time alone. Uses the torch extension, or the prebuilt
library named by TK_ATTENTION_HOPPER_LIB (see tests/attention_hopper_ctypes.py).
Not a pytest file: no timing in tests. (bench.py at the top level is B's; once it has a
registry for op benchmarks this table moves there.)
"""
import argparse
import importlib.util
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [  # (B, H, T, D)
    (16, 12, 1024, 64),    # GPT-2 124M
    (64, 6, 256, 64),      # shakespeare-char
    (8, 16, 2048, 64),
    (8, 16, 2048, 128),
    (4, 16, 4096, 128),
]


def hopper_forward():
    if os.environ.get("TK_ATTENTION_HOPPER_LIB"):
        spec = importlib.util.spec_from_file_location("attention_hopper_ctypes",
                                                      os.path.join(HERE, "attention_hopper_ctypes.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return lambda q, k, v, variant=0: module.forward(q, k, v, True, None, variant, poison=False)
    sys.path.insert(0, os.path.dirname(HERE))
    from kernels import attention_hopper
    return lambda q, k, v, variant=0: attention_hopper.forward(q, k, v, True, None, variant)


def median_ms(fn, warmup=5, reps=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def graph_ms(fn, calls=10, replays=5):
    """GPU time per call: `calls` calls captured in one CUDA graph, median replay / calls."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    return median_ms(graph.replay, warmup=1, reps=replays) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tk_fwd = hopper_forward()
    rows = []
    for B, H, T, D in SHAPES:
        flops = 4 * B * H * T * T * D / 2
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, device="cuda", generator=g).bfloat16() for _ in range(3))
        qkv = torch.randn(B, T, 3, H, D, device="cuda", generator=g).bfloat16()
        qp, kp, vp = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        cases = {"tk": lambda: tk_fwd(q, k, v)}
        for variant in map(int, os.environ.get("TK_ATTENTION_HOPPER_VARIANTS", "2 4").split()):
            cases[f"tk v{variant}"] = lambda variant=variant: tk_fwd(q, k, v, variant)
        cases["tk packed-qkv"] = lambda: tk_fwd(qp, kp, vp)
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            cases[name] = run
        result = {"shape": [B, H, T, D]}
        for name, fn in cases.items():
            try:
                ms = median_ms(fn)
                result[name] = {"eager_ms": ms, "eager": flops / ms / 1e9}
            except Exception as e:   # a backend that does not take this shape
                result[name] = {"error": str(e).splitlines()[0][:120]}
                continue
            try:
                gms = graph_ms(fn)
                result[name].update(graph_ms=gms, graph=flops / gms / 1e9)
            except Exception as e:   # not capturable
                result[name]["graph_error"] = str(e).splitlines()[0][:120]
        for mode in ("eager", "graph"):
            best_sdpa = max((result[n][mode] for n in ("cudnn", "fa2", "efficient") if mode in result[n]),
                            default=float("nan"))
            line = f"{mode:>5} B={B:>2} H={H:>2} T={T:>4} D={D:>3} |"
            for name in cases:
                r = result[name]
                line += f" {name} {r[mode]:6.1f} |" if mode in r else f" {name} n/a |"
            if mode in result["tk"] and mode in result["cudnn"]:
                line += f" tk/cudnn {result['tk'][mode] / result['cudnn'][mode]:.2f}x"
                line += f" tk/best-sdpa {result['tk'][mode] / best_sdpa:.2f}x"
            print(line, flush=True)
        rows.append(result)
        del q, k, v, qkv, qp, kp, vp
    print(f"(TFLOP/s, causal forward, {torch.cuda.get_device_name()}, torch {torch.__version__})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

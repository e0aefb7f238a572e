"""Timing of the GEMM steps against torch.matmul (cuBLAS), interleaved in one run.

    python -m kernels.gemm_bench            # all shapes, 5 trials, prints a table
    python -m kernels.gemm_bench --quick    # fewer shapes and trials
    python -m kernels.gemm_bench --variants # step 4's pipeline variants (gemm.VARIANTS) instead of the steps
    python -m kernels.gemm_bench --steps 0,4,5 --variants5 1,2,3   # auto, 4, 5 and step 5's variants (gemm.VARIANTS5)
    python -m kernels.gemm_bench --steps 0,4 --variants4 5          # ... and step 4's (gemm.VARIANTS)

Each trial times torch.matmul and each step on the same inputs (CUDA events around `iters`
back-to-back launches after a warm-up); the reported ratio is the median over trials of
tk / torch, because absolute figures drift by 10% between runs on the H200 (shared/docs/anchors.md).
Shapes are written M x K x N; 'fwd' is y = x·Wᵀ, 'dW' the weight gradient dyᵀ·x of the same layer.
(bench.py at the top level is engineer B's; this is the GEMM part until it has a registry.)
"""
import argparse
import statistics

import torch

from . import gemm


def time_ms(fn, iters):
    """Milliseconds per call of `iters` back-to-back calls between two CUDA events. Back to back,
    the GPU queue stays full as long as Python launches faster than the GPU runs, so this is GPU
    time, not Python's per-call overhead (a per-call event pair would count that too)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def cases(quick):
    """(name, M, K, N, kind); kind 'fwd': A = x [M][K], B = Wᵀ; 'dW': A = dyᵀ, B = x (K = tokens)."""
    out = [("8192^3", 8192, 8192, 8192, "fwd")]
    for k_in, n_out in [(768, 3072), (3072, 768), (768, 2304), (768, 768)]:
        out.append((f"fwd 16384x{k_in}x{n_out}", 16384, k_in, n_out, "fwd"))
        out.append((f"dW  {n_out}x16384x{k_in}", n_out, 16384, k_in, "dW"))
    return out[:3] if quick else out


def operands(M, K, N, kind):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
    if kind == "fwd":
        x, W = r(M, K), r(N, K)
        return x, W.t()
    dy, x = r(K, M), r(K, N)         # tokens = K
    return dy.t(), x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", default="1,2,3,4", help="e.g. 0,4,5: auto (0), step 4, step 5")
    ap.add_argument("--variants", action="store_true", help="time step 4's variants instead of the steps")
    ap.add_argument("--variants5", default="", help="also time these step-5 variants, e.g. 1,2,3 (v0 is step5)")
    ap.add_argument("--variants4", default="", help="also time these step-4 variants, e.g. 5 (v0 is step4)")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of the case names to keep")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    trials = 2 if args.quick else args.trials
    print(f"GEMM bench on {torch.cuda.get_device_name()}, {trials} interleaved trials of {args.iters} back-to-back launches")
    rows = []
    keep = [k for k in args.shapes.split(",") if k]
    for name, M, K, N, kind in cases(args.quick):
        if keep and not any(k in name for k in keep):
            continue
        a, b = operands(M, K, N, kind)
        flop = 2.0 * M * N * K
        fns = {"torch": lambda: torch.matmul(a, b)}
        for v in (gemm.VARIANTS if args.variants else ()):
            fns[f"v{v}"] = (lambda v=v: gemm.matmul(a, b, variant=v))
        for s in (() if args.variants else steps):
            if s < 4 and kind == "dW" and M * N * K > 2**36:
                continue   # steps 1-3 copy-transpose for dW and are slow; timed at the fwd shapes
            fns["auto" if s == 0 else f"step{s}"] = (lambda s=s: gemm.matmul(a, b, step=s))
        for v in (int(v) for v in args.variants5.split(",") if v.strip()):
            fns[f"5v{v}"] = (lambda v=v: gemm.matmul(a, b, step=5, variant=v))
        for v in (int(v) for v in args.variants4.split(",") if v.strip()):
            fns[f"4v{v}"] = (lambda v=v: gemm.matmul(a, b, step=4, variant=v))
        per = {k: [] for k in fns}
        for _ in range(trials):
            for k, fn in fns.items():
                iters = max(3, args.iters // 4) if k in ("step1", "step2") else args.iters
                per[k].append(time_ms(fn, iters))
        tflops = {k: flop / (statistics.median(v) * 1e-3) / 1e12 for k, v in per.items()}
        ratio = {k: statistics.median([t / x for t, x in zip(per["torch"], v)]) for k, v in per.items() if k != "torch"}
        line = f"{name:24s} torch {tflops['torch']:6.0f} TFLOP/s | " + " | ".join(
            f"{k} {tflops[k]:6.0f} ({ratio[k]:.3f}x)" for k in fns if k != "torch")
        print(line, flush=True)
        rows.append((name, tflops, ratio))
    return rows


if __name__ == "__main__":
    main()

"""bench.py's MLP rows: tk vs torch eager (cuBLAS GEMMs + a separate GELU kernel) vs torch.compile.

    python bench.py --ops mlp [--quick]

Registered into bench.py's registry by kernels/mlp_op.py when bench.py is the running script.
Cases: forward and forward+backward at M = 16384 and 65536 tokens, C = 768 (GPT-2 small),
hidden 4C, bf16 parameters and activations, biases on. Work counted: 2·2·M·C·4C flops for the
forward (two GEMMs), 3x that for forward+backward (shared/docs/anchors.md's convention; the
bias and GELU work is not counted).
"""
import torch


def cases(Case, quick):
    from kernels import mlp_op, reference

    def fwd(f, inp):
        with torch.no_grad():
            f(*inp[:5])

    def fwd_bwd(f, inp):
        x, w_fc, b_fc, w_proj, b_proj, dy = inp
        y = f(x, w_fc, b_fc, w_proj, b_proj)
        torch.autograd.grad(y, (x, w_fc, b_fc, w_proj, b_proj), dy)   # grads returned, never accumulated

    C = 768
    for M in (16384, 65536):
        def make(M=M):
            def t(*shape, scale=1.0, grad=True):
                return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16).requires_grad_(grad)
            return (t(M, C), t(4 * C, C, scale=C ** -0.5), t(4 * C, scale=0.5), t(C, 4 * C, scale=(4 * C) ** -0.5),
                    t(C, scale=0.5), t(M, C, grad=False))
        flops = 2 * 2 * M * C * 4 * C
        steps = [("fwd+bwd", fwd_bwd, 3)] if quick else [("fwd", fwd, 1), ("fwd+bwd", fwd_bwd, 3)]
        for name, step, mult in steps:
            yield Case("mlp", f"{name} {M}x{C} bf16", "TFLOP/s", mult * flops, make, step,
                       impls={"tk": mlp_op.mlp, "eager": reference.mlp},
                       note="c_fc -> GELU(tanh) -> c_proj; flops of the GEMMs only")


# ---- python -m kernels.mlp_bench: the GEMM schedules against each other and torch eager ---------
# One process times several schedule choices (kernels/mlp_op.py set_schedule) interleaved with
# torch eager (and with --compile, torch.compile of the same reference module), so the ratios come
# from the same run (absolute figures drift ~10% between runs; each trial after the first runs the
# list in a fresh random order, and a ratio is the median of per-trial ratios, "x first" the one to
# the first tk spec; --settle-ms idles before each burst); the timer is the GEMM bench's
# (kernels/gemm_bench.py time_ms: back-to-back calls between events). With --graphs each step is
# captured once in a CUDA graph (under its own schedule: the extension reads the schedule at
# launch, so the graph keeps the kernels it was captured with) and replayed back to back: GPU time
# without Python's launch overhead, as bench.py's headline figures.
# --H sets the hidden size (default 4C). Swapped sizes time the plain GEMMs of the dGELU and c_fc
# shapes: with C = 3072 and H = 768, c_proj's forward is x·Wᵀ at c_fc's shape (K = 768, N = 3072)
# with a bias-only epilogue, and dx is dy·W at the dGELU GEMM's shape (B N-major) with none, so
# `--C 3072 --H 768 --kernels` shows what those two GEMMs cost without GELU, GELU' and pre.

DEFAULT_SCHEDULES = ("0", "pre=1", "dgelu=6,pre=1", "dgelu=6", "0,side=0", "dw=10", "4", "5", "6",
                     "fast=0", "finish=1", "dw=10,finish=1",   # fast=1 is the default since session 5
                     "fcfast=1", "fcfast=2", "fcfast=2,finish=1", "fcfast=2,finish=1,dw=10",   # session 6's opt-ins
                     "defer=1", "fc=4,fcfast=3", "fc=4,fcfast=3,finish=1,defer=1",
                     "fast=3", "fcfast=4", "finish=0,fcfast=0",   # session 7's (finish=1,fcfast=4 its default)
                     "side=2", "fcfast=6",                          # session 8's
                     "fcfast=5", "fcfast=9", "fcfast=10")           # session 10's (fcfast=11 the default since)


def main(argv=None):
    import argparse
    import random
    import statistics
    import time
    from kernels import mlp_op, reference
    from kernels.gemm_bench import time_ms
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--M", default="16384,65536", help="token counts")
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--H", type=int, default=0, help="hidden size (default 4C; see the comment above for swapped sizes)")
    ap.add_argument("--graphs", action="store_true", help="time CUDA-graph replays of each step (GPU time only)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the reference MLP (mode default)")
    ap.add_argument("--schedules", default=";".join(DEFAULT_SCHEDULES),
                    help="';'-separated specs for mlp_op.set_schedule ('0' = auto, 'fc=5,dgelu=5', ...)")
    ap.add_argument("--no-bias", dest="bias", action="store_false",
                    help="the MLP without biases (GPT-2's bias=False): no bias gradients, as in the GPT-2 step")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--settle-ms", type=float, default=0.0,
                    help="idle this long before each timed burst (the clocks recover between bursts, so no spec "
                         "inherits the previous one's power state)")
    ap.add_argument("--show-trials", action="store_true", help="print every trial's time per spec")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--parts", action="store_true", help="also time the forward and backward halves alone")
    ap.add_argument("--kernels", action="store_true",
                    help="also profile each schedule's fwd+bwd (torch.profiler) and print every kernel's time")
    args = ap.parse_args(argv)
    specs = [s.strip() for s in args.schedules.split(";") if s.strip()]
    for spec in specs:
        mlp_op.parse_schedule(spec)                      # a typo fails before any timing
    C, H = args.C, args.H or 4 * args.C
    print(f"MLP fwd+bwd on {torch.cuda.get_device_name()}: C={C}, H={H}, {'with' if args.bias else 'WITHOUT'} biases, "
          f"{args.trials} interleaved trials of "
          f"{args.iters} back-to-back {'CUDA-graph replays' if args.graphs else 'steps'}; TFLOP/s counts 3 x 2·2·M·C·H; "
          f"schedules: {','.join(mlp_op.PRODUCTS)} "
          f"({'; '.join(f'{k} {v}' for k, v in mlp_op.SCHEDULES.items())}); "
          f"side=0: no side jobs in dGELU; side=2: their dy column sums 8 row loads in flight; pre=1: dGELU gets pre by TMA and pipelines its dy sums; "
          f"fast=1 (the default): the dGELU epilogue's cheaper form; finish=1: the backward's bias sums and dW casts in one kernel; "
          f"fcfast=1: c_fc's epilogue's cheaper form (GELU in 5 operations, the bias without per-column checks), "
          f"fcfast=2: the same staged by stmatrix, one fence per box; "
          f"defer=1: c_proj's and dx's stores deferred under the next tile's math (step 4); fc=4,fcfast=3: c_fc deferred the same way; "
          f"fast=3: the dGELU epilogue under the next tile's math in half boxes, pre by TMA; "
          f"fcfast=4 (session 7's default): c_fc's the same way; fcfast=5 (sessions 8-9's default): 4 saving gelu'(pre) "
          f"for the backward; fcfast=6: 5 without biases, 4 with; fcfast=9: 5 on a lean k-step; "
          f"fcfast=10: 9 with the dGELU GEMM on the lean k-step too; fcfast=11 (the default since session 10): 10 with "
          f"the dGELU product packed (bf16x2) when no bias gradient is wanted")
    for M in (int(m) for m in args.M.split(",")):
        g = torch.Generator(device="cuda").manual_seed(M)
        def t(*shape, scale=1.0, grad=True):
            return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16).requires_grad_(grad)
        x, w_fc, b_fc, w_proj, b_proj = t(M, C), t(H, C, scale=C ** -0.5), t(H, scale=0.5), t(C, H, scale=H ** -0.5), t(C, scale=0.5)
        dy = t(M, C, grad=False)
        if not args.bias:
            b_fc = b_proj = None
        params = (x, w_fc, b_fc, w_proj, b_proj)
        leaves = tuple(p for p in params if p is not None)

        def step(f):
            y = f(*params)
            torch.autograd.grad(y, leaves, dy)

        fns = {"eager": lambda: step(reference.mlp)}
        if args.compile:
            from torch import _dynamo             # (`import torch._dynamo` here would make torch local to main)
            _dynamo.reset()
            compiled = torch.compile(reference.mlp, dynamic=False)
            fns["compile"] = lambda: step(compiled)
        for spec in specs:
            fns[f"tk[{spec}]"] = (spec, lambda: step(mlp_op.mlp))
        if args.graphs:
            fns = {k: (v[0], graphed(v[1], v[0])) if isinstance(v, tuple) else graphed(v) for k, v in fns.items()}
        parts = {}
        if args.parts:
            ext = mlp_op._ext.module
            xd, w1, b1, w2, b2 = (None if p is None else p.detach() for p in params)
            _, pre, h = ext.forward(xd, w1, b1, w2, b2)
            for spec in specs:
                parts[f"fwd[{spec}]"] = (spec, lambda: ext.forward(xd, w1, b1, w2, b2))
                parts[f"bwd[{spec}]"] = (spec, lambda: ext.backward(dy, xd, pre, h, w1, w2, args.bias))
        per = {k: [] for k in list(fns) + list(parts)}
        order = list(fns.items()) + list(parts.items())
        shuffle = random.Random(M)
        for trial in range(args.trials):
            # Each trial runs the list in a fresh random order (seeded): no spec always runs first or
            # last, nor always right after the same neighbour. (Session 6 rotated the list instead,
            # which keeps every spec's predecessor: under sustained load at M = 65536 the first tk
            # spec measured 2-4% ahead of specs doing the same or less work, sessions 6 and 8.)
            for k, v in shuffle.sample(order, len(order)) if trial else order:
                if isinstance(v, tuple):
                    mlp_op.set_schedule(v[0])
                    v = v[1]
                if args.settle_ms > 0:
                    torch.cuda.synchronize()
                    time.sleep(args.settle_ms / 1000)
                per[k].append(time_ms(v, args.iters))
        flops = 3 * 2 * 2 * M * C * H
        eager = per["eager"]
        print(f"\nM={M}: eager {flops / statistics.median(eager) / 1e9:6.0f} TFLOP/s ({statistics.median(eager):.4f} ms)"
              + (f"; compile {flops / statistics.median(per['compile']) / 1e9:6.0f} TFLOP/s "
                 f"({statistics.median(per['compile']):.4f} ms)" if "compile" in per else ""))
        # "x first": the median over trials of (first spec's time / this spec's time) in the same trial:
        # the paired comparison of two tk specs, which the clocks' drift between trials does not move
        first = next(k for k in fns if k not in ("eager", "compile"))
        print(f"  {'schedule':32s} {'ms':>7s} {'TFLOP/s':>8s} {'x eager':>8s}" + (f" {'x compile':>9s}" if "compile" in per else "")
              + f" {'x first':>8s}   (x: medians of per-trial ratios; first = {first})")
        for k in fns:
            if k in ("eager", "compile"):
                continue
            ms = statistics.median(per[k])
            ratio = statistics.median([e / v for e, v in zip(eager, per[k])])
            line = f"  {k:32s} {ms:7.4f} {flops / ms / 1e9:8.0f} {ratio:8.3f}"
            if "compile" in per:
                line += f" {statistics.median([c / v for c, v in zip(per['compile'], per[k])]):9.3f}"
            line += f" {statistics.median([f / v for f, v in zip(per[first], per[k])]):8.3f}"
            print(line)
            if args.show_trials:
                print(f"    trials: {' '.join(f'{t:.4f}' for t in per[k])}")
        for k in parts:
            ms = statistics.median(per[k])
            share = flops / 3 if k.startswith("fwd") else 2 * flops / 3
            print(f"  {k:32s} {ms:7.3f} {share / ms / 1e9:8.0f}")
        if args.kernels:
            for spec in specs:
                mlp_op.set_schedule(spec)
                print(f"  kernels of tk[{spec}] (µs per launch; GEMMs: TFLOP/s at 2·M·C·H):")
                for name, us, count in profile_kernels(lambda: step(mlp_op.mlp), args.iters):
                    gemm = "gemm" in name
                    rate = f"{2 * M * C * H / us / 1e6:6.0f}" if gemm else "      "   # every GEMM: 2·M·C·H
                    print(f"    {us:8.1f} {rate} x{count:<3d} {short_kernel_name(name)}")
    mlp_op.set_schedule("0")


def graphed(fn, spec=None):
    """fn captured once in a CUDA graph (under schedule `spec`), returned as a replay function."""
    from kernels import mlp_op
    if spec is not None:
        mlp_op.set_schedule(spec)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # warm-up before capture, as torch asks
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def profile_kernels(fn, iters):
    """[(kernel name, µs per launch, launches per call)] of `iters` calls of fn, by total time."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total <= 0 or e.count < iters:
            continue
        rows.append((e.key, total / e.count, e.count // iters, total))
    return [(k, us, n) for k, us, n, _ in sorted(rows, key=lambda r: -r[3])][:12]


def short_kernel_name(name):
    """'void gemm5::gemm_pingpong_kernel<gemm5::config<1, 4, 4, 1>, (tk::wgmma::major)0, ...dgelu_pre_tma_epilogue>(...)'
    -> 'gemm5 config<1, 4, 4, 1> K,MN dgelu_pre_tma_epilogue'."""
    import re
    m = re.match(r"void (gemm\d)::\w+<\w+::(config<[^>]*>), \(tk::wgmma::major\)(\d), \(tk::wgmma::major\)(\d), "
                 r"(?:tk_mlp::detail::)?([\w:<>]+)>", name)
    if not m:                                     # session 7's kernels/mlp_deferred.cuh
        d = re.match(r"void tk_mlp::detail::deferred::parts_kernel<gemm4::(config<[^>]*>), \(tk::wgmma::major\)(\d), ", name)
        e = re.search(r"(\w+_epilogue(?:<[^>]*>)?)", name)
        if d and e:
            return f"parts {d.group(1)} K,{'MN' if d.group(2) == '1' else 'K'} {e.group(1)}"
        return name[:90]
    major = {"0": "K", "1": "MN"}
    return f"{m.group(1)} {m.group(2)} {major[m.group(3)]},{major[m.group(4)]} {m.group(5)}"


if __name__ == "__main__":
    main()

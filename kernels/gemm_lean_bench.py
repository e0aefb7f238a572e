"""The lean k-step (session 10, opt-in: TK_GEMM_LEAN_KSTEP=1, kernels/gemm_4_warp_specialized.cuh)
timed beside the default pipeline and cuBLAS, interleaved, in one process.

    python -m kernels.gemm_lean_bench products            # GPT-2's plain products at 32768 tokens
    python -m kernels.gemm_lean_bench products --shapes bench   # kernels/gemm_bench.py's shapes
    python -m kernels.gemm_lean_bench mlp --M 16384,32768  # the MLP's fwd+bwd (tk_mlp), + kernels
    python -m kernels.gemm_lean_bench all                  # both
    python -m kernels.gemm_lean_bench ncu                  # one launch per arm for ncu (tests/gpu_gemm_lean.sh)

Every arm is a CUDA graph of `iters` calls captured with the flag set as the arm says (the
launcher reads TK_GEMM_LEAN_KSTEP at every launch, so a graph keeps what it read at capture);
a trial times each arm once (`replays` replays between events), in an order rotated per trial.
Ratios are medians over trials of per-trial ratios (absolute figures drift by ~10% between runs
on the H200). Arms, products: torch (torch.matmul), auto (matmul(step=0): 4v8 for the forward
and dx shapes, 5v10 for dW, which has no lean twin: a control), auto+lean; for dW also step4
(matmul(step=4) into fp32: split-K reduce-add on the default pipeline, as the MLP's dW),
step4+lean and auto fp32 (5v10 storing fp32, what the MLP would get from gemm.matmul); with
--extra: 4v9 (step 4's planned schedule: whole tiles + k-pieces, fewer exposed epilogues than
split-K, the wave-quantization alternative; +lean for dW), 4v4 (config<3, 64, false, 4>: one stage
less, four staging boxes per warp instead of two, for the exposed epilogues) and, at the forward
and dx shapes, 4v0 (the per-value epilogue exposed at each tile's end: the kind of the MLP's
c_proj / dx kernels, bias_epilogue, where auto's 4v8 defers its stores under the next tile). MLP: torch (the same math with cuBLAS
matmuls, no autograd), tk default, tk+lean; then a per-kernel table of one profiled replay per arm.
Shapes are M x K x N.
"""
import argparse
import json
import os
import statistics
import sys

import torch

from . import gemm
from .gemm_bench import capture, time_graph_ms

ENV = "TK_GEMM_LEAN_KSTEP"

GPT2 = [  # (name, M, K, N, kind)
    ("c_fc fwd   32768x768x3072", 32768, 768, 3072, "fwd"),
    ("c_proj fwd 32768x3072x768", 32768, 3072, 768, "fwd"),
    ("dGELU dx   32768x768x3072", 32768, 768, 3072, "dx"),
    ("c_fc dx    32768x3072x768", 32768, 3072, 768, "dx"),
    ("dW_fc      3072x32768x768", 3072, 32768, 768, "dW"),
    ("dW_proj    768x32768x3072", 768, 32768, 3072, "dW"),
]


def bench_shapes():
    out = [("8192^3", 8192, 8192, 8192, "fwd")]
    for k_in, n_out in [(768, 3072), (3072, 768), (768, 2304), (768, 768)]:
        out.append((f"fwd {16384}x{k_in}x{n_out}", 16384, k_in, n_out, "fwd"))
        out.append((f"dW  {n_out}x16384x{k_in}", n_out, 16384, k_in, "dW"))
    return out


def operands(M, K, N, kind):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
    if kind == "fwd":
        return r(M, K), r(N, K).t()
    if kind == "dx":
        return r(M, K), r(K, N)
    dy, x = r(K, M), r(K, N)
    return dy.t(), x


class flag:
    """with flag('1'): ... sets TK_GEMM_LEAN_KSTEP for the block (None: unset), then restores it."""
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.old = os.environ.get(ENV)
        if self.value is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self.value

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self.old


def arms_for(a, b, kind, extra):
    """{arm: (flag value, fn)}"""
    out = {"torch": (None, lambda: torch.matmul(a, b)),
           "auto": ("0", lambda: gemm.matmul(a, b, step=0)),
           "auto+lean": ("1", lambda: gemm.matmul(a, b, step=0))}
    if kind == "dW":                                  # fp32 out, as the MLP's dW (its own split-K policy)
        out["step4"] = ("0", lambda: gemm.matmul(a, b, step=4, out_dtype=torch.float32))
        out["step4+lean"] = ("1", lambda: gemm.matmul(a, b, step=4, out_dtype=torch.float32))
        out["auto fp32"] = ("0", lambda: gemm.matmul(a, b, step=0, out_dtype=torch.float32))
        if extra:
            out["4v4 fp32"] = ("0", lambda: gemm.matmul(a, b, step=4, variant=4, out_dtype=torch.float32))
            out["4v9 fp32"] = ("0", lambda: gemm.matmul(a, b, step=4, variant=9, out_dtype=torch.float32))
            out["4v9+lean"] = ("1", lambda: gemm.matmul(a, b, step=4, variant=9, out_dtype=torch.float32))
    elif extra:
        out["4v0"] = ("0", lambda: gemm.matmul(a, b, step=4, variant=0))
        out["4v4"] = ("0", lambda: gemm.matmul(a, b, step=4, variant=4))
        out["4v9"] = ("0", lambda: gemm.matmul(a, b, step=4, variant=9))
    return out


def kernel_names(fn, value):
    """The CUDA kernels one call of fn launches with the flag at value (what ran, by name)."""
    from torch.profiler import ProfilerActivity, profile
    with flag(value):
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [short(n) for n in names]


def short(name):
    for old, new in (("gemm4::", ""), ("tk::wgmma::major", "m"), ("tk_mlp::detail::", ""), ("(anonymous namespace)::", "")):
        name = name.replace(old, new)
    return name[:150]


def run_trials(graphs, trials, replays, iters):
    """{arm: [ms per call, per trial]}, arms in an order rotated per trial."""
    names = list(graphs)
    times = {n: [] for n in names}
    for t in range(trials):
        order = names[t % len(names):] + names[:t % len(names)]
        for n in order:
            times[n].append(time_graph_ms(graphs[n], iters, replays))
    return times


def ratio(times, num, den):
    return statistics.median(x / y for x, y in zip(times[num], times[den]))


def products(shapes, trials, iters, replays, extra, results):
    print(f"\n--- products ({len(shapes)} shapes), {trials} interleaved trials, CUDA graphs of {iters} calls x {replays} replays")
    for name, M, K, N, kind in shapes:
        a, b = operands(M, K, N, kind)
        arms = arms_for(a, b, kind, extra)
        for arm, (value, fn) in list(arms.items()):      # an arm that fails is reported and dropped
            try:
                with flag(value):
                    fn()
                torch.cuda.synchronize()
            except Exception as e:                       # noqa: BLE001 (the bench goes on with the others)
                print(f"  {name}: arm {arm} FAILED, dropped: {type(e).__name__}: {str(e)[:200]}")
                del arms[arm]
        if "torch" not in arms:
            print(f"  {name}: skipped (torch.matmul failed)")
            continue
        ran = {}                                       # what each arm launched (GPT-2's shapes: the profiler costs time)
        for arm, (value, fn) in arms.items():
            if arm != "torch" and (name, M, K, N, kind) in GPT2:
                ran[arm] = [n for n in kernel_names(fn, value) if "gemm" in n or "kernel" in n]
        graphs = {}
        for arm, (value, fn) in arms.items():
            with flag(value):
                graphs[arm] = capture(fn, iters)
        times = run_trials(graphs, trials, replays, iters)
        flops = 2.0 * M * N * K
        row = {arm: statistics.median(ts) for arm, ts in times.items()}
        print(f"{name}:")
        for arm in arms:
            line = f"  {arm:11s} {row[arm] * 1e3:9.1f} us  {flops / row[arm] / 1e9:6.0f} TFLOP/s  x torch {ratio(times, 'torch', arm):.3f}"
            if arm.endswith("+lean"):
                base = {"4v9+lean": "4v9 fp32"}.get(arm, arm[:-5])
                line += f"  lean/default {ratio(times, arm, base):.4f}"
            print(line)
            print("      trials (us): " + " ".join(f"{t * 1e3:.1f}" for t in times[arm]))
        for arm, names in ran.items():
            print(f"      {arm} ran: {' | '.join(names) if names else '?'}")
        results.append({"shape": name, "M": M, "K": K, "N": N, "kind": kind,
                        "ms": {arm: ts for arm, ts in times.items()}})
        del graphs, arms, a, b
        torch.cuda.empty_cache()


def mlp_arms(M, C):
    from kernels import mlp_op
    H = 4 * C
    g = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)
    x, w_fc, w_proj, dy = r(M, C), r(H, C, scale=0.05), r(C, H, scale=0.05), r(M, C)

    def tk():
        y, pre, h = mlp_op._ext_forward(x, w_fc, None, w_proj, None)
        return mlp_op._ext_backward(dy, x, pre, h, w_fc, w_proj, False, -1)

    def torch_ref():                                   # the same math on cuBLAS, no autograd
        pre = x @ w_fc.t()
        h = torch.nn.functional.gelu(pre, approximate="tanh")
        y = h @ w_proj.t()
        dh = dy @ w_proj
        dpre = torch.ops.aten.gelu_backward(dh, pre, approximate="tanh")
        return y, dpre @ w_fc, dpre.t() @ x, dy.t() @ h

    return {"torch": (None, torch_ref), "tk": ("0", tk), "tk+lean": ("1", tk)}


def kernel_table(graphs, reps=3):
    """{arm: {kernel: us per fwd+bwd}} from `reps` profiled replays of each arm's graph (1 call each)."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for arm, g in graphs.items():
        g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                g.replay()
            torch.cuda.synchronize()
        sums = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                k = short(e.name)
                if LEAN_MARK in k:                     # the same row as its default twin, counted
                    k = k.replace(LEAN_MARK, DEFAULT_MARK)
                    sums["(lean twins launched)"] = sums.get("(lean twins launched)", 0.0) + 1 / reps
                sums[k] = sums.get(k, 0.0) + e.device_time_total / reps
        out[arm] = sums
    return out


LEAN_MARK, DEFAULT_MARK = "config<4, 64, false, 2, 1, true>", "config<4, 64, false, 2, 1, false>"


def mlp(Ms, C, trials, iters, replays, results):
    print(f"\n--- MLP fwd+bwd (C={C}, H={4 * C}, no biases; tk_mlp's forward + backward, the flag at capture), "
          f"{trials} interleaved trials, CUDA graphs of {iters} calls x {replays} replays")
    for M in Ms:
        arms = mlp_arms(M, C)
        graphs = {}
        for arm, (value, fn) in arms.items():
            with flag(value):
                graphs[arm] = capture(fn, iters)
        times = run_trials(graphs, trials, replays, iters)
        flops = 6 * 2.0 * M * C * 4 * C
        print(f"M={M}:")
        for arm in arms:
            ms = statistics.median(times[arm])
            line = f"  {arm:8s} {ms:8.4f} ms  {flops / ms / 1e9:6.0f} TFLOP/s  x torch {ratio(times, 'torch', arm):.3f}"
            if arm == "tk+lean":
                line += f"  lean/default {ratio(times, 'tk+lean', 'tk'):.4f}"
            print(line)
            print("      trials (ms): " + " ".join(f"{t:.4f}" for t in times[arm]))
        single = {}
        for arm, (value, fn) in arms.items():
            if arm == "torch":
                continue
            with flag(value):
                single[arm] = capture(fn, 1)
        table = kernel_table(single)
        count = "(lean twins launched)"
        names = sorted((set(table["tk"]) | set(table["tk+lean"])) - {count},
                       key=lambda k: -max(table["tk"].get(k, 0), table["tk+lean"].get(k, 0)))
        print("  per kernel, us per fwd+bwd (profiler, 3 replays of a 1-call graph per arm): default | lean | kernel "
              f"(lean twins launched per fwd+bwd: {table['tk'].get(count, 0):.0f} | {table['tk+lean'].get(count, 0):.0f})")
        for k in names[:12]:
            print(f"    {table['tk'].get(k, 0):8.1f} | {table['tk+lean'].get(k, 0):8.1f} | {k}")
        total = lambda t: sum(v for k, v in t.items() if k != count)
        print(f"    {total(table['tk']):8.1f} | {total(table['tk+lean']):8.1f} | total")
        results.append({"mlp_M": M, "C": C, "ms": times, "kernels_us": table})
        del graphs, single, arms
        torch.cuda.empty_cache()


def ncu_case():
    """One launch each, default then lean, inside the NVTX range 'ncu' (warm-up outside it), for
    `ncu --nvtx --nvtx-include ncu/ -k regex:gemm_ws_kernel`: c_fc's and c_proj's forward products
    (4v8) and dW_fc on step 4's split-K (the MLP's dW kind)."""
    cases = [(GPT2[0], 0, torch.bfloat16), (GPT2[1], 0, torch.bfloat16), (GPT2[4], 4, torch.float32)]
    calls = []
    for (name, M, K, N, kind), step, dt in cases:
        a, b = operands(M, K, N, kind)
        fn = (lambda a=a, b=b, step=step, dt=dt: gemm.matmul(a, b, step=step, out_dtype=dt))
        for value in ("0", "1"):
            with flag(value):
                fn()
            calls.append((name, value, fn))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("ncu")
    for name, value, fn in calls:
        with flag(value):
            fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print("ncu case order: " + ", ".join(f"{name.split()[0]} {'lean' if v == '1' else 'default'}" for name, v, _ in calls))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["products", "mlp", "all", "ncu"])
    ap.add_argument("--shapes", default="gpt2", help="products: gpt2, bench or gpt2,bench")
    ap.add_argument("--M", default="32768", help="mlp: token counts, comma-separated")
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--extra", action="store_true", help="products: also 4v9 (planned schedule; +lean at dW), 4v4, 4v0 (see the docstring)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shapes = []
    for s in args.shapes.split(","):
        if s not in ("gpt2", "bench"):
            ap.error(f"--shapes takes gpt2 and/or bench (got {s!r})")
        shapes += GPT2 if s == "gpt2" else bench_shapes()
    Ms = [int(m) for m in args.M.split(",")]
    if args.trials < 1 or args.iters < 1 or args.replays < 1:
        ap.error("--trials, --iters and --replays must be >= 1")
    if not torch.cuda.is_available():
        print("gemm_lean_bench: needs a CUDA GPU (arguments parsed: "
              f"{args.what}, {len(shapes)} shapes, M={Ms}, {args.trials} trials)")
        return 0
    print(f"gemm_lean_bench on {torch.cuda.get_device_name()}: {ENV} at start = {os.environ.get(ENV)!r}")
    if args.what == "ncu":
        ncu_case()
        return 0
    results = []
    if args.what in ("products", "all"):
        products(shapes, args.trials, args.iters, args.replays, args.extra, results)
    if args.what in ("mlp", "all"):
        mlp(Ms, args.C, args.trials, args.iters, args.replays, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timing of the GEMM steps against torch.matmul (cuBLAS), interleaved in one run.

    python -m kernels.gemm_bench            # all shapes, 5 trials, prints a table
    python -m kernels.gemm_bench --quick    # fewer shapes and trials
    python -m kernels.gemm_bench --variants # step 4's pipeline variants (gemm.VARIANTS) instead of the steps
    python -m kernels.gemm_bench --steps 0,4,5 --variants5 1,2,3   # auto, 4, 5 and step 5's variants (gemm.VARIANTS5)
    python -m kernels.gemm_bench --steps 0,4 --variants4 5          # ... and step 4's (gemm.VARIANTS)
    python -m kernels.gemm_bench --steps 0,4 --modes eager,graph,kernel --host   # launch cost vs kernel (session 5)
    python -m kernels.gemm_bench --steps 0,4 --variants4 6 --variants5 6 --modes eager,graph,kernel   # plain epilogue (session 6)
    python -m kernels.gemm_bench --steps 0 --old-auto --modes eager,graph,kernel   # the default vs the one before it
    python -m kernels.gemm_bench --steps 0 --variants5 8 --shapes dW --modes graph,kernel   # in-kernel split-K (session 7) vs auto (5v7)

Timing modes (--modes; each trial runs every mode of every implementation, interleaved):
  eager   CUDA events around `iters` back-to-back calls launched from Python. The GPU waits for
          Python whenever one call's host path (checks, allocation, TMA descriptor encodes,
          split-K's memset and conversion launches) takes longer than its kernels.
  graph   the same `iters` calls captured once in a CUDA graph; events around `replays` replays.
          Kernels alone, back to back: host work is gone, but GPU work the call adds (split-K's
          zeroing and fp32 -> bf16 conversion) stays. torch.matmul is captured the same way.
  kernel  tk only: the GEMM kernel alone (gemm.kernel_only: operands and output prepared once,
          no memset, no conversion), captured and replayed like `graph`; its ratio is to torch's
          `graph` time of the same trial. Timed for auto, step4, step5 and the --variants4/5 keys.
--host adds a table of host microseconds per call (perf_counter, launches queued, not waited
for): torch.matmul, tk's matmul and each part of its path (one TMA descriptor encode, measured
separately in session 5, costs ~0.1 us: kernels/NOTES.md).

The reported ratio is the median over trials of tk / torch from the same trial and mode, because
absolute figures drift by 10% between runs on the H200 (shared/docs/anchors.md). Shapes are
written M x K x N; 'fwd' is y = x·Wᵀ, 'dW' the weight gradient dyᵀ·x of the same layer.
(bench.py at the top level has a registry row for the GEMM; this is the GEMM's own bench.)
"""
import argparse
import json
import statistics
import time

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


def capture(fn, iters):
    """A CUDA graph of `iters` back-to-back calls of fn (warmed up on a side stream first, as
    torch asks: lazy builds and allocations must not happen during capture). Every tensor fn
    reads or writes that was allocated outside the capture must outlive the graph: a later
    torch.cuda.graph() empties the allocator's cache, so a freed block is really freed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def time_graph_ms(g, iters, replays):
    """Milliseconds per call: `replays` back-to-back replays of g (iters calls each) between events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (replays * iters)


def host_us(fn, calls=30, reps=3):
    """Host microseconds per call: the median over reps of perf_counter around `calls` calls,
    the GPU synchronized before each rep (so the launch queue has room) but not waited for."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def kernel_step_variant(key):
    """(step, variant) of a timing key that `kernel` mode can time alone ('auto', 'step4', 'step5',
    '4v6', '5v1', ...), None for the others (torch, steps 1-3, step 4's --variants keys)."""
    if key == "auto":
        return 0, 0
    if key in ("step4", "step5"):
        return int(key[-1]), 0
    if len(key) >= 3 and key[0] in "45" and key[1] == "v" and key[2:].isdigit():
        return int(key[0]), int(key[2:])
    return None


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


def host_table(a, b):
    """Host µs per call of torch.matmul, of tk's matmul (auto step; plan cache on and off) and
    of each part of tk's path, on these operands."""
    ext = gemm._ext.module
    p = gemm.plan(a, b, step=0)
    M, N = a.shape[0], b.shape[1]
    a_s, b_s = gemm._operands(p, a, b)
    fused = p.variant in gemm.FUSED_SPLITK.get(p.step, ())     # in-kernel split-K: bf16 out, no memset/conversion
    old_split = p.splits > 1 and not fused
    c_dtype = torch.float32 if old_split else torch.bfloat16
    c = torch.zeros((M, N), device=a.device, dtype=c_dtype)
    launch, _ = gemm.kernel_only(a, b, step=0)
    row = {"torch.matmul": host_us(lambda: torch.matmul(a, b)),
           "tk matmul (plan cache on)": host_us(lambda: gemm.matmul(a, b, step=0))}
    gemm.PLAN_CACHE = False
    try:
        row["tk matmul (plan cache off)"] = host_us(lambda: gemm.matmul(a, b, step=0))
    finally:
        gemm.PLAN_CACHE = True
    row["  check_inputs (Python)"] = host_us(lambda: gemm.check_inputs(a, b, step=0))
    row["  plan, cached"] = host_us(lambda: gemm.plan(a, b, step=0))
    row["  operands (views)"] = host_us(lambda: gemm._operands(p, a, b))
    row["  output: " + ("torch.zeros fp32 (split-K)" if old_split else "torch.empty bf16")] = host_us(
        lambda: torch.zeros((M, N), device=a.device, dtype=torch.float32) if old_split
        else torch.empty((M, N), device=a.device, dtype=torch.bfloat16))
    row["  ext.check_run (C++ checks, no launch)"] = host_us(
        lambda: ext.check_run(p.step, a_s, b_s, c, p.a_t, p.b_mode == "c", None, False, p.splits, p.variant))
    row["  ext.run (checks + TMA encodes + launch)"] = host_us(launch)
    if old_split:
        row["  c.to(bf16) (split-K conversion)"] = host_us(lambda: c.to(torch.bfloat16))
    return p, row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--replays", type=int, default=3, help="graph replays per timing (graph and kernel modes)")
    ap.add_argument("--steps", default="1,2,3,4", help="e.g. 0,4,5: auto (0), step 4, step 5")
    ap.add_argument("--variants", action="store_true", help="time step 4's variants instead of the steps")
    ap.add_argument("--variants5", default="", help="also time these step-5 variants, e.g. 1,2,3 (v0 is step5)")
    ap.add_argument("--variants4", default="", help="also time these step-4 variants, e.g. 5 (v0 is step4)")
    ap.add_argument("--old-auto", action="store_true",
                    help="also time 'old-auto': what step 0 ran before session 6 (auto_step(plain=False): 5v1 "
                         "for K <= 1024, else step 4 v0), beside 'auto' (the plain variants)")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of the case names to keep")
    ap.add_argument("--modes", default="eager", help="comma-separated: eager, graph, kernel (see the docstring)")
    ap.add_argument("--eager-keys", default="",
                    help="eager mode times only these keys (comma-separated, e.g. torch,step1,step2: the slow lessons, "
                         "which graph mode skips), so a short run still reports every step")
    ap.add_argument("--host", action="store_true", help="also print host microseconds per call and per part")
    ap.add_argument("--json", default="", help="write every figure to this file")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("eager", "graph", "kernel")]
    if bad or not modes:
        ap.error(f"--modes takes eager, graph, kernel (got {args.modes!r})")
    if "kernel" in modes and "graph" not in modes:
        modes.append("graph")                    # kernel's ratio is to torch's graph time
    trials = 2 if args.quick else args.trials
    print(f"GEMM bench on {torch.cuda.get_device_name()}, {trials} interleaved trials; modes: "
          + ", ".join({"eager": f"eager = {args.iters} back-to-back calls launched from Python",
                       "graph": f"graph = the same calls captured in a CUDA graph ({args.replays} replays: kernels alone)",
                       "kernel": "kernel = tk's GEMM kernel alone in a graph (no split-K memset/conversion)"}[m]
                      for m in modes), flush=True)
    rows, summary = [], []
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
        old = gemm.auto_step(M, N, K)                # the fused rule, which plain products used before session 6
        if args.old_auto:
            fns["old-auto"] = lambda: gemm.matmul(a, b, step=old[0], variant=old[1])
        timers = {}                                  # (mode, impl) -> () -> ms per call
        for mode in modes:
            if mode == "eager":
                eager_keys = [k for k in args.eager_keys.split(",") if k]
                for k, fn in fns.items():
                    if eager_keys and k not in eager_keys and k != "torch":
                        continue
                    iters = max(3, args.iters // 4) if k in ("step1", "step2") else args.iters
                    timers[(mode, k)] = (lambda fn=fn, iters=iters: time_ms(fn, iters))
            elif mode == "graph":
                for k, fn in fns.items():
                    if k in ("step1", "step2"):
                        continue                     # slow lessons: eager only
                    g = capture(fn, args.iters)
                    timers[(mode, k)] = (lambda g=g: time_graph_ms(g, args.iters, args.replays))
            else:
                for k in fns:
                    sv = old if k == "old-auto" else kernel_step_variant(k)
                    if sv is not None:
                        launch, _ = gemm.kernel_only(a, b, step=sv[0], variant=sv[1])
                        g = capture(launch, args.iters)
                        # keep=launch: the graph writes into kernel_only's output, which only the
                        # closure holds; freed, the next capture's empty_cache unmaps it and the
                        # replay faults (call 3: an illegal address at 8192^3)
                        timers[(mode, k)] = (lambda g=g, keep=launch: time_graph_ms(g, args.iters, args.replays))
        per = {key: [] for key in timers}
        for _ in range(trials):
            for key, timer in timers.items():
                per[key].append(timer())
        for mode in modes:
            base = per[("eager" if mode == "eager" else "graph", "torch")]
            keys = [k for (m, k) in timers if m == mode]
            if not keys:
                continue
            tflops = {k: flop / (statistics.median(per[(mode, k)]) * 1e-3) / 1e12 for k in keys}
            tflops.setdefault("torch", flop / (statistics.median(base) * 1e-3) / 1e12)
            ratio = {k: statistics.median([t / x for t, x in zip(base, per[(mode, k)])]) for k in keys if k != "torch"}
            line = f"{name:24s} [{mode:6s}] torch {tflops['torch']:6.0f} TFLOP/s | " + " | ".join(
                f"{k} {tflops[k]:6.0f} ({ratio[k]:.3f}x)" for k in keys if k != "torch")
            print(line, flush=True)
            rows.append({"shape": name, "mode": mode, "tflops": tflops, "ratio": ratio,
                         "ms": {k: per[(mode, k)] for k in keys}})
            if "auto" in ratio:
                summary.append((name, mode, tflops["torch"], tflops["auto"], ratio["auto"], ratio.get("old-auto")))
        if ("graph", "auto") in per and ("kernel", "auto") in per:
            extra = statistics.median([g - k for g, k in zip(per[("graph", "auto")], per[("kernel", "auto")])]) * 1e3
            print(f"{name:24s} auto: graph - kernel = {extra:.1f} µs per call (split-K's memset + conversion "
                  f"when it splits; ~0 otherwise)", flush=True)
        del timers, per
        if args.host:
            p, host = host_table(a, b)
            print(f"{name:24s} [host µs/call] auto = step {p.step} v{p.variant}, splits {p.splits}: " + "; ".join(
                f"{k.strip()} {v:.1f}" for k, v in host.items()), flush=True)
            rows.append({"shape": name, "mode": "host_us", "plan": p._asdict(), "host_us": host})
        torch.cuda.empty_cache()
    if summary:
        print("\nauto (the last step, as gemm.matmul(step=0) runs it) vs torch.matmul, median ratio over trials:")
        print(f"{'shape':24s} " + " ".join(f"{m + ' (torch, tk, ratio)':>30s}" for m in modes))
        for name in dict.fromkeys(s[0] for s in summary):
            cells = []
            for m in modes:
                hit = [s for s in summary if s[0] == name and s[1] == m]
                cells.append(f"{hit[0][2]:8.0f} {hit[0][3]:8.0f} {hit[0][4]:7.3f}x" if hit else f"{'-':>30s}")
                if hit and hit[0][5] is not None:
                    cells[-1] += f" (old-auto {hit[0][5]:.3f}x)"
            print(f"{name:24s} " + " ".join(f"{c:>30s}" for c in cells))
        print("eager: launched from Python (host path included); graph: both sides' kernels alone in CUDA "
              "graphs (tk's split-K memset/conversion included); kernel: tk's GEMM kernel alone vs torch graph.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

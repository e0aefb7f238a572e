"""Is the tk linear op (kernels/linear_op.py) a win in the GPT-2 training step? Two timings on one
GPU, both interleaved, for tests/gpu_linear_e2e.sh (session 9, G):

    python tests/linear_e2e_ab.py products [--trials 5]         # the op's products at 32k tokens
    python tests/linear_e2e_ab.py steps [--rounds 12 --per-round 4]   # whole training steps, A/B
    python tests/linear_e2e_ab.py clocks STEPS_LOG SMI_CSV       # SM clock and power per arm

products: the six GEMMs of the attention's c_attn (768 -> 2304) and c_proj (768 -> 768) at the
e2e step's M = 32768 tokens, each as the op runs it (gemm.matmul(step=0); dW stored in fp32) and
as torch.matmul (cuBLAS, bf16 out) runs it, plus the other split-K plans for the two dW products;
CUDA graphs of back-to-back calls, trials interleaved, TFLOP/s and the ratio to torch per trial
(median). Then the whole op, forward + backward under autocast with an fp32 weight, tk vs F.linear
(eager, events around back-to-back calls).

steps: ONE process, ONE model and optimizer (kernels/e2e_bench.py's training_step: train.py's
GPT-2 step, B=32, T=1024, bf16 autocast, AdamW, clipping), the switch's `linear` setting flipped
between rounds of `per-round` steps: torch (F.linear, cuBLAS; train.py's default), tk (this
session's op), tk-castout (the op as it was until session 9: the weight cast to bf16 outside
the core, dW rounded to bf16 and widened by the cast's backward) and tk-cublasfwd (the op with
linear_op.FORWARD = "cublas": y on cuBLAS, dx and dW on tk). The arms' order rotates every
round. Each step is timed by CUDA events; the first step of each round is dropped (it follows a
switch). Reported: median ms/step per arm, and the median of paired differences (each round's
arm median minus torch's in the same round); each arm-round's host span (unix seconds) is printed
so that a clock/power log (nvidia-smi) can be split by arm (`clocks` below). Everything else (the other ops, their settings) is
train.py's default plan. Runs on the CPU only as far as argument parsing and the model's build
(`--device cpu --model tiny` for a dry run of the loop).
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository


def tflops(flop, ms):
    return flop / (ms * 1e-3) / 1e12


# ---- products -------------------------------------------------------------------------------------

def products(args):
    from kernels import gemm
    from kernels.gemm_bench import capture, time_graph_ms
    M, C = 32768, 768
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
    f32 = torch.float32
    rows = []
    for layer, N in (("c_attn", 3 * C), ("c_proj", C)):
        x, w, dy = r(M, C), r(N, C) * C ** -0.5, r(M, N)
        cases = [(f"{layer} fwd {M}x{C}x{N}", x, w.t(), {"auto": {}}),
                 (f"{layer} dx  {M}x{N}x{C}", dy, w, {"auto": {}}),
                 (f"{layer} dW  {N}x{M}x{C}", dy.t(), x,
                  {"auto": {"out_dtype": f32}, "auto-bf16": {},
                   "5v7": {"out_dtype": f32, "step": 5, "variant": 7},
                   "5v10": {"out_dtype": f32, "step": 5, "variant": 10},
                   "4v9": {"out_dtype": f32, "step": 4, "variant": 9}})]
        for name, a, b, impls in cases:
            flop = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
            fns = {"torch": lambda a=a, b=b: torch.matmul(a, b)}
            for key, kw in impls.items():
                kw = {"step": 0, **kw}
                fns[key] = (lambda a=a, b=b, kw=kw: gemm.matmul(a, b, **kw))
            graphs = {k: capture(fn, args.iters) for k, fn in fns.items()}
            per = {k: [] for k in graphs}
            for _ in range(args.trials):
                for k, gr in graphs.items():
                    per[k].append(time_graph_ms(gr, args.iters, args.replays))
            line = f"{name:28s} torch {tflops(flop, statistics.median(per['torch'])):5.0f} TFLOP/s " \
                   f"({statistics.median(per['torch']) * 1e3:6.1f} us)"
            for k in impls:
                ratio = statistics.median([t / x for t, x in zip(per["torch"], per[k])])
                line += f" | {k} {tflops(flop, statistics.median(per[k])):5.0f} ({statistics.median(per[k]) * 1e3:6.1f} us) {ratio:.3f}x"
            print(line, flush=True)
            rows.append(line)
            del graphs
    whole_op(args)


def whole_op(args):
    """Forward + backward of one linear under bf16 autocast, fp32 weight, bf16 x (as in the step,
    where the layernorm and the attention hand bf16 activations over), tk vs F.linear; events
    around `iters` back-to-back calls (eager: the host path is included, as in the step)."""
    import torch.nn.functional as F
    from kernels import linear_op
    M, C = 32768, 768
    for layer, N in (("c_attn", 3 * C), ("c_proj", C)):
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(M, C, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
        w = (torch.randn(N, C, device="cuda", generator=g) * C ** -0.5).requires_grad_()
        dy = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)

        def run(fn):
            def call():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = fn(x, w)
                x.grad = w.grad = None
                y.backward(dy)
            return call
        fns = {"torch": run(F.linear), "tk": run(linear_op.linear)}
        per = {k: [] for k in fns}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        for _ in range(args.trials):
            for k, fn in fns.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.iters):
                    fn()
                end.record()
                end.synchronize()
                per[k].append(start.elapsed_time(end) / args.iters)
        ratio = statistics.median([t / k for t, k in zip(per["torch"], per["tk"])])
        print(f"whole op fwd+bwd {layer} M={M}: torch {statistics.median(per['torch']) * 1e3:.1f} us, "
              f"tk {statistics.median(per['tk']) * 1e3:.1f} us, torch/tk {ratio:.3f}x "
              f"(x12 layers: {12 * (statistics.median(per['torch']) - statistics.median(per['tk'])):+.3f} ms/step)", flush=True)


# ---- steps ----------------------------------------------------------------------------------------

ARMS = ("torch", "tk", "tk-castout", "tk-cublasfwd")


def castout_linear(x, weight, bias=None):
    """The op as it was before session 9: every input cast to bf16 outside the autograd core."""
    from kernels import linear_op
    return linear_op.linear(x, weight.to(torch.bfloat16), bias)


def steps(args):
    import kernels
    from kernels import e2e_bench, linear_op
    cuda = args.device.startswith("cuda")
    # on the CPU (a dry run of the loop) every op runs torch: the arms then differ only in name
    spec = {"model": args.model, "kernels": "tk" if cuda else "torch", "overrides": {"linear": "tk"} if cuda else {},
            "compile": None, "graphs": False, "device": args.device, "dtype": "auto", "dropout": 0.0}
    step, info = e2e_bench.training_step(spec)
    print(f"plan {info['plan']}, {info['tokens_per_step']} tokens/step", flush=True)
    base, forward = kernels.choice(), linear_op.FORWARD
    impl, why = kernels._tk_impls["linear"]
    arms = {"torch": ("torch", impl), "tk": ("tk", impl), "tk-castout": ("tk", castout_linear),
            "tk-cublasfwd": ("tk", impl)}
    names = [a for a in args.arms.split(",") if a]

    def use(arm):
        setting, fn = arms[arm]
        kernels.configure("torch", **{**base, "linear": setting if cuda else "torch"})
        kernels._tk_impls["linear"] = (fn, why)
        linear_op.FORWARD = "cublas" if arm == "tk-cublasfwd" else "tk"

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    i = 0
    for arm in names:                      # warm-up: every arm's extensions, plans, workspaces
        use(arm)
        for _ in range(args.warmup):
            step(i)
            i += 1
    sync()
    times = {a: [] for a in names}
    per_round = {a: [] for a in names}
    t0 = time.time()
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for arm in order:
            use(arm)
            events, ms, t_start = [], [], time.time()
            for s in range(args.per_round):   # as e2e_bench.time_steps: events, no sync between steps
                if cuda:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    loss = step(i)
                    e1.record()
                    events.append((e0, e1))
                else:
                    t1 = time.perf_counter()
                    loss = step(i)
                    ms.append((time.perf_counter() - t1) * 1e3)
                i += 1
            sync()
            print(f"span {arm} {t_start:.3f} {time.time():.3f}")   # to match nvidia-smi's clock/power log
            ms = [e0.elapsed_time(e1) for e0, e1 in events] if cuda else ms
            ms = ms[1:]                        # the first step of a round follows a switch: dropped
            if not torch.isfinite(loss):
                raise SystemExit(f"arm {arm}: loss is {loss.item()}")
            times[arm] += ms
            per_round[arm].append(statistics.median(ms))
        print(f"round {rnd}: " + ", ".join(f"{a} {per_round[a][-1]:.2f}" for a in names), flush=True)
    kernels.configure("torch", **base)
    kernels._tk_impls["linear"] = (impl, why)
    linear_op.FORWARD = forward
    print(f"\n{args.rounds} rounds x {args.per_round - 1} timed steps per arm ({time.time() - t0:.0f} s), "
          f"{info['tokens_per_step']} tokens/step:")
    ref = names[0]
    for a in names:
        med = statistics.median(times[a])
        diffs = [x - y for x, y in zip(per_round[a], per_round[ref])]
        print(f"  {a:11s} median {med:.3f} ms/step ({info['tokens_per_step'] / med * 1e3:,.0f} tok/s), "
              f"min {min(times[a]):.3f}, max {max(times[a]):.3f}; vs {ref} paired per round: median "
              f"{statistics.median(diffs):+.3f} ms, rounds faster {sum(d < 0 for d in diffs)}/{len(diffs)}", flush=True)


# ---- clocks ---------------------------------------------------------------------------------------

def clocks(steps_log, smi_csv):
    """Median SM clock and power per arm: nvidia-smi's samples (timestamp, clocks.sm, power.draw,
    ...: csv, noheader) that fall inside the arm's 'span ARM START END' lines of the steps log."""
    import collections
    import datetime
    spans = [line.split()[1:] for line in open(steps_log) if line.startswith("span ")]
    samples = []
    for line in open(smi_csv):
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(f[1].split()[0]), float(f[2].split()[0])))
        except (ValueError, IndexError):
            pass                           # a header or an error line
    per = collections.defaultdict(list)
    for arm, a, b in spans:
        per[arm] += [(c, p) for t, c, p in samples if float(a) <= t <= float(b)]
    for arm, v in per.items():
        if v:
            print(f"  {arm}: SM clock median {statistics.median(c for c, _ in v):.0f} MHz, power median "
                  f"{statistics.median(p for _, p in v):.0f} W ({len(v)} samples)")
        else:
            print(f"  {arm}: no clock samples inside its spans")


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["clocks"]:
        if len(argv) != 3:
            raise SystemExit("usage: linear_e2e_ab.py clocks STEPS_LOG SMI_CSV")
        return clocks(*argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["products", "steps"])
    ap.add_argument("--trials", type=int, default=5, help="products: interleaved trials")
    ap.add_argument("--iters", type=int, default=10, help="products: calls per graph / per timing")
    ap.add_argument("--replays", type=int, default=3, help="products: graph replays per timing")
    ap.add_argument("--rounds", type=int, default=12, help="steps: rounds (every arm once per round)")
    ap.add_argument("--per-round", type=int, default=4, help="steps: steps per arm per round (the first dropped)")
    ap.add_argument("--warmup", type=int, default=4, help="steps: warm-up steps per arm")
    ap.add_argument("--arms", default="torch,tk,tk-castout", help="steps: the first is the reference")
    ap.add_argument("--model", default="gpt2", help="steps: kernels/e2e_bench.py's MODELS key")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if args.per_round < 2 or args.rounds < 1:
        ap.error("--per-round >= 2 (the first step of a round is dropped), --rounds >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda but CUDA is not available here (a dry run: --device cpu --model tiny)")
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    if args.what == "products":
        if not args.device.startswith("cuda"):
            ap.error("products needs a GPU")
        products(args)
    else:
        steps(args)


if __name__ == "__main__":
    main()

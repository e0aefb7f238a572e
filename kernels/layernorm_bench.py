"""The LayerNorm kernels' plan variants against each other, in ONE process on one GPU.

    python -m kernels.layernorm_bench --json out/ln_variants.json    # ~30 s on an H200

What it measures (CUDA-graph replay, inputs rotating through enough sets to exceed twice the
L2 cache: bench.py's own timer), for each variant of kernels/layernorm.cu ("variants"):
  1. the forward kernel alone and the backward (its kernel + the column sum) alone, called
     through the extension, at bench.py's rows (all bf16, bf16 parameters: 16384x768 and
     65536x768) and at the model's shapes under bf16 autocast (fp32 residual stream h, bf16
     branch and y, fp32 parameters: GPT-2 32768x768, shakespeare 16384x384). The bytes each
     kernel must move are counted per dtype (the "floor" column: that many bytes at 4.0 TB/s);
  2. picks the forward and the backward flags with the least time summed over the four shapes
     (each shape's time relative to "none", session 2's plan, so every shape weighs the same);
  3. bench.py's fwd+bwd row (the public op under autograd, tk vs eager in the same run) for
     "none", the default plan (layernorm.cu's DEFAULT_PLAN), the pick, and the pick with
     bwd_reverse;
  4. a torch.profiler breakdown of that row (kernel by kernel) for eager, "none" and the pick.
Prints compact tables and a last line `BEST=<flags>` (tests/gpu_layernorm_speed.sh hands it to
bench.py through TK_LAYERNORM_VARIANT). No correctness checks here: tests/test_layernorm_variants.py.

    python -m kernels.layernorm_bench --dropout       # ~15 s: the residual dropout (session 4)

--dropout times only the fused residual dropout at shakespeare's 16384x384 (the model's mixed
dtypes under autocast, and all-bf16): per call fwd+bwd of the public op under autograd with
dropout fused, with F.dropout beside it (the unfused way), and without dropout, PyTorch eager
(x + F.dropout(r), F.layer_norm) in the same process; and the kernels alone with and without the
mask (tests/test_layernorm_dropout.py checks the values).

    python -m kernels.layernorm_bench --interleaved   # issue 4 (session 6): plans side by side
    python -m kernels.layernorm_bench --s5            # issue 4 (session 5): the default plan alone

--interleaved times the public op (fwd, fwd+bwd; bwd = the difference) for eager, torch.compile and
each --plans plan (the default first) in interleaved rounds of CUDA-graph replays, then the kernels
alone; --s5 the same rows for the default plan only, each timed on its own (the comments above
interleaved_rows and S5_SHAPES say more).

    python -m kernels.layernorm_bench --interleaved --mixed   # session 9: the GPT-2 step's op

--mixed makes --interleaved time the op as the GPT-2 step calls it under bf16 autocast (fp32 residual
stream x, h, dh; bf16 branch r, y, dy; fp32 w, b; PyTorch's twin casts y to bf16 as the next matmul
would), and the kernels alone at GPT-2's 32768x768 only.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

FLOOR_TBS = 4.0   # achievable H200 bandwidth for these mixes (copy ceiling 4.16 TB/s, peak 4.8)

F32, BF16 = torch.float32, torch.bfloat16
# name: (rows, cols, h dtype, branch dtype, y dtype, parameter dtype)
SHAPES = {
    "bench bf16 16384x768": (16384, 768, BF16, BF16, BF16, BF16),
    "bench bf16 65536x768": (65536, 768, BF16, BF16, BF16, BF16),
    "gpt2 mixed 32768x768": (32768, 768, F32, BF16, BF16, F32),
    "shakesp mixed 16384x384": (16384, 384, F32, BF16, BF16, F32),
}
FWD_VARIANTS = ["none", "fwd_full"]
BWD_VARIANTS = ["none", "pdl", "bwd_reverse", "bwd_tree", "bwd_tree,pdl"]
# --final (a GPU call with little time): the backward alone and the fwd+bwd row for these
# (session 3's final call also timed the default of call 2 with and without bwd_tree, then a
# candidate default; bwd_tree won and is in the default now)
FINAL_BWD = ["none", "default"]
FINAL_PLANS = ["none", "default"]


def kernel_bytes(rows, cols, th, tr, ty):
    """Bytes each kernel must move: forward reads x (h's dtype) and r, writes h and y; backward reads
    dy, dh and h, writes dh_out (and the bf16 branch's gradient when its dtype differs from h's)."""
    s = lambda dt: torch.finfo(dt).bits // 8
    n = rows * cols
    fwd = n * (s(th) + s(tr) + s(th) + s(ty))
    bwd = n * (s(ty) + s(th) + s(th) + s(th) + (s(tr) if tr != th else 0))
    return fwd, bwd


def make_sets(ext, rows, cols, th, tr, ty, tp, l2_bytes):
    """Input sets for the extension calls, each with its forward's h, mean and rstd."""
    def one(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        rnd = lambda *shape, dt: torch.randn(*shape, generator=g, device="cuda").to(dt)
        x, r = rnd(rows, cols, dt=th), rnd(rows, cols, dt=tr)
        w, b = rnd(cols, dt=tp), rnd(cols, dt=tp)
        dy, dh = rnd(rows, cols, dt=ty), rnd(rows, cols, dt=th)
        _, h, mean, rstd = ext.forward(x, r, w, b, 1e-5, y_bf16=(ty == BF16 and th == F32))
        return dict(x=x, r=r, w=w, b=b, dy=dy, dh=dh, h=h, mean=mean, rstd=rstd)
    first = one(0)
    size = sum(t.numel() * t.element_size() for t in first.values())
    n = max(2, min(6, -(-2 * l2_bytes // size)))
    return [first] + [one(i) for i in range(1, n)]


def kernel_rows(args, ln, l2_bytes, fwd_variants, bwd_variants, shapes=None):
    """Step 1: forward and backward alone, each variant, every shape (or those named). Returns
    {shape: {...}}."""
    from bench import time_graph_ms
    ext = ln._ext.module
    out = {}
    for name, (rows, cols, th, tr, ty, tp) in SHAPES.items():
        if shapes is not None and name not in shapes:
            continue
        sets = make_sets(ext, rows, cols, th, tr, ty, tp, l2_bytes)
        mixed, y_bf16 = tr != th, (ty == BF16 and th == F32)
        fwd_bytes, bwd_bytes = kernel_bytes(rows, cols, th, tr, ty)
        row = {"fwd_bytes": fwd_bytes, "bwd_bytes": bwd_bytes, "fwd_us": {}, "bwd_us": {}}

        def fwd(s):
            ext.forward(s["x"], s["r"], s["w"], s["b"], 1e-5, y_bf16=y_bf16)

        def bwd(s):
            ext.backward(s["dy"], s["dh"], s["h"], s["mean"], s["rstd"], s["w"], residual_grad_bf16=mixed)

        for kind, fn, variants in (("fwd_us", fwd, fwd_variants), ("bwd_us", bwd, bwd_variants)):
            for v in variants:
                ln.set_variant(v)
                try:
                    row[kind][v] = 1e3 * time_graph_ms(fn, sets, args.warmup, args.reps)
                except Exception as e:   # one failing variant must not hide the others
                    row.setdefault("errors", {})[f"{kind} {v}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        ln.set_variant("default")
        out[name] = row
        del sets
        torch.cuda.empty_cache()
    return out


def pick(rows, kind, variants):
    """The variant with the least time summed over the shapes, each relative to "none"'s."""
    score = {}
    for v in variants:
        rel = [r[kind][v] / r[kind]["none"] for r in rows.values() if v in r[kind] and "none" in r[kind]]
        if len(rel) == len(rows):
            score[v] = sum(rel) / len(rel)
    best = min(score, key=score.get) if score else "none"
    return best, score


def combine(*specs):
    flags = [f for s in specs for f in s.split(",") if f and f not in ("none", "default")]
    return ",".join(dict.fromkeys(flags)) or "none"


def step_rows(args, ln, l2_bytes, plans):
    """Step 3: bench.py's fwd+bwd cases (the public op under autograd; eager beside), per plan."""
    import bench
    out = {}
    for case in bench.layernorm_cases(quick=True):
        if not case.name.startswith("fwd+bwd"):
            continue
        sets = bench.input_sets(case, l2_bytes)
        row = {"bytes": case.work, "us": {}}
        for plan in ["eager"] + plans:
            if plan != "eager":
                ln.set_variant(plan)
            fn = case.impls["eager" if plan == "eager" else "tk"]
            try:
                row["us"][plan] = 1e3 * bench.time_graph_ms(lambda inp: case.step(fn, inp), sets, args.warmup, args.reps)
            except Exception as e:   # one failing plan must not hide the others
                row.setdefault("errors", {})[plan] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        ln.set_variant("default")
        out[case.name] = row
        del sets
        torch.cuda.empty_cache()
    return out


def profile_rows(ln, plans):
    """Step 4: kernel-by-kernel GPU time of bench.py's fwd+bwd step (one call, after warm-up)."""
    import bench
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for case in bench.layernorm_cases(quick=True):
        if not case.name.startswith("fwd+bwd"):
            continue
        inp = case.make_inputs()
        for impl, plan in [("eager", None)] + [("tk", p) for p in plans]:
            if plan is not None:
                ln.set_variant(plan)
            fn = case.impls[impl]
            for _ in range(3):
                case.step(fn, inp)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    case.step(fn, inp)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
                    kernels.setdefault(e.name, []).append(e.device_time_total)
            out[f"{case.name} {impl if plan is None else plan}"] = {
                k[:90]: (len(v) / 5, statistics.median(v)) for k, v in kernels.items()}
        ln.set_variant("default")
    return out


DROPOUT_SHAPES = {
    "shakesp mixed 16384x384": SHAPES["shakesp mixed 16384x384"],   # the model under bf16 autocast
    "shakesp bf16 16384x384": (16384, 384, BF16, BF16, BF16, BF16),
}
DROPOUT_P = 0.2   # config/shakespeare.py's


def dropout_rows(args, ln, l2_bytes, p=DROPOUT_P):
    """--dropout: {shape: {impl: us}} for the fwd+bwd step per call and the kernels alone."""
    import torch.nn.functional as F
    from bench import time_graph_ms
    ext = ln._ext.module
    out = {}
    for name, (rows, cols, th, tr, ty, tp) in DROPOUT_SHAPES.items():
        autocast = ty == BF16 and th == F32
        sets = make_sets(ext, rows, cols, th, tr, ty, tp, l2_bytes)
        for s in sets:
            for k in ("x", "r", "w", "b"):
                s[k].requires_grad_()
            s["seed"] = ln.draw_dropout_seed("cuda")
            s["dy32"] = s["dy"].float()   # eager's y is fp32 under autocast: its dy, cast outside the timing

        def tk_step(s, drop, fused):
            with torch.autocast("cuda", dtype=BF16, enabled=autocast):
                r = F.dropout(s["r"], p) if drop and not fused else s["r"]
                y, h = ln.add_layernorm(s["x"], r, s["w"], s["b"], 1e-5, p if drop and fused else 0.0)
            torch.autograd.grad((y, h), (s["x"], s["r"], s["w"], s["b"]), (s["dy"], s["dh"]))

        def eager_step(s, drop):
            with torch.autocast("cuda", dtype=BF16, enabled=autocast):
                h = s["x"] + (F.dropout(s["r"], p) if drop else s["r"])
                y = F.layer_norm(h, (cols,), s["w"], s["b"], 1e-5)
            dy = s["dy"] if y.dtype == s["dy"].dtype else s["dy32"]
            torch.autograd.grad((y, h), (s["x"], s["r"], s["w"], s["b"]), (dy, s["dh"]))

        mixed = tr != th
        impls = {
            "tk fused dropout": lambda s: tk_step(s, True, True),
            "tk + F.dropout": lambda s: tk_step(s, True, False),
            "tk no dropout": lambda s: tk_step(s, False, False),
            "eager dropout": lambda s: eager_step(s, True),
            "eager no dropout": lambda s: eager_step(s, False),
            # the kernels alone (no autograd, no seed draw): what the mask costs inside them
            "fwd kernel, mask": lambda s: ext.forward(s["x"], s["r"], s["w"], s["b"], 1e-5, y_bf16=autocast,
                                                      dropout_seed=s["seed"], dropout_p=p),
            "fwd kernel": lambda s: ext.forward(s["x"], s["r"], s["w"], s["b"], 1e-5, y_bf16=autocast),
            "bwd kernels, mask": lambda s: ext.backward(s["dy"], s["dh"], s["h"], s["mean"], s["rstd"], s["w"],
                                                        residual_grad_bf16=mixed, dropout_seed=s["seed"], dropout_p=p),
            "bwd kernels": lambda s: ext.backward(s["dy"], s["dh"], s["h"], s["mean"], s["rstd"], s["w"],
                                                  residual_grad_bf16=mixed),
        }
        row = {}
        for impl, fn in impls.items():
            try:
                row[impl] = 1e3 * time_graph_ms(fn, sets, args.warmup, args.reps)
            except Exception as e:   # one failing row must not hide the others
                row[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        out[name] = row
        del sets
        torch.cuda.empty_cache()
    return out


def print_dropout_rows(rows):
    print(f"\nresidual dropout p={DROPOUT_P}, per call, us (CUDA-graph replay, median)")
    for name, row in rows.items():
        print(f"  {name}")
        for impl, us in row.items():
            print(f"    {impl:<22}" + (f"{us:9.1f}" if isinstance(us, float) else f"  FAILED {us}"))
        f, u = row.get("tk fused dropout"), row.get("tk + F.dropout")
        e, n = row.get("eager dropout"), row.get("tk no dropout")
        if all(isinstance(v, float) for v in (f, u, e, n)):
            print(f"    fused saves {u - f:.1f} us a call over tk + F.dropout ({u / f:.2f}x); dropout costs the fused "
                  f"op {f - n:.1f} us; {e / f:.2f}x eager")


# --s5 (session 5, issue 4): bf16 rows x 768 as bench.py counts them, the default plan, PyTorch
# eager and torch.compile (default mode) in the same process, the forward, the backward and both.
# (Session 5 also timed "default,bwd_reverse" here; since session 6 the default plan includes
# bwd_reverse, so that row would time the same plan twice: --interleaved compares plans now.) (Session 5's calls 2 and 3 timed opt-in kernels here that lost
# and were removed: NOTES, "Session 5: L".)
# ---- the residual + LayerNorm step timed by --s5 and --interleaved, and its eager twin ----------

def eager_add_layernorm(x, r, w, b):
    import torch.nn.functional as F
    h = x + r
    return F.layer_norm(h, (h.shape[-1],), w, b, 1e-5), h


def step_sets(rows, cols, l2_bytes, device="cuda"):
    """Input sets [x, r, w, b, dy, dh] (bf16, fresh random), enough of them to cover twice the L2."""
    def make(seed):
        g = torch.Generator(device=device).manual_seed(seed)
        t = lambda *shape, grad=False: torch.randn(*shape, generator=g, device=device).to(BF16).requires_grad_(grad)
        return [t(rows, cols, grad=True), t(rows, cols, grad=True), t(cols, grad=True), t(cols, grad=True),
                t(rows, cols), t(rows, cols)]
    size = 6 * rows * cols * 2
    return [make(i) for i in range(max(2, min(6, -(-2 * l2_bytes // size))))]


def eager_add_layernorm_mixed(x, r, w, b):
    """The GPT-2 step's op under bf16 autocast, in PyTorch: fp32 h = fp32 x + bf16 r, LayerNorm in
    fp32 (autocast runs layer_norm in fp32), y cast to bf16 for the next matmul (autocast casts it
    there; the tk op writes bf16 y itself)."""
    import torch.nn.functional as F
    h = x + r
    return F.layer_norm(h, (h.shape[-1],), w, b, 1e-5).to(BF16), h


def step_sets_mixed(rows, cols, l2_bytes, device="cuda"):
    """Input sets [x, r, w, b, dy, dh] in the GPT-2 step's dtypes under autocast: fp32 x (the residual
    stream), bf16 r (the branch), fp32 w, b, bf16 dy (y feeds a bf16 matmul), fp32 dh."""
    def make(seed):
        g = torch.Generator(device=device).manual_seed(seed)
        t = lambda *shape, dt, grad=False: torch.randn(*shape, generator=g, device=device).to(dt).requires_grad_(grad)
        return [t(rows, cols, dt=F32, grad=True), t(rows, cols, dt=BF16, grad=True), t(cols, dt=F32, grad=True),
                t(cols, dt=F32, grad=True), t(rows, cols, dt=BF16), t(rows, cols, dt=F32)]
    size = rows * cols * (4 + 2 + 2 + 4)
    return [make(i) for i in range(max(2, min(6, -(-2 * l2_bytes // size))))]


def forward_step(inp, f):
    with torch.no_grad():
        f(*inp[:4])


def forward_backward_step(inp, f):
    y, h = f(*inp[:4])
    torch.autograd.grad((y, h), inp[:4], (inp[4], inp[5]))


S5_SHAPES = [(16384, 768), (32768, 768)]
S5_PLANS = ["default"]
S5_KERNEL_FWD = ["default"]   # the kernels alone
S5_KERNEL_BWD = ["default"]
S5_KERNEL_SHAPES = list(SHAPES)


def s5_rows(args, ln, l2_bytes):
    """{case: {impl: us}} for fwd and fwd+bwd (CUDA-graph replay medians), and bwd = fwd+bwd - fwd
    (a backward alone cannot be captured after a forward run outside the graph: autograd runs it
    on the forward's stream; call 2 of session 5 tried). tk's backward kernels alone are in the
    kernel rows."""
    from torch import _dynamo
    from bench import time_graph_ms

    def tk(x, r, w, b):
        return ln.add_layernorm(x, r, w, b, 1e-5)

    out = {}
    for rows, cols in S5_SHAPES:
        sets = step_sets(rows, cols, l2_bytes)
        _dynamo.reset()
        impls = {"eager": eager_add_layernorm, "compile": torch.compile(eager_add_layernorm, dynamic=False)}
        for plan in S5_PLANS:
            impls[f"tk {plan}"] = tk
        rows_out = {f"{kind} {rows}x{cols}": {} for kind in ("fwd", "bwd", "fwd+bwd")}   # bwd: the difference
        for impl, f in impls.items():
            if impl.startswith("tk "):
                ln.set_variant(impl[3:])

            fwd = lambda inp, f=f: forward_step(inp, f)
            fwd_bwd = lambda inp, f=f: forward_backward_step(inp, f)
            for kind, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                try:
                    rows_out[f"{kind} {rows}x{cols}"][impl] = 1e3 * time_graph_ms(fn, sets, args.warmup, args.reps)
                except Exception as e:   # one failing row must not hide the others
                    rows_out[f"{kind} {rows}x{cols}"][impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            both, fwd_only = rows_out[f"fwd+bwd {rows}x{cols}"][impl], rows_out[f"fwd {rows}x{cols}"][impl]
            if isinstance(both, float) and isinstance(fwd_only, float):
                rows_out[f"bwd {rows}x{cols}"][impl] = both - fwd_only
        ln.set_variant("default")
        out.update(rows_out)
        print_s5_rows(rows_out, header=(rows, cols) == S5_SHAPES[0])   # as it goes: a cut run keeps its rows
        del sets
        torch.cuda.empty_cache()
    return out


def print_s5_rows(rows, header=True):
    if header:
        print("\n--s5: bf16, us (CUDA-graph replay, median; bwd = fwd+bwd - fwd), bench.py's bytes (fwd 4, "
              "fwd+bwd 8 passes; bwd 4)")
    impls = list(dict.fromkeys(k for r in rows.values() for k in r))
    print(f"{'case':<22}" + "".join(f"{i:>26}" for i in impls))
    for name, r in rows.items():
        kind, shape = name.split()
        n, c = map(int, shape.split("x"))
        nbytes = {"fwd": 4, "bwd": 4, "fwd+bwd": 8}[kind] * n * c * 2
        line = f"{name:<22}"
        for i in impls:
            us = r.get(i)
            line += f"{us:9.1f} ({nbytes / us / 1e6:4.2f} TB/s)   " if isinstance(us, float) else f"{'FAILED':>26}"
        print(line)
        e = r.get("eager")
        if isinstance(e, float):
            print(" " * 22 + "  x eager: " + ", ".join(f"{i} {e / r[i]:.2f}x" for i in impls
                                                      if i != "eager" and isinstance(r.get(i), float)))
        for i in impls:
            if isinstance(r.get(i), str):
                print(f"   ! {i}: {r[i]}")


# --interleaved (session 6, issue 4): the same public-op rows as --s5 (fwd, fwd+bwd, bwd = the
# difference; bf16 rows x 768; eager and torch.compile beside), for several plans at once, timed
# INTERLEAVED: every (impl, kind) is captured into CUDA graphs first, then each round replays every
# one of them in turn (reps replays each, one event pair per replay), so a drift of the GPU's clock
# or of its neighbour's load over the run falls on all of them alike. The figure is the median of
# all rounds' replays; the spread is the range of the per-round medians.
INTERLEAVED_ROWS = [16384, 32768, 65536]
# the default (session 6's plan fwd_full,bwd_tree,pdl,fwd_early_pdl,bwd_l2_first2,bwd_reverse + the
# lean kernels fwd_lean, bwd_lean since session 8, + bwd_wide since session 9) against session 6's plan
INTERLEAVED_PLANS = ["default", "fwd_full,bwd_tree,pdl,fwd_early_pdl,bwd_l2_first2,bwd_reverse"]


def interleaved_rows(args, ln, l2_bytes, plans, rows_list, cols=768):
    """{case: {impl: {"us": median, "spread": (lo, hi) of the round medians}}}, printed shape by shape.
    args.mixed (session 9): the GPT-2 step's dtypes under bf16 autocast (step_sets_mixed) instead of
    bf16 everywhere, every step run under autocast."""
    import contextlib
    from torch import _dynamo

    def tk(x, r, w, b):
        return ln.add_layernorm(x, r, w, b, 1e-5)

    mixed = getattr(args, "mixed", False)
    eager_op = eager_add_layernorm_mixed if mixed else eager_add_layernorm

    def under_autocast(step):
        def run(inp, f):
            # (no autocast cache: steps are captured into CUDA graphs, and a cached cast would outlive its capture)
            with torch.autocast("cuda", dtype=BF16, cache_enabled=False) if mixed else contextlib.nullcontext():
                step(inp, f)
        return run

    out = {}
    for n, rows in enumerate(rows_list):
        sets = step_sets_mixed(rows, cols, l2_bytes) if mixed else step_sets(rows, cols, l2_bytes)
        _dynamo.reset()
        impls = {"eager": (eager_op, None)}
        if not args.no_compile:
            impls["compile"] = (torch.compile(eager_op, dynamic=False), None)
        for plan in plans:
            impls[f"tk {plan}"] = (tk, plan)

        graphs, errors = {}, {}
        for impl, (f, plan) in impls.items():
            for kind, step in (("fwd", under_autocast(forward_step)), ("fwd+bwd", under_autocast(forward_backward_step))):
                if plan is not None:
                    ln.set_variant(plan)   # read at launch: the graph keeps it
                try:
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):   # warm-up (and torch.compile's compile) before capture
                        for inp in sets:
                            step(inp, f)
                    torch.cuda.current_stream().wait_stream(side)
                    gs = []
                    for inp in sets:
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            step(inp, f)
                        gs.append(g)
                    graphs[(impl, kind)] = gs
                except Exception as e:   # one failing row must not hide the others
                    errors[(impl, kind)] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        ln.set_variant("default")

        samples = {key: [] for key in graphs}
        round_medians = {key: [] for key in graphs}
        for rnd in range(args.rounds + 1):   # round 0 warms up and is not counted
            for key, gs in graphs.items():
                starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.reps)]
                ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.reps)]
                for i in range(args.reps):
                    starts[i].record()
                    gs[i % len(gs)].replay()
                    ends[i].record()
                torch.cuda.synchronize()
                if rnd:
                    us = [1e3 * a.elapsed_time(b) for a, b in zip(starts, ends)]
                    samples[key] += us
                    round_medians[key].append(statistics.median(us))

        rows_out = {f"{kind} {rows}x{cols}": {} for kind in ("fwd", "bwd", "fwd+bwd")}
        for impl in impls:
            for kind in ("fwd", "fwd+bwd"):
                key = (impl, kind)
                cell = rows_out[f"{kind} {rows}x{cols}"]
                if key in errors:
                    cell[impl] = errors[key]
                elif samples.get(key):
                    cell[impl] = {"us": statistics.median(samples[key]),
                                  "spread": (min(round_medians[key]), max(round_medians[key]))}
            both, one = rows_out[f"fwd+bwd {rows}x{cols}"].get(impl), rows_out[f"fwd {rows}x{cols}"].get(impl)
            if isinstance(both, dict) and isinstance(one, dict):
                rows_out[f"bwd {rows}x{cols}"][impl] = {"us": both["us"] - one["us"], "spread": None}
        print_interleaved_rows(rows_out, header=n == 0, rounds=args.rounds, reps=args.reps, mixed=mixed)
        out.update(rows_out)
        del graphs, sets
        torch.cuda.empty_cache()
    return out


def print_interleaved_rows(rows, header, rounds, reps, mixed=False):
    if header:
        what = ("mixed (GPT-2 under autocast: fp32 x, h, dh; bf16 r, y, dy; fp32 w, b)" if mixed else "bf16")
        where = ("the bytes each kernel must move (fwd 12, bwd 16, fwd+bwd 28 bytes an element)" if mixed
                 else "bench.py's bytes (fwd 4, bwd 4, fwd+bwd 8 passes)")
        print(f"\n--interleaved: {what}, us (CUDA-graph replays, median of {rounds} interleaved rounds x {reps}; "
              f"[lo-hi] = range of the round medians; bwd = fwd+bwd - fwd); TB/s at {where}; x = eager's time / this")
    for name, r in rows.items():
        kind, shape = name.split()
        n, c = map(int, shape.split("x"))
        if mixed:
            fwd_bytes, bwd_bytes = kernel_bytes(n, c, F32, BF16, BF16)
            nbytes = {"fwd": fwd_bytes, "bwd": bwd_bytes, "fwd+bwd": fwd_bytes + bwd_bytes}[kind]
        else:
            nbytes = {"fwd": 4, "bwd": 4, "fwd+bwd": 8}[kind] * n * c * 2
        print(f"{name}")
        e = r.get("eager", {}).get("us") if isinstance(r.get("eager"), dict) else None
        for impl, v in r.items():
            if isinstance(v, str):
                print(f"   {impl:<52} FAILED {v}")
                continue
            spread = f"[{v['spread'][0]:6.1f}-{v['spread'][1]:6.1f}]" if v["spread"] else " " * 15
            ratio = f"{e / v['us']:5.2f}x" if e else ""
            print(f"   {impl:<52}{v['us']:8.1f} {spread} {nbytes / v['us'] / 1e6:5.2f} TB/s  {ratio}")


def write_json(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", default="")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--final", action="store_true",
                    help="only the backward alone and the fwd+bwd row, for the default plan and none")
    ap.add_argument("--dropout", action="store_true", help="only the residual dropout rows (session 4)")
    ap.add_argument("--interleaved", action="store_true",
                    help="issue 4 (session 6): fwd, bwd, fwd+bwd of the public op, bf16 rows x 768 (--rows), eager, "
                         "torch.compile and every --plans plan, timed in interleaved rounds; then the kernels alone")
    ap.add_argument("--plans", default=";".join(INTERLEAVED_PLANS),
                    help="--interleaved: plans separated by ';' (each a comma-separated list of flags)")
    ap.add_argument("--rows", default=",".join(map(str, INTERLEAVED_ROWS)), help="--interleaved: row counts")
    ap.add_argument("--rounds", type=int, default=5, help="--interleaved: timed rounds")
    ap.add_argument("--no-compile", action="store_true", help="--interleaved: leave torch.compile out")
    ap.add_argument("--no-kernels", action="store_true", help="--interleaved: leave the kernels-alone rows out")
    ap.add_argument("--mixed", action="store_true",
                    help="--interleaved: the GPT-2 step's dtypes under bf16 autocast (fp32 residual stream, bf16 "
                         "branch and y, fp32 parameters) instead of bf16 everywhere; kernels alone at GPT-2's shape only")
    ap.add_argument("--s5", action="store_true",
                    help="issue 4 (session 5): fwd, bwd, fwd+bwd at 16384x768 and 32768x768 bf16, the default plan, "
                         "eager and torch.compile, then the kernels alone")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels.layernorm_bench needs a CUDA GPU", file=sys.stderr)
        return 1
    from kernels import layernorm as ln
    reason = ln._ext.why_not()
    if reason:
        print(f"tk_layernorm unavailable: {reason}", file=sys.stderr)
        return 1
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
    print(f"{props.name}, {props.multi_processor_count} SMs, L2 {l2 / 2**20:.0f} MiB, torch {torch.__version__}; "
          f"floor = bytes at {FLOOR_TBS} TB/s; TK_LAYERNORM_VARIANT={os.environ.get('TK_LAYERNORM_VARIANT', '')!r}")
    t0 = time.time()
    if args.dropout:
        rows = dropout_rows(args, ln, l2)
        print_dropout_rows(rows)
        if args.json:
            write_json(args.json, {"gpu": props.name, "torch": torch.__version__, "dropout_p": DROPOUT_P, "dropout": rows})
        print(f"({time.time() - t0:.0f} s)")
        return 0

    if args.interleaved:
        plans = [p.strip() for p in args.plans.split(";") if p.strip()]
        for p in plans:
            ln.set_variant(p)   # an unknown flag fails here, before any timing
        ln.set_variant("default")
        rows = interleaved_rows(args, ln, l2, plans, [int(n) for n in args.rows.split(",")])
        alone = [p for p in plans if "bwd_reverse" not in p]   # (reverse order: a back-to-back effect only)
        kernels = {} if args.no_kernels else kernel_rows(args, ln, l2, alone, alone,
                                                         ["gpt2 mixed 32768x768"] if args.mixed else None)
        if kernels:
            print("\nkernels alone (extension calls; bwd = its kernel + the column sum), us (TB/s at the bytes each must move)")
        for name, r in kernels.items():
            print(f"  {name:<25} floor fwd {r['fwd_bytes'] / FLOOR_TBS / 1e6:.1f}, bwd {r['bwd_bytes'] / FLOOR_TBS / 1e6:.1f}")
            for kind, nbytes in (("fwd_us", r["fwd_bytes"]), ("bwd_us", r["bwd_bytes"])):
                print(f"     {kind[:3]}: " + " | ".join(f"{v} {us:.1f} ({nbytes / us / 1e6:.2f})" for v, us in r[kind].items()))
            for k, e in r.get("errors", {}).items():
                print(f"   ! {k}: {e}")
        if args.json:
            write_json(args.json, {"gpu": props.name, "torch": torch.__version__, "plans": plans, "interleaved": rows,
                                   "kernels": kernels})
        print(f"({time.time() - t0:.0f} s)")
        return 0

    if args.s5:
        rows = s5_rows(args, ln, l2)
        kernels = kernel_rows(args, ln, l2, S5_KERNEL_FWD, S5_KERNEL_BWD, S5_KERNEL_SHAPES)
        print("\nkernels alone (extension calls), us (TB/s at the bytes each must move; floor at 4.0 TB/s)")
        for name, r in kernels.items():
            cells = [f"fwd floor {r['fwd_bytes'] / FLOOR_TBS / 1e6:.1f}"]
            for v, us in r["fwd_us"].items():
                cells.append(f"fwd {v} {us:.1f} ({r['fwd_bytes'] / us / 1e6:.2f})")
            for v, us in r["bwd_us"].items():
                cells.append(f"bwd+colsum {v} {us:.1f} ({r['bwd_bytes'] / us / 1e6:.2f})")
            print(f"  {name:<25} " + " | ".join(cells) + f"; bwd floor {r['bwd_bytes'] / FLOOR_TBS / 1e6:.1f}")
            for k, e in r.get("errors", {}).items():
                print(f"   ! {k}: {e}")
        if args.json:
            write_json(args.json, {"gpu": props.name, "torch": torch.__version__, "s5": rows, "kernels": kernels})
        print(f"({time.time() - t0:.0f} s)")
        return 0

    fwd_variants, bwd_variants = ([], FINAL_BWD) if args.final else (FWD_VARIANTS, BWD_VARIANTS)
    rows = kernel_rows(args, ln, l2, fwd_variants, bwd_variants)
    for kind, label in (("fwd_us", "forward kernel"), ("bwd_us", "backward kernel + column sum")):
        variants = fwd_variants if kind == "fwd_us" else bwd_variants
        if not variants:
            continue
        print(f"\n{label}: us (TB/s)")
        print(f"{'shape':<25}{'floor':>8}" + "".join(f"{v:>22}" for v in variants))
        for name, r in rows.items():
            nbytes = r[kind.replace("_us", "_bytes")]
            line = f"{name:<25}{nbytes / FLOOR_TBS / 1e6:8.1f}"
            for v in variants:
                us = r[kind].get(v)
                line += f"{us:10.1f} ({nbytes / us / 1e6:4.2f} TB/s)" if us else f"{'failed':>22}"
            print(line)
            for k, e in r.get("errors", {}).items():
                print(f"   ! {k}: {e}")
    best_fwd, fwd_score = pick(rows, "fwd_us", fwd_variants)
    best_bwd, bwd_score = pick(rows, "bwd_us", bwd_variants)
    print(f"\nmean time relative to none, forward: { {k: round(v, 3) for k, v in fwd_score.items()} }")
    print(f"mean time relative to none, backward: { {k: round(v, 3) for k, v in bwd_score.items()} }")
    best = combine(best_fwd, best_bwd)
    default = ln.set_variant("default")   # layernorm.cu's DEFAULT_PLAN, as flags
    if args.final:
        plans = FINAL_PLANS
    else:
        plans = list(dict.fromkeys(["none", "default", best, combine(best, "bwd_reverse")]))
    print(f"default plan: {default}; picked: {best}")

    steps = step_rows(args, ln, l2, plans)
    print("\nbench.py's fwd+bwd row (public op under autograd), us (TB/s counted as bench.py does), eager/tk")
    print(f"{'case':<28}{'eager':>10}" + "".join(f"{p:>34}" for p in plans))
    for name, r in steps.items():
        eager = r["us"].get("eager", float("nan"))
        line = f"{name:<28}{eager:10.1f}"
        for p in plans:
            us = r["us"].get(p)
            line += f"{us:10.1f} ({r['bytes'] / us / 1e6:4.2f} TB/s, {eager / us:4.2f}x)" if us else f"{'failed':>34}"
        print(line)
        for k, e in r.get("errors", {}).items():
            print(f"   ! {k}: {e}")

    try:
        prof = {} if args.no_profile else profile_rows(ln, FINAL_PLANS[1:] if args.final else
                                                        list(dict.fromkeys(["none", "default", best])))
    except Exception as e:
        print(f"profile failed: {type(e).__name__}: {e}")
        prof = {}
    for name, kernels in prof.items():
        total = sum(n * us for n, us in kernels.values())
        print(f"\nprofile {name}: {total:.1f} us of kernels per step")
        for k, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
            print(f"   {us:8.1f} us x{n:g}  {k}")

    if args.json:
        write_json(args.json, {"gpu": props.name, "torch": torch.__version__, "floor_tbs": FLOOR_TBS, "kernels": rows,
                               "best_fwd": best_fwd, "best_bwd": best_bwd, "steps": steps, "profile": prof})
    print(f"({time.time() - t0:.0f} s)")
    print(f"BEST={best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

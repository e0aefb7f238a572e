"""Benchmarks: tk kernels vs torch eager vs torch.compile, each comparison in ONE run (absolute
GPU figures drift 10% between runs, so only ratios measured together mean anything).

    python bench.py                                   op level: every registered op, all shapes
    python bench.py --ops layernorm --quick           one op, its headline shapes only
    python bench.py --ops layernorm --json out/bench.json --compile-modes default
    python bench.py --e2e --json out/e2e.json         training tokens/s and MFU (below)
    python bench.py --profile --models gpt2 --kernels tk   per-kernel profile of a training step
    python bench.py --plot out/bench.json             redraw the PNGs of an existing JSON

Every mode writes its figures, with the GPU, versions and commit, to --json, and PNGs next to
it (kernels/bench_plot.py): <stem>_ops.png (the op table), <stem>_e2e.png (tokens/s bars).

--e2e (kernels/e2e_bench.py): whole optimizer steps of model.py's GPT (forward under autocast,
backward, grad clipping, AdamW from model.configure_optimizers, zero_grad) on random tokens,
timed with CUDA events per step after --warmup steps (compilation excluded), median of --reps
steps; tokens/s = B*T / median; MFU from model.flops_per_token() and train.py's peak table.
  --models gpt2,shakespeare-char    gpt2: 12/12/768, vocab 50304, B=32, T=1024;
                                    shakespeare-char: 6/6/384, vocab 65, B=64, T=256; tiny (CPU test)
  --variants torch,torch+graphs,torch+compile,tk,tk+graphs,tk+compile   (the default; each starts
                                    from train.py's per-op settings, so tk runs the linears on
                                    torch (kernels_linear); overrides may follow: tk/linear=tk)
                                    '+compile' runs once per --compile-modes entry
                                    (reduce-overhead there = CUDA graphs); torch.compile's figure in
                                    the ratios is its best mode's; '+graphs' replays forward+backward
                                    from a CUDA graph (train.py's cuda_graphs; GPU only)
  --e2e-timeout 300                 seconds per variant (each runs in its own process)
  --device cuda|cpu, --dtype auto|bfloat16|float32   (--device cpu: host timers, for the CI test)
The defaults make 16 variant processes and 8 compiles (4 of them max-autotune, minutes each
for GPT-2): on a short lease pass --compile-modes default, and build the tk extensions first
(the first tk variant otherwise builds them inside its warm-up).
--profile: torch.profiler over --profile-steps steps after --warmup steps, for each of --models
with --kernels (tk|torch|auto) and --profile-compile (a compile mode; '' = eager). Written to
<json stem>_profile_<model>_<kernels>.txt: the GPU kernels by total time per step (top
--profile-rows), then torch's key_averages() table sorted by self CUDA time.

Op-level method: CUDA-event timing of each call after warm-up, median of --reps calls; the inputs rotate
through enough sets to exceed twice the L2 cache (so the figures are DRAM, not L2); every set is
fresh random data (never zeros). torch.compile's figure is the better of the modes in
--compile-modes (default and max-autotune-no-cudagraphs), each compiled for the exact shape.
Throughput is the case's counted work (bytes moved or flops) over the median time.

Adding an op: write a function that yields `Case`s and decorate it with `@register("name")`,
here or in a kernels/<module>.py listed in kernels.OP_MODULES (`bench.register` is importable
there: `from bench import Case, register` inside a function, so kernels/ never needs bench.py).
A Case says what one call does (`step`) with which forward function (`impls`), and how much
work it counts.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Case:
    op: str                                  # 'layernorm'
    name: str                                # 'fwd+bwd 16384x768 bf16'
    unit: str                                # 'TB/s' or 'TFLOP/s'
    work: float                              # bytes (TB/s) or flops (TFLOP/s) counted per call
    make_inputs: Callable[[], tuple]         # one fresh random input set (on the GPU)
    step: Callable[[Callable, tuple], None]  # step(forward_fn, inputs): what one timed call does
    impls: dict = field(default_factory=dict)   # 'tk' / 'eager' -> forward_fn; 'compile' is
    compile_from: str = "eager"                 # torch.compile(impls[compile_from])
    compile: bool = True                        # measure torch.compile for this case
    note: str = ""


REGISTRY = {}   # op -> function(quick) yielding Cases


def register(op):
    def wrap(fn):
        REGISTRY[op] = fn
        return fn
    return wrap


# ---- timing --------------------------------------------------------------------------------

def input_sets(case, l2_bytes, max_sets=8):
    """Enough fresh input sets that rotating through them touches > 2x the L2 cache."""
    first = case.make_inputs()
    size = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
    n = max(2, min(max_sets, math.ceil(2 * l2_bytes / max(size, 1))))
    return [first] + [case.make_inputs() for _ in range(n - 1)]


def time_ms(fn, sets, warmup, reps):
    """Median milliseconds of fn(inputs) over reps calls, rotating through the input sets, timed
    with CUDA events around each call. Includes any time the GPU waits for Python to launch."""
    for i in range(warmup):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_graph_ms(fn, sets, warmup, reps):
    """The same, but each input set's call is captured once in a CUDA graph and replayed: the GPU
    time of the kernels alone, without Python and launch overhead between them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # warm-up before capture, as torch asks
        for inp in sets:
            fn(inp)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for inp in sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(inp)
        graphs.append(g)
    return time_ms(lambda g: g.replay(), graphs, warmup, reps)


def measure(row, key, fn, sets, args):
    """Record plain and graph-replay medians of fn under `key`; a failure is recorded, not raised."""
    for table, timer in (("ms", time_graph_ms), ("ms_no_graph", time_ms)):
        try:
            row[table][key] = timer(fn, sets, args.warmup, args.reps)
        except Exception as e:   # one failing implementation must not hide the others' figures
            row.setdefault("errors", {})[f"{key} ({table})"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def run_case(case, args, l2_bytes):
    from torch import _dynamo
    sets = input_sets(case, l2_bytes)
    row = {"op": case.op, "case": case.name, "unit": case.unit, "work": case.work, "note": case.note,
           "ms": {}, "ms_no_graph": {}}
    for impl, fwd in case.impls.items():
        measure(row, impl, lambda inp, f=fwd: case.step(f, inp), sets, args)
    modes = args.compile_modes if case.compile else []
    best = None
    for mode in modes:
        _dynamo.reset()
        t0 = time.time()
        compiled = torch.compile(case.impls[case.compile_from], mode=None if mode == "default" else mode, dynamic=False)
        key = f"compile:{mode}"
        measure(row, key, lambda inp: case.step(compiled, inp), sets, args)
        row.setdefault("compile_seconds", {})[mode] = round(time.time() - t0, 1)
        if key in row["ms"] and (best is None or row["ms"][key] < row["ms"][best]):
            best = key
    if best:
        row["ms"]["compile"] = row["ms"][best]
        row["ms_no_graph"]["compile"] = row["ms_no_graph"].get(best, float("nan"))
        row["compile_mode"] = best.split(":", 1)[1]
    scale = 1e-12 if case.unit in ("TB/s", "TFLOP/s") else 1.0
    row["throughput"] = {k: case.work * scale / (v * 1e-3) for k, v in row["ms"].items()}
    row["throughput_no_graph"] = {k: case.work * scale / (v * 1e-3) for k, v in row["ms_no_graph"].items()}
    del sets
    torch.cuda.empty_cache()
    return row


# ---- layernorm: fused residual add + LayerNorm ---------------------------------------------

@register("layernorm")
def layernorm_cases(quick):
    """h = x + r, y = LN(h). fwd counts 4 passes of rows x cols (x, r in; h, y out); fwd+bwd 8
    (backward reads h, dy and the residual grad dh, writes the grad of x and r)."""
    import kernels
    from kernels import layernorm as tk_ln

    def eager(x, r, w, b):
        h = x + r
        return F.layer_norm(h, (h.shape[-1],), w, b, 1e-5), h

    def tk(x, r, w, b):
        return tk_ln.add_layernorm(x, r, w, b, 1e-5)

    def fwd(f, inp):
        with torch.no_grad():
            f(*inp[:4])

    def fwd_bwd(f, inp):
        x, r, w, b, dy, dh = inp
        y, h = f(x, r, w, b)
        torch.autograd.grad((y, h), (x, r, w, b), (dy, dh))   # grads returned, never accumulated

    shapes = [(16384, 768), (65536, 768)] if quick else \
        [(16384, 384), (16384, 768), (65536, 768), (16384, 1024), (16384, 1600), (16384, 4096)]
    dtype = torch.bfloat16
    for rows, cols in shapes:
        def make(rows=rows, cols=cols):
            def t(*shape, grad=False, dt=dtype):
                return torch.randn(*shape, device="cuda", dtype=dt).requires_grad_(grad)
            # bf16 parameters too: eager F.layer_norm refuses bf16 input with fp32 weight
            return (t(rows, cols, grad=True), t(rows, cols, grad=True), t(cols, grad=True),
                    t(cols, grad=True), t(rows, cols), t(rows, cols))
        tensor_bytes = rows * cols * torch.finfo(dtype).bits // 8
        for name, step, passes in (("fwd", fwd, 4), ("fwd+bwd", fwd_bwd, 8)):
            yield Case("layernorm", f"{name} {rows}x{cols} bf16", "TB/s", passes * tensor_bytes, make, step,
                       impls={"tk": tk, "eager": eager}, compile=not (quick and name == "fwd"),
                       note=f"{passes} passes of rows x cols")
    kernels.configure("auto")


# ---- attention: causal flash attention, tk vs SDPA's backends (kernels/attention_bench.py) ----

@register("attention")
def attention_cases(quick):
    """tk (as model.py dispatches it, Hopper forward, portable) vs SDPA forced to FA2, cuDNN and
    memory-efficient; causal bf16 forward and forward+backward at issue 5's shapes."""
    from kernels import attention_bench
    return attention_bench.cases(Case, quick)


# ---- lm_head: the LM head + cross-entropy, fused (kernels/lm_head_bench.py) ------------------

@register("lm_head")
def lm_head_cases(quick):
    """tk (chunked, gradient in the forward) vs eager F.linear + F.cross_entropy and torch.compile
    of it, under bf16 autocast, at GPT-2's training shape (32768 x 768 x 50304)."""
    from kernels import lm_head_bench
    return lm_head_bench.cases(Case, quick)


# ---- driver --------------------------------------------------------------------------------

def environment():
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO).stdout.strip()
        except Exception:
            return ""
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {"gpu": p.name, "sms": p.multi_processor_count, "l2_bytes": getattr(p, "L2_cache_size", 0),
               "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) or "unknown"}
    else:   # --e2e/--profile on the CPU
        gpu = {"gpu": f"none (CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
               "sms": 0, "l2_bytes": 0, "driver": "none"}
    return {**gpu,
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            # GIT_COMMIT first: a tree copied from `git archive` onto a machine whose own .git is
            # stale (the GPU machine) names its commit there, and is then exactly that commit
            "git_commit": os.environ.get("GIT_COMMIT") or sh(["git", "rev-parse", "HEAD"]) or "unknown",
            "git_dirty": not os.environ.get("GIT_COMMIT")
                         and bool(sh(["git", "status", "--porcelain", "--untracked-files=no"])),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def discover():
    """Import the kernel modules so ones that register bench cases do so."""
    import kernels
    for name in kernels.OP_MODULES:
        try:
            __import__(f"kernels.{name}")
        except ImportError:
            pass


def print_table(rows, table="ms"):
    cols = ["tk", "eager", "compile"]
    tp = "throughput" + table[2:]
    print(f"\n{'op':<10} {'case':<26} {'unit':<8}" + "".join(f"{c + ' ms':>12}{c:>9}" for c in cols)
          + f"{'tk/eager':>10}{'tk/compile':>12}")
    for r in rows:
        line = f"{r['op']:<10} {r['case']:<26} {r['unit']:<8}"
        for c in cols:
            ms, rate = r[table].get(c), r[tp].get(c)
            line += f"{ms:12.4f}{rate:9.2f}" if ms is not None else f"{'-':>12}{'-':>9}"
        for base in ("eager", "compile"):
            if "tk" in r[table] and base in r[table]:
                line += f"{r[table][base] / r[table]['tk']:{10 if base == 'eager' else 12}.2f}x"
            else:
                line += f"{'-':>{10 if base == 'eager' else 12}} "
        print(line)
        for k, v in r.get("errors", {}).items() if table == "ms" else ():
            print(f"{'':<10} ! {k}: {v}")


def write_json(path, env, args, **tables):
    """The JSON every mode writes (environment, arguments, its rows), and its PNGs beside it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"environment": env, "args": vars(args), **tables}, f, indent=1)
    print(f"wrote {path}")
    plot(path)


def plot(path):
    try:
        from kernels import bench_plot
        for png in bench_plot.plot_json(path):
            print(f"wrote {png}")
    except ImportError as e:   # the figures are still in the JSON
        print(f"no PNG written ({e}): pip install matplotlib, then python bench.py --plot {path}",
              file=sys.stderr)


def env_line(env):
    return (f"{env['gpu']} ({env['sms']} SMs), driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, "
            f"commit {env['git_commit'][:12]}{' (dirty)' if env['git_dirty'] else ''}, {env['date_utc']} UTC")


def main_e2e(args, env):
    from kernels import e2e_bench
    try:
        specs = list(e2e_bench.variant_specs(args.models, args.variants, args.compile_modes, args.device,
                                             args.dtype, args.warmup, args.reps))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"--e2e: {len(specs)} variants, each in its own process, {args.warmup} warm-up + {args.reps} timed "
          f"steps on {args.device}")
    rows = e2e_bench.run_e2e(args.models, args.variants, args.compile_modes, args.device, args.dtype,
                             args.warmup, args.reps, args.e2e_timeout)
    print("\n" + e2e_bench.format_table(rows))
    if args.json:
        write_json(args.json, env, args, e2e=rows)
    return 0


def main_profile(args, env):
    from kernels import e2e_bench
    stem = os.path.splitext(args.json or "bench.json")[0]
    for model in args.models:
        if model not in e2e_bench.MODELS:
            print(f"error: unknown model {model!r} in --models; choose from {', '.join(e2e_bench.MODELS)}",
                  file=sys.stderr)
            return 2
        kernels, _, _ = args.kernels.partition("/")
        try:
            if kernels not in ("tk", "torch", "auto"):
                raise ValueError(f"--kernels {args.kernels!r}: start with tk, torch or auto (per-op overrides may follow, e.g. tk/linear=tk)")
            _, overrides = e2e_bench.split_variant("tk" + args.kernels[len(kernels):])   # overrides only
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        spec = {"model": model, "kernels": kernels, "overrides": overrides, "compile": args.profile_compile or None,
                "device": args.device, "dtype": args.dtype, "warmup": args.warmup, "dropout": args.dropout}
        tag = args.kernels.replace("/", "_").replace("=", "-")
        path = f"{stem}_profile_{model}_{tag}{'_compile' if args.profile_compile else ''}.txt"
        text = e2e_bench.profile(spec, args.profile_steps, args.profile_rows, path, env_line(env))
        print(text)
        print(f"wrote {path}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="", help="comma-separated ops (default: all registered)")
    ap.add_argument("--quick", action="store_true", help="headline shapes only")
    ap.add_argument("--reps", type=int, default=50, help="timed calls (--e2e: timed training steps)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls/steps first")
    ap.add_argument("--compile-modes", default="default,max-autotune-no-cudagraphs",
                    help="torch.compile modes to try ('' to skip torch.compile)")
    ap.add_argument("--json", default="bench.json", help="where to write every figure")
    ap.add_argument("--plot", metavar="JSON", help="only redraw the PNGs of an existing JSON")
    e2e = ap.add_argument_group("end to end (--e2e, --profile)")
    e2e.add_argument("--e2e", action="store_true", help="training tokens/s and MFU instead of the op bench")
    e2e.add_argument("--profile", action="store_true", help="per-kernel profile of training steps")
    e2e.add_argument("--models", default="", help="gpt2,shakespeare-char (default; --profile: gpt2), or tiny")
    e2e.add_argument("--variants", default="torch,torch+graphs,torch+compile,tk,tk+graphs,tk+compile",
                     help="--e2e's variants")
    e2e.add_argument("--e2e-timeout", type=int, default=300, help="seconds per --e2e variant")
    e2e.add_argument("--kernels", default="tk",
                     help="--profile's kernels: tk, torch or auto, per-op overrides may follow (tk/linear=tk)")
    e2e.add_argument("--profile-compile", default="", help="--profile under this torch.compile mode")
    e2e.add_argument("--profile-steps", type=int, default=3)
    e2e.add_argument("--dropout", type=float, default=0.0,
                     help="--profile's residual/embedding dropout (0 as the e2e timings; shakespeare trains with 0.2)")
    e2e.add_argument("--profile-rows", type=int, default=30)
    e2e.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    e2e.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    args = ap.parse_args(argv)
    args.compile_modes = [m for m in args.compile_modes.split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    args.models = [m for m in args.models.split(",") if m] or (["gpt2"] if args.profile else ["gpt2", "shakespeare-char"])
    if args.plot:
        plot(args.plot)
        return 0
    if args.e2e or args.profile:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            print("error: --device cuda but CUDA is not available here; use --device cpu", file=sys.stderr)
            return 1
        env = environment()
        if args.e2e:
            print(env_line(env))
            return main_e2e(args, env)
        return main_profile(args, env)   # its text starts with the environment line
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU (only --e2e and --profile run with --device cpu)", file=sys.stderr)
        return 1
    from torch import _dynamo
    _dynamo.config.cache_size_limit = 64   # one compile per shape and mode: stay under the limit
    discover()
    ops = [o for o in args.ops.split(",") if o] or list(REGISTRY)
    unknown = [o for o in ops if o not in REGISTRY]
    if unknown:
        print(f"unknown op(s) {unknown}; registered: {sorted(REGISTRY)}", file=sys.stderr)
        return 2
    env = environment()
    print(env_line(env))
    rows = []
    for op in ops:
        for case in REGISTRY[op](args.quick):
            row = run_case(case, args, env["l2_bytes"] or 50 * 2**20)
            rows.append(row)
            print(f"  {row['op']} {row['case']}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in row["ms"].items()),
                  flush=True)
    print("\nlaunched from Python (events around each call; includes launch overhead):")
    print_table(rows, "ms_no_graph")
    print("\nCUDA-graph replay (GPU time of the kernels; the headline figures):")
    print_table(rows, "ms")
    print("(throughput in the unit column; tk/eager = eager time / tk time; compile = better of "
          "the modes run, see the JSON)")
    if args.json:
        write_json(args.json, env, args, results=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

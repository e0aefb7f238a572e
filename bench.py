"""Op-level benchmarks: tk kernel vs torch eager vs torch.compile, in ONE run (absolute GPU
figures drift 10% between runs, so only ratios measured together mean anything).

    python bench.py                                   every registered op, all shapes
    python bench.py --ops layernorm --quick           one op, its headline shapes only
    python bench.py --ops layernorm --json out/bench.json --compile-modes default

Method: CUDA-event timing of each call after warm-up, median of --reps calls; the inputs rotate
through enough sets to exceed twice the L2 cache (so the figures are DRAM, not L2); every set is
fresh random data (never zeros). torch.compile's figure is the better of the modes in
--compile-modes (default and max-autotune-no-cudagraphs), each compiled for the exact shape.
Throughput is the case's counted work (bytes moved or flops) over the median time.

Adding an op: write a function that yields `Case`s and decorate it with `@register("name")`,
here or in a kernels/<module>.py listed in kernels.OP_MODULES (`bench.register` is importable
there: `from bench import Case, register` inside a function, so kernels/ never needs bench.py).
A Case says what one call does (`step`) with which forward function (`impls`), and how much
work it counts. There is no end-to-end (training tokens/s) mode here yet: train.py prints
tokens/s and MFU itself (`--kernels=tk` vs `--kernels=torch`).
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


# ---- driver --------------------------------------------------------------------------------

def environment():
    p = torch.cuda.get_device_properties(0)
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO).stdout.strip()
        except Exception:
            return ""
    return {"gpu": p.name, "sms": p.multi_processor_count, "l2_bytes": getattr(p, "L2_cache_size", 0),
            "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) or "unknown",
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "git_commit": sh(["git", "rev-parse", "HEAD"]) or os.environ.get("GIT_COMMIT", "unknown"),
            "git_dirty": bool(sh(["git", "status", "--porcelain", "--untracked-files=no"])),
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="", help="comma-separated ops (default: all registered)")
    ap.add_argument("--quick", action="store_true", help="headline shapes only")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--compile-modes", default="default,max-autotune-no-cudagraphs",
                    help="torch.compile modes to try ('' to skip torch.compile)")
    ap.add_argument("--json", default="bench.json", help="where to write every figure")
    args = ap.parse_args(argv)
    args.compile_modes = [m for m in args.compile_modes.split(",") if m]
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU", file=sys.stderr)
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
    print(f"{env['gpu']} ({env['sms']} SMs), driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, "
          f"commit {env['git_commit'][:12]}{' (dirty)' if env['git_dirty'] else ''}")
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
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), "results": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tests/mlp_dgelu_ncu_case.py — why is the MLP's dGELU GEMM (dh = dy·W2, dpre = dh ⊙ gelu'(pre),
M x 3072 out, K = 768) ~170 µs at M = 16384 when a plain product of the same shape runs ~100?
(kernels/NOTES.md, session 7 M, "Next session's first measurement (M2)".) Run by
tests/gpu_mlp_dgelu_ncu.sh; not a pytest file (no test_ prefix). Written in session 7 (M2), not
yet run on a GPU.

The cases (one kernel each; dy (M, C), W2 = w_proj (C, H), operands as the backward passes them):
  a  the backward's dGELU GEMM as the default runs it (fast=1 on step 4, side jobs on, bias grads)
  b  fcfast=5: c_fc saved gelu'(pre); the dGELU epilogue is one product (deferred, in half boxes)
  c  fast=3: the dGELU epilogue deferred in half boxes, pre by TMA
  d  the plain product dy·W2 by gemm.matmul(step=0) (step 4 v8: plain epilogue, deferred stores)
  e  the same by step 4 v0 (the general, non-deferred epilogue)
  f  the same by step 4 v6 (the plain epilogue, not deferred)                    [extra]
  g  a with side=0 (no dW-buffer zeroing nor dy column sums inside the kernel)   [extra]
  h  a without bias gradients (GPT-2's bias=False: no db1 partials, no dy sums)  [extra]
  i  b with side=0 and no bias gradients: beside the plain product only the gelu'(pre) read
     and one product per value (the leanest dGELU this code has)                 [extra]
  j, k  b and c without bias gradients (what GPT-2's bias=False step would run)  [extra]
Why g-k: with bias gradients the producer's 3 idle warps sum dy's columns (dgelu_epilogue::
side_job, inherited by dgelu_fast and dgelu_parts): one dependent load per row, ~2 x 124 trips to
memory per thread at M = 16384, which session 4 suspected of being as long as the GEMM itself
(kernels/mlp_epilogues.cuh, dgelu_pre_tma_epilogue's comment). If so it is a floor under a, b and
c alike, and mlp_bench (biases on) could not see fast=3 / fcfast=5 gain.
For a-c and g-i the script runs the whole backward (kernels/mlp_op.py _ext_backward); ncu picks
the dGELU kernel out by name (the shell's regex 'dgelu|plain_epilogue|linear_epilogue').

Modes:
  --mode ncu      warm-up (2 calls per case, outside any NVTX range), then ONE call per case inside
                  the NVTX push/pop range 'ncu' (ncu --nvtx --nvtx-include 'ncu/'), then checks of
                  the results against float references. --warmup 0 --no-nvtx: the fallback when
                  ncu's NVTX filter profiled nothing (ncu then takes the first launches).
  --mode time     CUDA events, --rounds interleaved rounds (each starts one case further), --iters
                  back-to-back calls per case and round: a-c, g-i time the WHOLE backward, d-f the
                  kernel alone (gemm.kernel_only); then the profiler's per-kernel time of the
                  dGELU (or plain) kernel, one pass of --iters calls per case.
  --list          print the cases and exit (no GPU needed)
  --summarize RAW [--source SRC]   read `ncu --page raw --csv` (and `--page source --csv`) output
                  and print the summary table (no GPU needed)
"""
import argparse
import csv
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# letter: (what, kind, schedule spec or (step, variant), bias_grads, kernel-name fragments ncu should show)
CASES = {
    "a": ("session 7's default dGELU (fast=1, step 4, side jobs, bias grads)", "bwd", "fcfast=4", True, ("dgelu_fast", "gemm_ws_kernel")),
    "b": ("fcfast=5 (gelu'(pre) saved; one product, deferred)", "bwd", "fcfast=5", True, ("dgelu_parts", "parts_kernel")),
    "c": ("fast=3 (deferred half boxes, pre by TMA)", "bwd", "fast=3", True, ("dgelu_parts", "parts_kernel")),
    "d": ("plain dy.W2, matmul(step=0) = 4v8", "gemm", (0, 0), None, ("deferred_plain", "gemm_ws_kernel")),
    "e": ("plain dy.W2, step 4 v0 (not deferred)", "gemm", (4, 0), None, ("linear_epilogue", "gemm_ws_kernel")),
    "f": ("plain dy.W2, step 4 v6 (plain, not deferred)", "gemm", (4, 6), None, ("plain_epilogue", "gemm_ws_kernel")),
    "g": ("a with side=0", "bwd", "fcfast=4,side=0", True, ("dgelu_fast", "gemm_ws_kernel")),
    "h": ("a without bias grads (GPT-2 bias=False)", "bwd", "fcfast=4", False, ("dgelu_fast", "gemm_ws_kernel")),
    "i": ("fcfast=5,side=0, no bias grads (leanest)", "bwd", "fcfast=5,side=0", False, ("dgelu_parts", "parts_kernel")),
    "j": ("b without bias grads (GPT-2's fcfast=5)", "bwd", "fcfast=5", False, ("dgelu_parts", "parts_kernel")),
    "k": ("c without bias grads (GPT-2's fast=3)", "bwd", "fast=3", False, ("dgelu_parts", "parts_kernel")),
}
NCU_REGEX = "dgelu|plain_epilogue|linear_epilogue"   # the shell passes this to ncu -k regex:...


def parse_cases(text, cases=CASES, script="mlp_dgelu_ncu_case.py"):
    """'a,c,e' -> ['a', 'c', 'e'], each a key of `cases` (mlp_fc_ncu_case passes its own)."""
    letters = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in letters if c not in cases]
    if bad or not letters:
        raise SystemExit(f"{script}: --cases must be letters from {','.join(cases)} "
                         f"separated by commas (got {text!r})")
    return letters


def gelu_and_grad(pre):
    """GELU(tanh) and its derivative in pre's dtype (float references for the case checks)."""
    import torch
    c = 0.7978845608028654   # sqrt(2 / pi)
    th = torch.tanh(c * (pre + 0.044715 * pre ** 3))
    return 0.5 * pre * (1 + th), 0.5 * (1 + th) + 0.5 * pre * (1 - th * th) * c * (1 + 3 * 0.044715 * pre * pre)


# ---- the GPU part -----------------------------------------------------------------------------

def require_cuda():
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("mlp_dgelu_ncu_case.py: --mode ncu/time needs a CUDA GPU (an H200: the kernels are "
                         "sm_90a); none is visible here. --list and --summarize run without one.")


def make_inputs(M, C, H):
    """The backward's inputs from the tk forward: pre (fcfast=4, session 7's default) and gp (fcfast=5's
    gelu'(pre) saved in pre's place, the default since session 8), h; plus the plain product's
    launches (gemm.kernel_only)."""
    import torch
    from kernels import mlp_op
    g = torch.Generator(device="cuda").manual_seed(M)
    r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)
    x, w1, b1, w2, b2, dy = r(M, C), r(H, C, scale=C ** -0.5), r(H, scale=0.5), r(C, H, scale=H ** -0.5), r(C, scale=0.5), r(M, C)
    mlp_op.set_schedule("fcfast=4")
    _, pre, h = mlp_op._ext_forward(x, w1, b1, w2, b2)
    mlp_op.set_schedule("fcfast=5")
    _, gp, h5 = mlp_op._ext_forward(x, w1, b1, w2, b2)
    mlp_op.set_schedule("0")
    torch.cuda.synchronize()
    return dict(x=x, w1=w1, w2=w2, dy=dy, pre=pre, h=h, gp=gp, h5=h5)


def make_calls(letters, t):
    """{letter: (schedule spec or None, fn)}; fn() launches the case once (returns its outputs)."""
    from kernels import gemm, mlp_op
    calls = {}
    for k in letters:
        what, kind, spec, bias, _ = CASES[k]
        if kind == "bwd":
            gp = "fcfast=5" in spec
            P, hh = (t["gp"], t["h5"]) if gp else (t["pre"], t["h"])
            calls[k] = (spec, lambda P=P, hh=hh, bias=bias, gp=gp: mlp_op._ext_backward(
                t["dy"], t["x"], P, hh, t["w1"], t["w2"], bias_grads=bias, saved=int(gp)))
        else:
            step, variant = spec
            p = gemm.plan(t["dy"], t["w2"], step=step, variant=variant)
            print(f"  case {k}: gemm plan step {p.step} v{p.variant}, B mode {p.b_mode!r}, splits {p.splits}")
            launch, c = gemm.kernel_only(t["dy"], t["w2"], step=step, variant=variant)
            calls[k] = (None, lambda launch=launch, c=c: (launch(), c)[1])
    return calls


def run(calls, k):
    from kernels import mlp_op
    spec, fn = calls[k]
    if spec is not None:
        mlp_op.set_schedule(spec)
        if VERBOSE and k not in _shown:
            _shown.add(k)
            print(f"  case {k}: schedule {spec!r}, bias_grads={CASES[k][3]} -> {list(mlp_op._ext.module.get_schedule())}",
                  flush=True)
    return fn()


VERBOSE = False
_shown = set()


def check(letters, outs, t):
    """Each case's result against float references (after the measured calls: not profiled)."""
    dh = t["dy"].float() @ t["w2"].float()
    _, gelu_grad = gelu_and_grad(t["pre"].float())
    dx_ref = (dh * gelu_grad) @ t["w1"].float()
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
    for k in letters:
        out = outs[k]
        err = rel(out[0], dx_ref) if CASES[k][1] == "bwd" else rel(out, dh)
        what = "dx vs float ref" if CASES[k][1] == "bwd" else "dh vs float ref"
        print(f"  check {k}: {what}: rel err {err:.2e} {'OK' if err < 2e-2 else 'BAD'}")


def mode_ncu(args, letters):
    t = make_inputs(args.M, args.C, args.H)
    calls = make_calls(letters, t)
    outs = launch_for_ncu(calls, letters, run, args.warmup, nvtx=not args.no_nvtx)
    check(letters, outs, t)
    print("ncu case done")


def launch_for_ncu(calls, letters, run, warmup, nvtx=True):
    """Each case once, in `letters` order, inside an NVTX range "ncu" (ncu's filter), after `warmup`
    rounds outside it; returns {letter: outputs} for the caller's check. `run(calls, k)` sets the
    case's schedule and launches it. Shared with tests/mlp_fc_ncu_case.py. Leaves the default
    schedule set."""
    import torch
    from kernels import mlp_op
    for _ in range(warmup):                   # outside the NVTX range: ncu skips these
        for k in letters:
            run(calls, k)
    torch.cuda.synchronize()
    print(f"measured order: {','.join(letters)}", flush=True)
    outs = {}
    if nvtx:
        torch.cuda.nvtx.range_push("ncu")
    for k in letters:
        outs[k] = run(calls, k)
        torch.cuda.synchronize()
    if nvtx:
        torch.cuda.nvtx.range_pop()
    mlp_op.set_schedule("0")
    return outs


def mode_time(args, letters):
    t = make_inputs(args.M, args.C, args.H)
    calls = make_calls(letters, t)
    for k in letters:
        run(calls, k)
    time_cases(calls, letters, CASES, NCU_REGEX, args.rounds, args.iters,
               "bwd = the WHOLE backward, gemm = the kernel alone")
    print("time case done")


def time_cases(calls, letters, cases, regex, rounds, iters, kinds, prefix=""):
    """Time each case's call ({letter: (schedule spec or None, fn)}, warmed up) in `rounds` rounds of
    `iters` back-to-back calls, the case order rotated each round (CUDA events, µs per call); then the
    kernel the case is about alone: the profiler's (CUPTI) time of the kernels matching `regex` over
    one pass of `iters` calls. `kinds` says what a call of each kind times; `cases` maps a letter to
    (description, kind, ...). Shared by this script and tests/mlp_fc_ncu_case.py. Leaves the
    default schedule set."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from kernels import mlp_op
    from kernels.gemm_bench import time_ms

    def use(k):
        spec, fn = calls[k]
        if spec is not None:
            mlp_op.set_schedule(spec)
        return fn

    per = {k: [] for k in letters}
    for rnd in range(rounds):
        for k in letters[rnd % len(letters):] + letters[:rnd % len(letters)]:
            per[k].append(time_ms(use(k), iters) * 1e3)
    print(f"{prefix}CUDA events, {rounds} interleaved rounds of {iters} back-to-back calls (µs per call; {kinds}):")
    for k in letters:
        v = per[k]
        print(f"  {k} {cases[k][1]:4s} median {statistics.median(v):8.1f}  min {min(v):8.1f}  max {max(v):8.1f}   {cases[k][0]}")
    print(f"{prefix}profiler (CUPTI) time of the matching kernel alone, one pass of {iters} calls per case:")
    for k in letters:
        fn = use(k)
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if total > 0 and re.search(regex, e.key) and not e.key.startswith("cuda"):   # the kernel, not its launch
                rows.append((e.key, total / e.count, e.count))
        for name, us, n in rows[:2]:
            print(f"  {k} {us:8.1f} µs x{n:<3d} {cases[k][0]:42s} {name[:90]}")
        if not rows:
            print(f"  {k} no matching kernel seen by the profiler")
    mlp_op.set_schedule("0")


# ---- the summary (no GPU) ---------------------------------------------------------------------

SCALE = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,     # -> µs
         "ns": 1e-3, "us": 1.0, "ms": 1e3,                                    # (what ncu 2025's --print-units base wrote)
         "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "Tbyte": 1e6,   # -> MB
         "KB": 1e-3, "MB": 1.0, "GB": 1e3}


def _num(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_raw(path):
    """ncu --page raw --csv: a header row, a units row, one row per kernel -> [{metric: (value, unit)}]."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith(("==", "==="))]
    start = next((i for i, r in enumerate(rows) if "gpu__time_duration.sum" in r or "Kernel Name" in r), None)
    if start is None:
        return []
    head, units = rows[start], rows[start + 1] if start + 1 < len(rows) else []
    out = []
    for r in rows[start + 2:]:
        if len(r) < len(head) // 2 or r[0] == head[0]:
            continue
        row = {h: (v, units[i] if i < len(units) else "") for i, (h, v) in enumerate(zip(head, r))}
        for alt in ("Demangled Name", "Function Name", "Name"):          # whichever name column this ncu prints
            if "Kernel Name" not in row and alt in row:
                row["Kernel Name"] = row[alt]
        out.append(row)
    return out


def metric(row, name, to=None):
    if name not in row:
        return None
    v, unit = row[name]
    x = _num(v)
    if x is not None and to and unit in SCALE:
        x *= SCALE[unit]
    return x


def stall_reasons(row, top=4):
    """The largest warp-state stalls (cycles per issued instruction) of WarpStateStats."""
    pat = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
    got = []
    for name in row:
        m = pat.match(name)
        if m and "not_issued" not in name:
            x = metric(row, name)
            if x is not None:
                got.append((x, m.group(1)))
    return sorted(got, reverse=True)[:top]


def summarize_raw(path, letters, cases=None):
    """cases: the case table whose name fragments the kernels are checked against (default this
    file's CASES; tests/mlp_fc_ncu_case.py passes its own)."""
    cases = CASES if cases is None else cases
    rows = read_raw(path)
    print(f"ncu (clocks locked by ncu, caches flushed per pass; {len(rows)} kernels in {os.path.basename(path)}; "
          f"cases in launch order {','.join(letters)})")
    if not rows:
        print("  no kernel rows: see ncu.log (did the NVTX filter or the kernel regex match nothing?)")
        return
    if len(rows) != len(letters):
        print(f"  WARNING: {len(rows)} kernels for {len(letters)} cases: the mapping below is by order and may be wrong")
    hdr = (f"  {'case':4s} {'us':>7s} {'DRAM rd MB':>10s} {'wr MB':>6s} {'DRAM %':>6s} {'GB/s':>6s} {'L2 hit%':>7s} "
           f"{'issue%':>6s} {'tensor%':>7s} {'cyc/iss':>7s} {'inst M':>6s}  top stalls (cycles per issued instruction)")
    print(hdr)
    for k, row in zip(letters + ["?"] * len(rows), rows):
        us = metric(row, "gpu__time_duration.sum", to="us")
        rd = metric(row, "dram__bytes_read.sum", to="MB")
        wr = metric(row, "dram__bytes_write.sum", to="MB")
        gbs = (rd + wr) / us * 1e3 if None not in (rd, wr, us) and us else None
        issue = metric(row, "smsp__issue_active.avg.pct_of_peak_sustained_active")
        if issue is None:
            issue = metric(row, "sm__inst_issued.avg.pct_of_peak_sustained_active")
        vals = [us, rd, wr, metric(row, "dram__throughput.avg.pct_of_peak_sustained_elapsed"), gbs,
                metric(row, "lts__t_sector_hit_rate.pct"), issue,
                metric(row, "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
                metric(row, "smsp__average_warp_latency_per_inst_issued.ratio"),
                None if metric(row, "smsp__inst_executed.sum") is None else metric(row, "smsp__inst_executed.sum") / 1e6]
        fmt = lambda x, w, p: f"{x:{w}.{p}f}" if x is not None else f"{'n/a':>{w}s}"
        widths = [(7, 1), (10, 1), (6, 1), (6, 1), (6, 0), (7, 1), (6, 1), (7, 1), (7, 2), (6, 1)]
        stalls = ", ".join(f"{n} {x:.2f}" for x, n in stall_reasons(row))
        print(f"  {k:4s} " + " ".join(fmt(v, w, p) for v, (w, p) in zip(vals, widths)) + f"  {stalls}")
    print("  kernels (name check: the fragment the case should show):")
    for k, row in zip(letters + ["?"] * len(rows), rows):
        name = row.get("Kernel Name", ("?", ""))[0]
        frags = cases[k][4] if k in cases else ()
        ok = "ok" if any(f in name for f in frags) else f"MISMATCH (expected {' or '.join(frags)})"
        regs = metric(row, "launch__registers_per_thread")
        smem = metric(row, "launch__shared_mem_per_block_dynamic")
        occ = metric(row, "sm__warps_active.avg.pct_of_peak_sustained_active")
        extra = (f" regs {regs:.0f}" if regs is not None else "") + (f" dyn smem {smem:.0f}" if smem is not None else "") + \
                (f" warps active {occ:.1f}%" if occ is not None else "")
        print(f"    {k}: {ok}{extra}  {name[:150]}")


def summarize_source(path, letters, top=12):
    """ncu --page source --csv --print-source sass: per kernel, the stall samples by reason and the
    SASS lines with the most samples. Consecutive blocks of the same kernel name are one kernel
    (ncu 2025 printed each kernel twice)."""
    blocks, cur = [], None
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                cur = {"name": r[1] if len(r) > 1 else "?", "head": None, "rows": []}
                blocks.append(cur)
            elif cur is not None and r[0] == "Address":
                cur["head"] = r
            elif cur is not None and cur["head"] and r[0].startswith("0x"):   # one SASS instruction
                cur["rows"].append(r)
    kernels = []
    for b in blocks:
        if kernels and kernels[-1]["name"] == b["name"] and len(kernels[-1]["rows"]) == len(b["rows"]):
            continue                                  # the same kernel printed again
        kernels.append(b)
    print(f"ncu source counters (PC sampling; {len(kernels)} kernels; cases {','.join(letters)})")
    if len(kernels) != len(letters):
        print(f"  WARNING: {len(kernels)} kernels for {len(letters)} cases: mapped by order, extra kernels not shown")
    for k, b in zip(letters, kernels):
        head = b["head"] or []
        idx = {h: i for i, h in enumerate(head)}
        si = idx.get("Warp Stall Sampling (All Samples)")
        if si is None:
            print(f"  {k}: no 'Warp Stall Sampling' column: {b['name'][:100]}")
            continue
        reasons = [h for h in head if h.startswith("stall_") and "(Not Issued)" not in h]
        totals = {h: 0.0 for h in reasons}
        lines = []
        for r in b["rows"]:
            cell = lambda h: (_num(r[idx[h]]) or 0.0) if idx[h] < len(r) else 0.0
            s = cell("Warp Stall Sampling (All Samples)")
            if not s:
                continue
            for h in reasons:
                totals[h] += cell(h)
            lines.append((s, r[1].strip() if len(r) > 1 else "?", max(reasons, key=cell) if reasons else "stall_?"))
        all_s = sum(s for s, _, _ in lines) or 1.0
        rank = sorted(totals.items(), key=lambda kv: -kv[1])[:6]
        print(f"  {k}: {len(b['rows'])} SASS lines, {all_s:.0f} samples; by reason: "
              + ", ".join(f"{h[6:]} {100 * v / all_s:.0f}%" for h, v in rank) + f"   {b['name'][:90]}")
        for s, src, why in sorted(lines, reverse=True)[:top]:
            print(f"      {100 * s / all_s:5.1f}%  {why[6:]:14s} {src[:90]}")


def main(argv=None):
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("ncu", "time"), help="what to run on the GPU")
    ap.add_argument("--cases", default="a,b,c,d,e,f,g,h,i,j,k", help="case letters, in launch order (see --list)")
    ap.add_argument("--M", type=int, default=16384)
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--H", type=int, default=3072)
    ap.add_argument("--warmup", type=int, default=2, help="ncu mode: calls per case before the measured one")
    ap.add_argument("--no-nvtx", action="store_true", help="ncu mode: no NVTX range (the fallback)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--summarize", metavar="RAW_CSV", help="summarize `ncu --page raw --csv` output")
    ap.add_argument("--source", metavar="SRC_CSV", help="with --summarize: also `ncu --page source --csv` output")
    ap.add_argument("--source-cases", default=None, help="the cases of the source CSV (default: --cases)")
    ap.add_argument("--verbose", action="store_true", help="print each case's schedule as the extension holds it")
    args = ap.parse_args(argv)
    VERBOSE = args.verbose
    letters = parse_cases(args.cases)
    if args.M < 1 or args.C % 64 or args.H % 64 or args.C < 64 or args.H < 64:
        raise SystemExit(f"mlp_dgelu_ncu_case.py: need M >= 1 and C, H positive multiples of 64 (got M={args.M}, "
                         f"C={args.C}, H={args.H})")
    if args.summarize or args.source:                  # (no torch needed)
        if args.summarize:
            summarize_raw(args.summarize, letters)
        if args.source:
            summarize_source(args.source, parse_cases(args.source_cases) if args.source_cases else letters)
        return
    from kernels import mlp_op
    for k in letters:                                  # a bad schedule spec fails here, before any GPU work
        if CASES[k][1] == "bwd":
            mlp_op.parse_schedule(CASES[k][2])
    if args.list:
        print(f"M={args.M} C={args.C} H={args.H} bf16; ncu kernel regex {NCU_REGEX!r}")
        for k in letters:
            print(f"  {k}  {CASES[k][1]:4s}  {CASES[k][0]}")
        return
    if not args.mode:
        ap.error("give --mode ncu|time, --list or --summarize")
    require_cuda()
    print(f"M={args.M} C={args.C} H={args.H} bf16, cases {','.join(letters)}", flush=True)
    (mode_ncu if args.mode == "ncu" else mode_time)(args, letters)


if __name__ == "__main__":
    main()

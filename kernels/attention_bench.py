"""bench.py's attention rows: causal flash attention, tk against PyTorch SDPA's backends, in one run.

    python bench.py --ops attention --compile-modes "" --json out/attention.json [--quick]
    python -m kernels.attention_bench out/attention.json [--png out/attention_tflops.png]
        the same rows again as TFLOP/s, each with its ratio to sdpa-cudnn and to the best SDPA
        backend of the same row (bench.py's own table has only the tk / eager / compile columns)
    python -m kernels.attention_bench --interleave gpt2,t4096-d128 --impls tk,tk-hopper-v21,sdpa-cudnn
        [--direction fwd] [--rounds 7] [--reps 20] [--json out/interleaved.json]
        the named implementations timed in turns (round r times each of them once, starting with
        a different one each round; CUDA-graph replay, events around each replay): bench.py times
        one implementation after the other, so a clock or thermal drift during the run lands on
        whichever comes later; here it is spread over all of them. Each round's median per
        implementation, then the median and range over the rounds. What decides a default.
    python -m kernels.attention_bench --host gpt2
        host (CPU) microseconds per forward call, layer by layer down the tk path (the op, the
        Hopper module's forward with its Python checks, the bindings alone) and cuDNN's SDPA:
        calls are queued without synchronising, so this is what Python and the launch cost,
        not the kernel (which is shorter than the call at the shapes where it matters).

Registered in bench.py (`@register("attention")`). One Case per shape and direction (fwd, or
fwd+bwd), holding every implementation below that can run it:

  tk              the kernels package's attention with kernels_attention=tk, called as model.py
                  calls it: kernels.attention_qkv(qkv) where that exists (the packed op: q, k, v
                  read in place, d(qkv) written as one tensor), else kernels.attention(q, k, v) on
                  the views. On sm_90 the Hopper forward + the Hopper backward; elsewhere portable
  tk-hopper       the Hopper backend pinned (attention_op pinned to 'hopper'); fwd rows only: on
                  sm_90 its fwd+bwd is the 'tk' row
  tk-hopper-vN    the same with forward variant N (2, 4, 5, 8, 11-13, 21, 26, 30, 33, 37: kernels/attention_hopper.py VARIANTS);
                  fwd rows only, and only when named in TK_BENCH_ATTENTION_IMPLS
  tk-portable     the portable kernel for both passes (attention_op pinned to 'portable'), through
                  the same entry as 'tk'
  eager           kernels/reference.py's attention(_qkv): SDPA with torch's own backend choice,
                  what --kernels=torch trains with
  sdpa-flash, sdpa-cudnn, sdpa-efficient
                  SDPA with one backend forced (torch.nn.attention.sdpa_kernel): FA2, cuDNN,
                  memory-efficient; on the q, k, v views of qkv, as reference.py calls it

Each implementation first runs once on the row's real inputs, outside the timing. One that
refuses (an SDPA backend that does not take the shape, tk-hopper anywhere but sm_90, tk without
CUDA) is left out of that row; the reason is printed and kept in the row's note. A failure later,
inside the timing, is bench.py's to record (the row's "errors"). The outputs of those that run (y,
and d(qkv) for fwd+bwd) are compared with eager's: the largest relative error goes in the note,
and one above MISMATCH (2e-2) is printed and noted as a MISMATCH (still timed, never hidden).

Inputs and outputs are what training has: qkv is c_attn's output seen as (B, T, 3, H, D) bf16
(the SDPA rows take its strided (B, H, T, D) views q, k, v, no copies); every implementation
returns y as (B, T, H, D), and fwd+bwd differentiates y against qkv with a contiguous (B, T, H, D)
output gradient, as y.reshape(B, T, C) hands it back. So fwd+bwd counts what training pays for the
gradient of qkv: for the SDPA rows (and tk through kernels.attention) that includes unbind's
backward, a stack of dq, dk, dv into one buffer (not timed apart here; see the attention_qkv
commit d58a7eb for its profile), while the packed tk op writes d(qkv) directly. Each row's note says which entry 'tk' went through.

Work (issue 5): causal forward 4·B·H·T²·D / 2 flops; forward+backward 3.5x that.
Timing is bench.py's own (run_case): CUDA-graph replay (the headline: GPU time of the kernels)
and per-call CUDA events (includes what Python adds), median of --reps after --warmup, inputs
rotating through fresh random sets bigger than twice the L2 cache. No torch.compile rows
(compile=False): compiling a call to SDPA or to our custom op runs the same kernels.

Shapes: gpt2 (16, 12, 1024, 64) GPT-2 124M; shakespeare-char (64, 6, 256, 64); t4096-d128
(4, 16, 4096, 128) -- the issue's three -- and t2048-d64, t2048-d128 (8, 16, 2048, D).
--quick: only the four rows issue 5's "done when" names (gpt2 fwd and fwd+bwd, shakespeare-char
fwd+bwd, t4096-d128 fwd+bwd).
Environment, to narrow a run (a bad name is refused with the list of good ones):
  TK_BENCH_ATTENTION_SHAPES=gpt2,t4096-d128     these shapes only
  TK_BENCH_ATTENTION_IMPLS=tk,sdpa-cudnn         these implementations only
"""
import argparse
import functools
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from kernels.attention_hopper import VARIANTS as HOPPER_VARIANTS   # builds nothing at import

SHAPES = {  # name -> (B, H, T, D)
    "gpt2": (16, 12, 1024, 64),               # GPT-2 124M: 12 heads of 64, T = 1024
    "shakespeare-char": (64, 6, 256, 64),     # config/shakespeare.py's model and batch
    "t4096-d128": (4, 16, 4096, 128),         # long sequences, big heads
    "t2048-d64": (8, 16, 2048, 64),
    "t2048-d128": (8, 16, 2048, 128),
}
DIRECTIONS = ("fwd", "fwd+bwd")
QUICK_ROWS = (("gpt2", "fwd"), ("gpt2", "fwd+bwd"), ("shakespeare-char", "fwd+bwd"), ("t4096-d128", "fwd+bwd"))
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}   # name -> torch.nn.attention.SDPBackend member
IMPLS = ("tk", "tk-hopper", "tk-portable", "eager") + tuple(SDPA_BACKENDS)
# The Hopper forward's variants one by one (kernels/attention_hopper.py VARIANTS but 0), timed only
# when named in TK_BENCH_ATTENTION_IMPLS (e.g. tk-hopper-v4,tk-hopper-v8): to compare them in one run.
HOPPER_VARIANT_IMPLS = tuple(f"tk-hopper-v{n}" for n in sorted(HOPPER_VARIANTS) if n)
FORWARD_ONLY = ("tk-hopper",) + HOPPER_VARIANT_IMPLS   # timed forward only: on sm_90 the fwd+bwd is the 'tk' row
CUDNN = "sdpa-cudnn"


# ---- what is measured: shapes, work, inputs, the two steps -----------------------------------

def flops(B, H, T, D, direction):
    """Counted work of one call: causal forward 4·B·H·T²·D / 2 (half the scores are masked),
    forward+backward 3.5x that (the backward is 2.5 forwards' worth of matrix products)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}; got {direction!r}")
    forward = 4 * B * H * T * T * D / 2
    return forward * (3.5 if direction == "fwd+bwd" else 1.0)


def selected(variable, choices, extra=()):
    """The names listed in environment variable `variable` (comma-separated), all of `choices`
    if it is unset or empty (`extra` names are taken only when listed); ValueError naming the
    variable and the good names for a bad one."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return list(choices)
    names = [n.strip() for n in text.split(",") if n.strip()]
    good = tuple(choices) + tuple(extra)
    bad = [n for n in names if n not in good]
    if bad:
        raise ValueError(f"{variable}: unknown name(s) {', '.join(map(repr, bad))}; "
                         f"choose from {', '.join(good)} (comma-separated), or unset it for all")
    return names


def plan(quick):
    """[(shape name, (B, H, T, D), direction)] of the rows to run, in order."""
    rows = [(name, SHAPES[name], d) for name in selected("TK_BENCH_ATTENTION_SHAPES", SHAPES) for d in DIRECTIONS]
    return [r for r in rows if (r[0], r[2]) in QUICK_ROWS] if quick else rows


def make_inputs(B, H, T, D, device="cuda"):
    """(qkv, dy), fresh random: qkv (B, T, 3, H, D) as model.py's c_attn output (needs grad), dy
    the gradient of y (B, T, H, D), contiguous."""
    qkv = torch.randn(B, T, 3, H, D, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, T, H, D, device=device, dtype=torch.bfloat16)
    return qkv, dy


def split_qkv(qkv):
    """(B, T, 3, H, D) -> q, k, v, each a (B, H, T, D) view (no copy), as model.py splits it."""
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def forward_step(attend, inputs):
    qkv, _ = inputs
    with torch.no_grad():
        attend(qkv)


def forward_backward_step(attend, inputs):
    qkv, dy = inputs
    y = attend(qkv)
    torch.autograd.grad(y, qkv, dy)   # the gradient returned, never accumulated


STEPS = {"fwd": forward_step, "fwd+bwd": forward_backward_step}


# ---- the implementations ---------------------------------------------------------------------

def on_views(attention):
    """attend(qkv) -> y (B, T, H, D) from attention(q, k, v, causal=True) -> (B, H, T, D)."""
    def attend(qkv):
        q, k, v = split_qkv(qkv)
        return attention(q, k, v, causal=True).transpose(1, 2)
    return attend


def packed(attention_qkv):
    return lambda qkv: attention_qkv(qkv, causal=True)


def tk_entry():
    """'attention_qkv' if the kernels package has the packed entry model.py trains through, else
    'attention' (q, k, v views)."""
    import kernels
    return "attention_qkv" if hasattr(kernels, "attention_qkv") else "attention"


def implementations():
    """name -> attend(qkv) -> y (B, T, H, D), causal, scale 1/sqrt(D), for every name in IMPLS."""
    import kernels
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import attention_op, reference

    def entry(module):
        # the packed entry where it exists (model.py trains through it), else the views
        return packed(module.attention_qkv) if hasattr(module, "attention_qkv") else on_views(module.attention)

    def pinned(backend):
        # Pinning is global in attention_op; restore it at once so no other row sees it. The
        # backward backend is fixed at forward time, so the autograd.grad after this still runs
        # the pinned one (or, where the pinned backend declines the backward, the next one's).
        run = entry(attention_op)

        def attend(qkv):
            old = attention_op.set_backend(backend)
            try:
                return run(qkv)
            finally:
                attention_op.set_backend(old)
        return attend

    def hopper_variant(variant):
        # the Hopper backend pinned, running forward variant `variant` (restored after the call)
        run = pinned("hopper")

        def attend(qkv):
            from kernels import attention_hopper
            old = attention_hopper.set_forward_variant(variant)
            try:
                return run(qkv)
            finally:
                attention_hopper.set_forward_variant(old)
        return attend

    def forced(backend):
        def attention(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return on_views(attention)

    table = {
        "tk": entry(kernels),                # cases() sets kernels_attention=tk around the rows
        "tk-hopper": pinned("hopper"),
        "tk-portable": pinned("portable"),
        "eager": (packed(reference.attention_qkv) if hasattr(reference, "attention_qkv")
                  else on_views(reference.attention)),
    }
    for name, member in SDPA_BACKENDS.items():
        table[name] = forced(getattr(SDPBackend, member))
    for name in HOPPER_VARIANT_IMPLS:
        table[name] = hopper_variant(int(name.rsplit("-v", 1)[1]))
    return table


def why_not_run(step, attend, inputs):
    """None if step(attend, inputs) runs, else why not: the error's first line, then the first
    line of each warning raised meanwhile, joined by ' | ' (SDPA gives its reasons for refusing a
    backend as warnings and only then raises 'No available kernel')."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            step(attend, inputs)
            if inputs[0].is_cuda:
                torch.cuda.synchronize()   # an asynchronous failure shows here, not in the timing
            return None
        except Exception as e:
            lines = [f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"]
            lines += [(str(w.message).strip().splitlines() or [""])[0] for w in caught]
            return " | ".join(dict.fromkeys(line for line in lines if line))[:400]


def outputs(attend, inputs, direction):
    """What the row's step computes, kept: [y] for fwd, [y, d(qkv)] for fwd+bwd, as float32."""
    qkv, dy = inputs
    if direction == "fwd":
        with torch.no_grad():
            return [attend(qkv).float()]
    y = attend(qkv)
    (grad,) = torch.autograd.grad(y, qkv, dy)
    return [y.detach().float(), grad.float()]


def relative_error(outs, refs):
    """The largest relative norm error of outs against refs; inf if any output is not finite."""
    worst = 0.0
    for out, ref in zip(outs, refs):
        if not torch.isfinite(out).all():
            return math.inf
        worst = max(worst, ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item())
    return worst


# Two bf16 flash-attention implementations differ by a few 1e-3 (kernels/NOTES.md: o 1.7e-3, dq
# 4e-3 against float64 each); a wrong mask or a lost tile gives 1e-1 or more.
MISMATCH = 2e-2


def check_against_eager(impls, inputs, direction):
    """(worst relative error of the others against 'eager', [names that differ by > MISMATCH with
    their error]); (None, []) without an 'eager' row. A fast wrong answer is not a figure."""
    if "eager" not in impls:
        return None, []
    refs = outputs(impls["eager"], inputs, direction)
    worst, bad = 0.0, []
    for name, attend in impls.items():
        if name != "eager":
            err = relative_error(outputs(attend, inputs, direction), refs)
            worst = max(worst, err)
            if not err <= MISMATCH:
                bad.append(f"{name}: rel err {err:.1e}")
    return worst, bad


def tk_choice(q):
    """'hopper fwd + portable bwd' (attention_op's choice for q), or '' if it has none."""
    try:
        from kernels import attention_op
        scale = 1.0 / math.sqrt(q.shape[-1])
        fwd, _ = attention_op._choose(q, True, scale, "forward")
        bwd, _ = attention_op._choose(q, True, scale, "backward")
        return f"{fwd} fwd + {bwd} bwd" if fwd and bwd else ""
    except Exception:   # only a label for the note
        return ""


# ---- bench.py's registry entry -----------------------------------------------------------------

def cases(Case, quick, device="cuda"):
    """bench.py's Cases for attention (bench.py passes its Case class: kernels/ never imports bench)."""
    import kernels
    rows = plan(quick)
    wanted = selected("TK_BENCH_ATTENTION_IMPLS", IMPLS, HOPPER_VARIANT_IMPLS)
    table = implementations()
    saved = kernels.choice()
    kernels.configure("auto", attention="tk", layernorm=saved["layernorm"], mlp=saved["mlp"])
    try:
        for shape_name, (B, H, T, D), direction in rows:
            make = functools.partial(make_inputs, B, H, T, D, device)
            step = STEPS[direction]
            case_name = f"{direction} {B}x{H}x{T}x{D}"
            probe = make()
            impls, skipped = {}, {}
            for name in wanted:
                if direction != "fwd" and name in FORWARD_ONLY:
                    continue   # its fwd+bwd is the 'tk' row on sm_90: not timed twice
                reason = why_not_run(step, table[name], probe)
                if reason is None:
                    impls[name] = table[name]
                else:
                    skipped[name] = reason
                    print(f"  attention {case_name}: {name} skipped: {reason}", flush=True)
            note = f"{shape_name}; causal, bf16, d(qkv) of (B,T,3,H,D)"
            if "tk" in impls:
                note += f"; tk = kernels.{tk_entry()}, {tk_choice(split_qkv(probe[0])[0]) or '?'}"
            worst, bad = check_against_eager(impls, probe, direction)
            if worst is not None:
                what = "y" if direction == "fwd" else "y and d(qkv)"
                note += f"; {what} checked against eager: max rel err {worst:.1e}"
            for line in bad:
                note += f"; MISMATCH {line}"
                print(f"  attention {case_name}: MISMATCH against eager: {line}", flush=True)
            note += "".join(f"; skipped {name}: {reason}" for name, reason in skipped.items())
            del probe
            yield Case("attention", case_name, "TFLOP/s", flops(B, H, T, D, direction), make, step,
                       impls=impls, compile=False, note=note)
    finally:
        kernels.configure("auto", **saved)


# ---- the ratios, from bench.py's JSON ----------------------------------------------------------

def ratios(row, table="ms"):
    """{impl: (TFLOP/s, x sdpa-cudnn or None, x best SDPA or None)} and the best SDPA backend's name
    for one bench.py row; table 'ms' (CUDA-graph replay) or 'ms_no_graph' (per-call events)."""
    rate = {name: row["work"] * 1e-12 / (ms * 1e-3) for name, ms in row.get(table, {}).items()
            if ms and math.isfinite(ms)}
    sdpa = {name: rate[name] for name in SDPA_BACKENDS if name in rate}
    best = max(sdpa, key=sdpa.get) if sdpa else None
    out = {}
    order = IMPLS + HOPPER_VARIANT_IMPLS
    for name in sorted(rate, key=lambda n: order.index(n) if n in order else len(order)):
        out[name] = (rate[name], rate[name] / rate[CUDNN] if CUDNN in rate else None,
                     rate[name] / rate[best] if best else None)
    return out, best


# Issue 5's "done when", on the CUDA-graph figures: (shape, direction, ours, against, at least, label);
# against = an SDPA backend's name or 'best' (the best SDPA backend of the row).
TARGETS = (("gpt2", "fwd", "tk-hopper", CUDNN, 1.1, ""),
           ("gpt2", "fwd+bwd", "tk", CUDNN, 1.1, ""),
           ("shakespeare-char", "fwd+bwd", "tk", "best", 1.0, ""),
           ("t4096-d128", "fwd+bwd", "tk", CUDNN, 0.9, ""),
           ("gpt2", "fwd", "tk-portable", "sdpa-flash", 1.0, ""),
           ("gpt2", "fwd+bwd", "tk-portable", "sdpa-flash", 1.0, ""),
           ("gpt2", "fwd", "tk-hopper", CUDNN, 1.35, " (stretch: FA3's level)"),
           ("gpt2", "fwd+bwd", "tk", CUDNN, 1.3, " (stretch)"))


def check_targets(rows):
    """One line per target: the measured ratio and 'met', 'NOT met' or 'not measured'."""
    by_key = {(r.get("note", "").split(";")[0], r["case"].split()[0]): r for r in rows if r.get("op") == "attention"}
    out = []
    for shape, direction, ours, against, least, label in TARGETS:
        what = f"{shape} {direction}: {ours} >= {least:.2f}x {'best SDPA' if against == 'best' else against}"
        row = by_key.get((shape, direction))
        rate, best = ratios(row) if row else ({}, None)
        base = (best or "any SDPA backend") if against == "best" else against
        if ours in rate and base in rate:
            measured = rate[ours][0] / rate[base][0]
            out.append(f"{what:<52} {measured:.2f}x  {'met' if measured >= least else 'NOT met'}{label}")
        else:
            missing = ", ".join(n for n in (ours, base) if n not in rate)
            out.append(f"{what:<52} not measured ({'no such row' if row is None else 'missing ' + missing}){label}")
    return out


def format_report(rows):
    """The attention rows of bench.py's JSON as text: per row and timing, each implementation's
    TFLOP/s and its ratios to sdpa-cudnn and to the best SDPA backend."""
    rows = [r for r in rows if r.get("op") == "attention"]
    if not rows:
        return "no attention rows in this JSON (run: python bench.py --ops attention)"
    out = []
    for table, title in (("ms", "CUDA-graph replay (GPU time of the kernels; the headline)"),
                         ("ms_no_graph", "launched from Python (events around each call)")):
        out.append(f"attention, {title}: TFLOP/s, x sdpa-cudnn, x best SDPA backend of the row")
        for row in rows:
            by_impl, best = ratios(row, table)
            out.append(f"{row['case']:<22} {row.get('note', '').split(';')[0]:<17} best SDPA: {best or '-'}")
            for name, (rate, vs_cudnn, vs_best) in by_impl.items():
                out.append(f"    {name:<15} {row[table][name]:9.4f} ms {rate:8.1f} TFLOP/s"
                           + (f" {vs_cudnn:6.2f}x cudnn" if vs_cudnn is not None else f" {'-':>6}  cudnn")
                           + (f" {vs_best:6.2f}x best" if vs_best is not None else f" {'-':>6}  best"))
            if table == "ms":
                head, *skipped = row.get("note", "").split("; skipped ")   # as cases() writes the note
                out += [f"    ({part})" for part in head.split("; ")
                        if part.startswith(("tk = ", "MISMATCH", "y checked", "y and d(qkv) checked"))]
                out += [f"    (skipped {part})" for part in skipped]
                for key, error in row.get("errors", {}).items():
                    out.append(f"    ! {key}: {error}")
        out.append("")
    out.append("issue 5's targets (CUDA-graph figures, same run):")
    out += ["  " + line for line in check_targets(rows)]
    return "\n".join(out)


def plot(rows, path, title=""):
    """Horizontal TFLOP/s bars (CUDA-graph replay), one panel per row, labelled with x cuDNN."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r.get("op") == "attention"]
    cols = 2
    panels = max(len(rows), 1)
    fig, axes = plt.subplots((panels + cols - 1) // cols, cols, figsize=(12, 2.6 * ((panels + cols - 1) // cols)),
                             squeeze=False)
    for ax in axes.flat[len(rows):]:
        ax.axis("off")
    for ax, row in zip(axes.flat, rows):
        by_impl, _ = ratios(row)
        names = list(by_impl)[::-1]
        rates = [by_impl[n][0] for n in names]
        colors = ["tab:orange" if n.startswith("tk") else "tab:blue" for n in names]
        ax.barh(range(len(names)), rates, color=colors)
        for i, n in enumerate(names):
            rate, vs_cudnn, _ = by_impl[n]
            ax.text(rate, i, f" {rate:.0f}" + (f" ({vs_cudnn:.2f}x cuDNN)" if vs_cudnn is not None else ""),
                    va="center", fontsize=7)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=7)
        ax.set_xlim(0, max(rates, default=1.0) * 1.45)
        ax.set_title(f"{row['case']} ({row.get('note', '').split(';')[0]}), TFLOP/s", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle("causal attention, bf16, CUDA-graph medians\n" + title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# ---- interleaved timing (--interleave) ---------------------------------------------------------

def _graph_of(step, attend, inputs):
    """A CUDA graph of step(attend, inputs), captured after a warm-up on a side stream (as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(attend, inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(attend, inputs)
    return graph


def _replay_median_ms(graphs, reps):
    """Median ms of reps replays, rotating through graphs (one per input set), events around each."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (start, end) in enumerate(events):
        start.record()
        graphs[i % len(graphs)].replay()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]


def interleaved(shape_names, names, direction="fwd", rounds=7, reps=20, device="cuda"):
    """{shape: {impl: [round medians, ms]}} for implementations `names` (IMPLS or tk-hopper-vN),
    timed in turns (see the module docstring); an implementation that refuses a shape is left
    out with its reason printed. Inputs rotate through sets bigger than twice the L2."""
    import kernels
    table = implementations()
    bad = [n for n in names if n not in table]
    if bad:
        raise ValueError(f"--impls: unknown name(s) {', '.join(bad)}; choose from {', '.join(table)}")
    bad = [n for n in shape_names if n not in SHAPES]
    if bad:
        raise ValueError(f"--interleave: unknown shape(s) {', '.join(bad)}; choose from {', '.join(SHAPES)}")
    step = STEPS[direction]
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    saved = kernels.choice()
    kernels.configure("auto", attention="tk", layernorm=saved["layernorm"], mlp=saved["mlp"])
    results = {}
    try:
        for shape in shape_names:
            B, H, T, D = SHAPES[shape]
            first = make_inputs(B, H, T, D, device)
            size = sum(t.numel() * t.element_size() for t in first)
            sets = [first] + [make_inputs(B, H, T, D, device) for _ in range(max(2, math.ceil(2 * l2 / size)) - 1)]
            graphs = {}
            for name in names:
                reason = why_not_run(step, table[name], first)
                if reason is None:
                    graphs[name] = [_graph_of(step, table[name], inputs) for inputs in sets]
                else:
                    print(f"  {shape} {direction}: {name} skipped: {reason}", flush=True)
            order = list(graphs)
            times = {name: [] for name in order}
            for g in graphs.values():                    # warm-up: every graph once
                for graph in g:
                    graph.replay()
            for r in range(rounds):
                for name in order[r % len(order):] + order[:r % len(order)]:
                    times[name].append(_replay_median_ms(graphs[name], reps))
            results[shape] = times
            del graphs, sets, first
            torch.cuda.empty_cache()
    finally:
        kernels.configure("auto", **saved)
    return results


def format_interleaved(results, direction="fwd"):
    """One line per shape and implementation: median over rounds (ms), range, TFLOP/s, x cuDNN."""
    out = []
    for shape, times in results.items():
        B, H, T, D = SHAPES[shape]
        work = flops(B, H, T, D, direction)
        med = {name: sorted(t)[len(t) // 2] for name, t in times.items() if t}
        out.append(f"{direction} {shape} {B}x{H}x{T}x{D}, interleaved, {len(next(iter(times.values()), []))} rounds "
                   f"(median of round medians; min..max)")
        for name, ms in med.items():
            vs = f"{med[CUDNN] / ms:6.3f}x cudnn" if CUDNN in med else ""
            out.append(f"    {name:<15} {ms:8.4f} ms  ({min(times[name]):.4f}..{max(times[name]):.4f})"
                       f"  {work * 1e-12 / (ms * 1e-3):7.1f} TFLOP/s  {vs}")
    return "\n".join(out)


# ---- host cost per call (--host) -----------------------------------------------------------------

def host_us(shape_name, calls=200, device="cuda"):
    """{layer: host microseconds per forward call} at one shape (see the module docstring)."""
    import kernels
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import attention_hopper
    B, H, T, D = SHAPES[shape_name]
    qkv, _ = make_inputs(B, H, T, D, device)
    qkv = qkv.detach()
    q, k, v = split_qkv(qkv)
    scale = 1.0 / math.sqrt(D)
    saved = kernels.choice()
    kernels.configure("auto", attention="tk", layernorm=saved["layernorm"], mlp=saved["mlp"])

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    layers = {"op: kernels.attention_qkv": lambda: kernels.attention_qkv(qkv, causal=True),
              "attention_hopper.forward": lambda: attention_hopper.forward(q, k, v, True, scale),
              "bindings: _ext.module.forward": lambda: attention_hopper._ext.module.forward(q, k, v, True, scale, 0),
              "sdpa-cudnn": cudnn}
    out = {}
    try:
        with torch.no_grad():
            for name, call in layers.items():
                for _ in range(20):
                    call()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                out[name] = (time.perf_counter() - start) / calls * 1e6
                torch.cuda.synchronize()
    finally:
        kernels.configure("auto", **saved)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="Attention rows of bench.py JSON files, with ratios to cuDNN "
                                             "and to the best SDPA backend; or (--interleave) implementations "
                                             "timed in turns.")
    ap.add_argument("json", nargs="*", help="bench.py --ops attention --json output(s); rows are concatenated")
    ap.add_argument("--png", help="also draw TFLOP/s bars here")
    ap.add_argument("--interleave", help="comma-separated shapes (" + ", ".join(SHAPES) + "): time --impls in turns")
    ap.add_argument("--impls", default="tk,sdpa-cudnn", help="with --interleave: comma-separated implementations")
    ap.add_argument("--direction", choices=DIRECTIONS, default="fwd")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--host", choices=tuple(SHAPES), help="host microseconds per forward call at this shape")
    args = ap.parse_args(argv)
    if args.host:
        if not torch.cuda.is_available():
            print("error: --host needs a CUDA device", file=sys.stderr)
            return 1
        for name, us in host_us(args.host).items():
            print(f"host {args.host} fwd  {name:<32} {us:7.1f} us per call")
        return 0
    if args.interleave:
        if args.rounds < 1 or args.reps < 1:
            ap.error("--rounds and --reps must be >= 1")
        if len(args.json) > 1:
            ap.error("with --interleave, give at most one JSON path (where the round medians are written)")
        if not torch.cuda.is_available():
            print("error: --interleave needs a CUDA device", file=sys.stderr)
            return 1
        try:
            results = interleaved([s.strip() for s in args.interleave.split(",") if s.strip()],
                                  [n.strip() for n in args.impls.split(",") if n.strip()],
                                  args.direction, args.rounds, args.reps)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(format_interleaved(results, args.direction))
        if args.json:
            with open(args.json[0], "w") as f:
                json.dump({"direction": args.direction, "round_medians_ms": results}, f, indent=1)
        return 0
    if not args.json:
        ap.error("give bench.py JSON file(s), or --interleave SHAPES")
    rows, title = [], ""
    for path in args.json:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"error: cannot read {path}: {e}", file=sys.stderr)
            return 1
        rows += data.get("results", [])
        env = data.get("environment", {})
        title = title or (f"{env.get('gpu', '?')}, torch {env.get('torch', '?')}, "
                          f"commit {str(env.get('git_commit', '?'))[:10]}, {env.get('date_utc', '')} UTC")
    print(title)
    print(format_report(rows))
    if args.png:
        print(f"wrote {plot(rows, args.png, title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The attention BACKWARD alone, timed in turns: the Hopper backward's variants against cuDNN's.

    python -m kernels.attention_bwd_bench [--shapes gpt2,shakespeare,t4096-d128] [--variants 19,16]
        [--rounds 9] [--reps 10] [--no-cudnn] [--json out.json]
    python -m kernels.attention_bwd_bench --ncu-once 4,12     one call each of these variants at
        GPT-2's shape (B=32, H=12, T=1024, D=64), for `ncu -k regex:backward_kernel -c 2`

Why this and not bench.py's rows: those time forward+backward through the op (the forward is
another engineer's kernel and the op's Python adds host time). What session 7 changes is the
backward: its three launches (kernel 1 Di = rowsum(dO∘O) unless fused, the main kernel, the dQ
conversion) plus the dq_accum memset (or prep_kernel in place of the memset and kernel 1), exactly what kernels/attention_hopper_bwd_bindings.cpp's
backward_into runs. And GPT-2 here is the TRAINING step's shape, B = 32 (bench.py's gpt2 row is
B = 16).

Inputs are what training hands the backward: q, k, v are the (B, H, T, D) views of one packed
(B, T, 3, H, D) c_attn output, grad_out is (B, T, H, D) memory seen as (B, H, T, D), and dq, dk, dv
are written into the three slices of one packed gradient. o and lse come from the Hopper forward.

cuDNN: aten._scaled_dot_product_cudnn_attention's backward on the same strided views (its own
dO·O pass, main kernel and dQ conversion: the 57 + 464 + 48 us of the session-7 probe's
torch.compile profile). Called through the aten op directly when that works, else through
autograd on SDPA with the cuDNN backend forced; the row's label says which.

Timing: every implementation is captured in a CUDA graph of --reps calls; round r replays each
once, starting with a different implementation each round (so a clock drift lands on all of
them), CUDA events around each replay. Per implementation: the median over rounds, and the
range. Ratios are to the first variant named (the current default) and to cuDNN.
"""
import argparse
import json
import math
import statistics
import sys

import torch

SHAPES = {"gpt2": (32, 12, 1024, 64), "shakespeare": (64, 6, 256, 64), "t4096-d128": (4, 16, 4096, 128)}


def backward_flops(B, H, T, D):
    """issue 5's convention: causal forward 4·B·H·T²·D/2, backward 2.5x that."""
    return 2.5 * 4 * B * H * T * T * D / 2


def inputs(B, H, T, D, seed=0):
    from kernels import attention_hopper
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(B, T, 3, H, D, device="cuda", generator=g).bfloat16()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    d_o = torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16().transpose(1, 2)
    scale = 1.0 / math.sqrt(D)
    o, lse = attention_hopper.forward(q, k, v, True, scale)
    return dict(qkv=qkv, q=q, k=k, v=v, d_o=d_o, o=o, lse=lse, scale=scale)


def tk_call(x, variant):
    """One Hopper backward with `variant`, through the extension (9, 10, 13, 14 are not in
    attention_hopper.BACKWARD_VARIANTS, so not through its Python wrapper)."""
    from kernels import attention_hopper
    ext = attention_hopper._bwd_ext.module
    dqkv = torch.empty_like(x["qkv"])
    out = tuple(dqkv.permute(2, 0, 3, 1, 4).unbind(0))

    def call():
        ext.backward_into(x["d_o"], x["q"], x["k"], x["v"], x["o"], x["lse"], True, x["scale"], *out, variant)
    return call, out


def cudnn_call(x):
    """(call, outputs, label) for cuDNN's backward on the same views, or raises."""
    q, k, v, d_o, scale = x["q"], x["k"], x["v"], x["d_o"], x["scale"]
    aten = torch.ops.aten
    try:
        res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)
        o, lse, cq, ck, mq, mk, seed, offset = res[:8]
        box = {}

        def call():
            box["g"] = aten._scaled_dot_product_cudnn_attention_backward(
                d_o, q, k, v, o, lse, seed, offset, None, cq, ck, mq, mk, 0.0, True, scale=scale)
        call()
        return call, box, "cudnn (aten backward op)"
    except Exception as e:   # noqa: BLE001 - fall back to autograd, say so
        print(f"  cudnn: the aten backward op did not run ({type(e).__name__}: {str(e)[:120]}); autograd instead")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        y = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True, scale=scale)
    box = {}

    def call():
        box["g"] = torch.autograd.grad(y, leaves, d_o, retain_graph=True)
    call()
    return call, box, "cudnn (autograd on SDPA, host time included)"


def graph_of(call, reps):
    """A CUDA graph of `reps` calls (warmed up on a side stream first), or None if capture fails."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            for _ in range(reps):
                call()
        g.replay()
        torch.cuda.synchronize()
        return g
    except Exception as e:   # noqa: BLE001
        print(f"  graph capture failed ({type(e).__name__}: {str(e)[:120]}); eager timing")
        torch.cuda.synchronize()
        return None


def timed(runner, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    runner()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def interleave(shape, variants, rounds, reps, with_cudnn=True):
    B, H, T, D = SHAPES[shape]
    x = inputs(B, H, T, D)
    impls = {}
    for v in variants:
        call, _ = tk_call(x, v)
        impls[f"tk-v{v}"] = call
    labels = {}
    if with_cudnn:
        try:
            call, _, label = cudnn_call(x)
            impls["cudnn"] = call
            labels["cudnn"] = label
        except Exception as e:   # noqa: BLE001
            print(f"  cudnn left out: {type(e).__name__}: {str(e)[:200]}")
    runners = {}
    for name, call in impls.items():
        # autograd's backward runs on the forward's stream, not a capture stream: no graph there
        g = None if "autograd" in labels.get(name, "") else graph_of(call, reps)
        if g is None:
            labels[name] = labels.get(name, name) + " [eager]"

            def runner(call=call):
                for _ in range(reps):
                    call()
        else:
            runner = g.replay
        runners[name] = runner
        runner()
    torch.cuda.synchronize()
    names = list(runners)
    per = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            per[n].append(timed(runners[n], reps))
    flops = backward_flops(B, H, T, D)
    first = f"tk-v{variants[0]}"
    rows = {}
    for n in names:
        ms = statistics.median(per[n])
        rows[n] = dict(ms=ms, lo=min(per[n]), hi=max(per[n]), tflops=flops / ms / 1e9, label=labels.get(n, n))
    for n in names:
        rows[n]["x_first"] = rows[first]["ms"] / rows[n]["ms"] if first in rows else None
        rows[n]["x_cudnn"] = rows["cudnn"]["ms"] / rows[n]["ms"] if "cudnn" in rows else None
    return dict(shape=shape, B=B, H=H, T=T, D=D, rounds=rounds, reps=reps, rows=rows)


def report(result):
    s = result
    lines = [f"{s['shape']} (B={s['B']}, H={s['H']}, T={s['T']}, D={s['D']}): backward alone, "
             f"{s['rounds']} interleaved rounds of {s['reps']} graph-replayed calls"]
    for n, r in s["rows"].items():
        xf = f"{r['x_first']:.3f}x first" if r["x_first"] else ""
        xc = f"{r['x_cudnn']:.3f}x cudnn" if r["x_cudnn"] else ""
        lines.append(f"  {n:10s} {r['ms'] * 1e3:8.1f} us [{r['lo'] * 1e3:.1f}..{r['hi'] * 1e3:.1f}]  "
                     f"{r['tflops']:6.1f} TFLOP/s  {xf:16s} {xc:14s} {r['label'] if r['label'] != n else ''}")
    return "\n".join(lines)


def parse_list(text, kind=str):
    return [kind(t) for t in text.split(",") if t.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="gpt2,shakespeare,t4096-d128")
    ap.add_argument("--variants", default="19,16",
                    help="Hopper backward variants; the first is the baseline (19: D=64's default since session 10, "
                         "16 with the mask's tests only where needed; 16: session 9's default, 15 on a persistent "
                         "grid; 15: session 8's; 12 races on dS, see the .cu)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--ncu-once", default=None, help="variants: one call each at GPT-2's shape, then exit")
    a = ap.parse_args(argv)
    shapes = parse_list(a.shapes)
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    variants = parse_list(a.variants, int)
    if not variants:
        ap.error("--variants: name at least one variant")
    if a.rounds < 1 or a.reps < 1:
        ap.error("--rounds and --reps must be >= 1")
    if not torch.cuda.is_available():
        print("attention_bwd_bench: needs a CUDA GPU (sm_90); nothing timed")
        return 0
    if a.ncu_once:
        x = inputs(*SHAPES["gpt2"])
        torch.cuda.synchronize()
        for v in parse_list(a.ncu_once, int):
            tk_call(x, v)[0]()
        torch.cuda.synchronize()
        print("ncu-once ran:", a.ncu_once)
        return 0
    results = []
    for s in shapes:
        r = interleave(s, variants, a.rounds, a.reps, with_cudnn=not a.no_cudnn)
        print(report(r), flush=True)
        results.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

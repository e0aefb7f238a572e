"""tests/mlp_fc_ncu_case.py — c_fc's and the dGELU GEMM's time against plain products of their shapes
(GPT-2's step, M = 32768: c_fc ~300 µs and dGELU ~260 against ~215 for a plain product), and what the
lean k-step (kernels/mlp_deferred.cuh) buys each. Run by tests/gpu_mlp_dgelu_lean.sh; not a pytest
file (no test_ prefix). Written in session 9 (M), cases renamed in session 10; the ncu table and
source-counter summary are tests/mlp_dgelu_ncu_case.py's.

The cases (M x 768 -> M x 3072, bf16, no biases as in GPT-2; one kernel each):
  a  c_fc as the default runs it (fcfast=9's, which 10 and 11, the default since session 10, share:
     h and gelu'(pre), epilogue in half boxes, deferred, on the lean k-step)
  p  c_fc with fcfast=5 (sessions 8-9's default: the same values on the k-step that rebuilds its
     descriptors)                                                                      [control]
  c  the plain product x·W1ᵀ by gemm.matmul(step=0) (step 4 v8; W1 K-major, as c_fc reads it)
  d  fcfast=4 (h and pre: no gelu'(pre), 5 fewer operations per value than p)            [control]
  e  the backward's dGELU GEMM as fcfast=9 runs it (one product per value; un-lean k-step)
  i  the dGELU GEMM on the lean k-step (fcfast=10, session 10, opt-in)
  j  i with its product one packed bf16x2 multiply a pair (fcfast=11, the default since session 10's
     call 2; no db1 here)
  f  the plain product dy·W2 by gemm.matmul(step=0) (the dGELU GEMM's shape and layout)
(Session 9's cases b, fcfast=7's quarter boxes, and g, fcfast=8's whole boxes by turns, lost on the
H200 and were removed; its h, fcfast=9, is now a.)
a, p, d run the whole forward (c_fc and c_proj), e, i, j the whole backward; ncu and the profiler pick
the c_fc / dGELU / plain kernel out by name (NCU_REGEX).

Modes:
  --mode ncu   warm-up outside the NVTX range 'ncu', then ONE call per case inside it, then checks
               against float references (not profiled)
  --mode time  CUDA events: --rounds interleaved rounds of --iters calls per case (a, p, d: the
               whole forward; e, i, j: the whole backward; c, f: the kernel alone), then the profiler's
               time of the matching kernel alone (one pass of --iters calls per case)
  --list       print the cases (no GPU)
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import mlp_dgelu_ncu_case as shared  # noqa: E402  (ncu CSV summaries, the timing loop)

# letter: (what, kind, schedule spec or operands, bias, kernel-name fragments ncu should show)
CASES = {
    "a": ("c_fc, default (fcfast=9's, lean k-step)", "fwd", "fcfast=9", False, ("bias_gelu_parts_epilogue<1, 1>", "bias_gelu_parts_epilogue<(bool)1, (bool)1>")),
    "p": ("c_fc, fcfast=5 (sessions 8-9's default)", "fwd", "fcfast=5", False, ("bias_gelu_parts_epilogue<1, 0>", "bias_gelu_parts_epilogue<(bool)1, (bool)0>")),
    "c": ("plain x.W1^T, matmul(step=0) = 4v8", "gemm", ("x", "w1t"), None, ("deferred_plain",)),
    "d": ("c_fc, fcfast=4 (pre and h, no gelu')", "fwd", "fcfast=4", False, ("bias_gelu_parts_epilogue<0, 0>", "bias_gelu_parts_epilogue<(bool)0, (bool)0>")),
    "e": ("dGELU, fcfast=9 (un-lean k-step, no bias grads)", "bwd", "fcfast=9", False, ("dgelu_parts_epilogue<1, 0, 0>", "dgelu_parts_epilogue<(bool)1, (bool)0, (bool)0>")),
    "i": ("dGELU, fcfast=10 (lean k-step)", "bwd", "fcfast=10", False, ("dgelu_parts_epilogue<1, 1, 0>", "dgelu_parts_epilogue<(bool)1, (bool)1, (bool)0>")),
    "j": ("dGELU, default (fcfast=11: lean, packed)", "bwd", "fcfast=11", False, ("dgelu_parts_epilogue<1, 1, 1>", "dgelu_parts_epilogue<(bool)1, (bool)1, (bool)1>")),
    "f": ("plain dy.W2, matmul(step=0) = 4v8", "gemm", ("dy", "w2"), None, ("deferred_plain",)),
}
NCU_REGEX = "bias_gelu_parts|dgelu_parts|deferred_plain"   # the shell passes this to ncu -k regex:...


def make_inputs(M, C, H):
    import torch
    from kernels import mlp_op
    g = torch.Generator(device="cuda").manual_seed(M + 1)
    r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)
    x, w1, w2, dy = r(M, C), r(H, C, scale=C ** -0.5), r(C, H, scale=H ** -0.5), r(M, C)
    mlp_op.set_schedule("fcfast=5")
    _, gp, h = mlp_op._ext_forward(x, w1, None, w2, None)
    mlp_op.set_schedule("0")
    torch.cuda.synchronize()
    return dict(x=x, w1=w1, w1t=w1.t(), w2=w2, dy=dy, gp=gp, h=h)


def make_calls(letters, t):
    """{letter: (schedule spec or None, fn)}; fn() launches the case once and returns its outputs."""
    from kernels import gemm, mlp_op
    calls = {}
    for k in letters:
        _, kind, spec, _, _ = CASES[k]
        if kind == "fwd":
            calls[k] = (spec, lambda: mlp_op._ext_forward(t["x"], t["w1"], None, t["w2"], None))
        elif kind == "bwd":
            calls[k] = (spec, lambda: mlp_op._ext_backward(t["dy"], t["x"], t["gp"], t["h"], t["w1"], t["w2"],
                                                           bias_grads=False, saved=1))
        else:
            a, b = (t[n] for n in spec)
            p = gemm.plan(a, b, step=0)
            print(f"  case {k}: gemm plan step {p.step} v{p.variant}, B mode {p.b_mode!r}, splits {p.splits}")
            launch, c = gemm.kernel_only(a, b, step=0)
            calls[k] = (None, lambda launch=launch, c=c: (launch(), c)[1])
    return calls


def run(calls, k):
    from kernels import mlp_op
    spec, fn = calls[k]
    if spec is not None:
        mlp_op.set_schedule(spec)
    return fn()


def check(letters, outs, t):
    """Each case against a float reference: h (fwd), dx (bwd), the product (gemm)."""
    x, w1, w2, dy = (t[n].float() for n in ("x", "w1", "w2", "dy"))
    pre = x @ w1.t()
    h, gp = shared.gelu_and_grad(pre)
    dx = ((dy @ w2) * gp) @ w1
    refs = {"c": pre, "f": dy @ w2}
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
    for k in letters:
        kind = CASES[k][1]
        out = outs[k]
        got, ref, what = ((out[2], h, "h") if kind == "fwd" else (out[0], dx, "dx") if kind == "bwd"
                          else (out, refs[k], "product"))
        err = rel(got, ref)
        print(f"  check {k}: {what} vs float ref: rel err {err:.2e} {'OK' if err < 2e-2 else 'BAD'}")


def mode_ncu(args, letters):
    t = make_inputs(args.M, args.C, args.H)
    calls = make_calls(letters, t)
    outs = shared.launch_for_ncu(calls, letters, run, args.warmup)
    check(letters, outs, t)
    print("ncu case done")


def mode_time(args, letters):
    for M in args.Ms:
        time_at(args, letters, M)


def time_at(args, letters, M):
    t = make_inputs(M, args.C, args.H)
    calls = make_calls(letters, t)
    for k in letters:
        run(calls, k)
    shared.time_cases(calls, letters, CASES, NCU_REGEX, args.rounds, args.iters,
                      "fwd = the WHOLE forward, bwd = the whole backward, gemm = the kernel alone", prefix=f"M={M}: ")
    print("time case done")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("ncu", "time"))
    ap.add_argument("--cases", default=",".join(CASES), help="case letters in launch order (see --list)")
    ap.add_argument("--M", default="32768", help="token count; time mode: a comma list (ncu mode takes the first)")
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--H", type=int, default=3072)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--summarize", metavar="RAW_CSV", help="summarize `ncu --page raw --csv` output (no GPU)")
    ap.add_argument("--source", metavar="SRC_CSV", help="summarize `ncu --page source --csv` output (no GPU)")
    args = ap.parse_args(argv)
    letters = shared.parse_cases(args.cases, CASES, "mlp_fc_ncu_case.py")
    try:
        args.Ms = [int(m) for m in str(args.M).split(",") if m.strip()]
    except ValueError:
        raise SystemExit(f"mlp_fc_ncu_case.py: --M must be token counts separated by commas (got {args.M!r})") from None
    if not args.Ms or min(args.Ms) < 1 or args.C % 64 or args.H % 64 or args.C < 64 or args.H < 64:
        raise SystemExit(f"mlp_fc_ncu_case.py: need M >= 1 and C, H positive multiples of 64 "
                         f"(got M={args.M}, C={args.C}, H={args.H})")
    args.M = args.Ms[0]
    if args.summarize or args.source:
        if args.summarize:
            shared.summarize_raw(args.summarize, letters, CASES)
        if args.source:
            shared.summarize_source(args.source, letters)
        return
    from kernels import mlp_op
    for k in letters:                                  # a bad schedule spec fails here, before any GPU work
        if CASES[k][1] != "gemm":
            mlp_op.parse_schedule(CASES[k][2])
    if args.list:
        print(f"M={args.M} C={args.C} H={args.H} bf16, no biases; ncu kernel regex {NCU_REGEX!r}")
        for k in letters:
            print(f"  {k}  {CASES[k][1]:4s}  {CASES[k][0]}")
        return
    if not args.mode:
        ap.error("give --mode ncu|time, --list or --summarize")
    shared.require_cuda()
    print(f"M={args.M} C={args.C} H={args.H} bf16, no biases, cases {','.join(letters)}", flush=True)
    (mode_ncu if args.mode == "ncu" else mode_time)(args, letters)


if __name__ == "__main__":
    main()

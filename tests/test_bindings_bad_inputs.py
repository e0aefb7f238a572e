"""GPU tests: bad inputs handed straight to the GEMM and Hopper-attention extensions (past the
Python checks of kernels/gemm.py and kernels/attention_hopper.py) raise a Python error that
names the argument, and never crash the process. The layernorm, MLP and portable-attention
versions of this test live in tests/test_layernorm.py, test_mlp.py and test_attention.py.

Why a child process: on the H200 (torch 2.11) failing TORCH_CHECKs in the layernorm and MLP
bindings killed the process with SIGSEGV (kernels/NOTES.md); the bindings now raise one
pre-built string (kernels/bindings_checks.h). If a raise ever crashed again, the child's log
names the case and the rest of the session still runs. Each child first asks the check_*
function (the message, no C++ throw) for every case, then makes the real calls.
Skipped without a Hopper GPU (both extensions are sm_90a builds)."""
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs a Hopper (sm_90) GPU")

# Shared by both children: `cases` is (check_fn, call_fn, args, exception, fragment); a check_fn
# of None marks a refusal only the call can give (a launcher's own), so it is not asked first.
RUN_CASES = r"""
for i, (check, call, args, exc, fragment) in enumerate(cases):
    if check is not None:
        problem = check(*args)
        assert fragment in problem, (i, fragment, problem)
        print(f"check {i}: {problem}", flush=True)
for i, (check, call, args, exc, fragment) in enumerate(cases):
    print(f"case {i}: expecting {exc.__name__} '{fragment}'", flush=True)
    try:
        call(*args)
    except exc as e:
        assert fragment in str(e), (i, fragment, str(e))
    else:
        raise AssertionError(f"case {i}: no error raised")
print("all bad inputs refused", flush=True)
"""

GEMM = r"""
import torch
from kernels import gemm
ext = gemm._ext.module
g = torch.Generator(device="cuda").manual_seed(3)
r = lambda *s: torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)
a, w = r(64, 128), r(96, 128)                         # a [M][K], w [N][K]: c = a·wᵀ, M=64 K=128 N=96
c = torch.empty(64, 96, device="cuda", dtype=torch.bfloat16)
ok = (4, a, w, c, False, False, None, False, 1, 0)
assert ext.check_run(*ok) == ""
ext.run(*ok)
ref = a.float() @ w.float().t()
assert ((c.float() - ref).norm() / ref.norm()).item() < 2e-2     # the arguments mean what the cases assume

def args(**change):
    names = ["step", "a", "b", "c", "a_mn_major", "b_mn_major", "bias", "gelu", "splits", "variant"]
    return tuple(change.get(n, v) for n, v in zip(names, ok))

C, R = ext.check_run, ext.run
cases = [
    (C, R, args(step=7), ValueError, "gemm: step must be 1..5, got 7"),
    (C, R, args(splits=0), ValueError, "gemm: splits must be >= 1"),
    (C, R, args(a=a.cpu()), ValueError, "gemm: a must be a CUDA tensor, got one on cpu"),
    (C, R, args(b=w.cpu()), ValueError, "gemm: b must be a CUDA tensor, got one on cpu"),
    (C, R, args(c=c.view(64, 96, 1)), ValueError, "gemm: c must be a 2-D matrix, got shape (64, 96, 1)"),
    (C, R, args(a=a.t()), ValueError, "gemm: a must be contiguous, got strides (1, 128)"),
    (C, R, args(a=a.float()), TypeError, "gemm: a must be bfloat16, got Float"),
    (C, R, args(c=c.half()), TypeError, "gemm: c must be bfloat16 or float32, got Half"),
    (C, R, args(a=a[:32]), ValueError, "gemm: a, stored as [M][K], has shape (32, 128) but c has M = 64 rows"),
    (C, R, args(b=w[:, :64].contiguous()), ValueError, "gemm: b, stored as [N][K], has shape (96, 64) but needs N = 96"),
    (C, R, args(a=r(64, 40), b=r(96, 40)), ValueError, "N and K must be multiples of 16, got N = 96, K = 40"),
    (C, R, args(bias=r(96).float()), TypeError, "gemm: bias must be bfloat16, got Float"),
    (C, R, args(bias=r(32)), ValueError, "gemm: bias must be a contiguous vector of length N = 96, got shape (32,)"),
    (C, R, args(bias=r(96).cpu()), ValueError, "gemm: bias must be on a's device cuda:0, got one on cpu"),
    # Step 1 has no N-major B: the launcher refuses, run raises its reason (RuntimeError).
    (None, R, args(step=1, b=w.t().contiguous(), b_mn_major=True), RuntimeError, "gemm: step 1 failed: gemm step 1 takes"),
]
""" + RUN_CASES

HOPPER = r"""
import math, torch
from kernels import attention_hopper
ext = attention_hopper._ext.module
g = torch.Generator(device="cuda").manual_seed(4)
r = lambda *s: torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)
q, k, v = r(1, 2, 64, 64), r(1, 2, 64, 64), r(1, 2, 64, 64)
ok = (q, k, v, True, 0.125, 0)
assert ext.check_forward(*ok) == ""
o, lse = ext.forward(*ok)
assert o.shape == q.shape and lse.shape == (1, 2, 64) and torch.isfinite(lse).all()

def args(**change):
    names = ["q", "k", "v", "causal", "scale", "variant"]
    return tuple(change.get(n, x) for n, x in zip(names, ok))

C, F = ext.check_forward, ext.forward
d96 = r(1, 2, 64, 96)
cases = [
    (C, F, args(q=q.cpu()), ValueError, "tk Hopper attention: q must be a CUDA tensor, got one on cpu"),
    (C, F, args(k=k.cpu()), ValueError, "tk Hopper attention: k must be a CUDA tensor, got one on cpu"),
    (C, F, args(v=v.half()), TypeError, "tk Hopper attention: v must be bfloat16, got Half"),
    (C, F, args(k=k[0]), ValueError, "k must have shape (batch, heads, seq, head_dim), got (2, 64, 64)"),
    (C, F, args(v=v[:, :, :32]), ValueError, "v has shape (1, 2, 32, 64) but q has (1, 2, 64, 64)"),
    (C, F, args(k=k.transpose(-1, -2).contiguous().transpose(-1, -2)), ValueError,
     "k must be contiguous in its last (head_dim) dimension"),
    (C, F, args(variant=99), ValueError, "variant must be 0 (the default) .. "),   # the upper bound moves as variants come and go
    (C, F, args(q=d96, k=d96, v=d96), ValueError, "cannot take these inputs: head_dim must be 64 or 128"),
    (C, F, args(scale=math.nan), ValueError, "cannot take these inputs: scale must be a positive finite number"),
    (C, F, args(q=q.as_strided(q.shape, (q.stride(0), q.stride(1), 60, 1))), ValueError,
     "must be positive multiples of 8 elements"),
]
""" + RUN_CASES


def run_child(script):
    res = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and "all bad inputs refused" in res.stdout, (
        f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


def test_gemm_bad_inputs_raise_clear_errors():
    from kernels import gemm
    assert gemm.why_not() is None, gemm.why_not()          # build in this process first (child loads it)
    run_child(GEMM)


def test_attention_hopper_bad_inputs_raise_clear_errors():
    from kernels import attention_hopper
    reason = attention_hopper._ext.why_not()
    assert reason is None, reason
    run_child(HOPPER)

"""tk linear layer, the Python half: y = x·Wᵀ (+ b) on the tk GEMM (kernels/gemm.py), with its
custom ops, autograd, the support check and registration.

(Named linear_op.py, not linear.py: a submodule kernels.linear would replace the function
kernels.linear() that model.py calls; the same reason as mlp_op.py and attention_op.py.)

Read after kernels/__init__.py (the switch), kernels/layernorm.py (the op-module pattern this file
follows) and kernels/gemm.py (the GEMM and the operand layouts it reads in place). model.py sends
the attention block's two linears here: c_attn (768 -> 2304 in GPT-2) and the attention's c_proj
(768 -> 768). The MLP's linears are kernels/mlp_op.py's and the LM head is kernels/lm_head_op.py's.
Off by default: train.py and sample.py set kernels_linear = "torch"; kernels_linear=tk turns it on.
Its products run at 1.00-1.09x cuBLAS at GPT-2's 32k tokens, but in the eager GPT-2 step its
Python path costs more host time than autocast's F.linear where the forward is host-bound: session
9 measured the step 0.52 ms slower with it (paired rounds in one process, within noise; NOTES.md).

The three products of a linear layer, as gemm.py's docstring writes them (x2d: x as (M, K) rows,
W: (N, K), dy: (M, N)):

    y  = matmul(x2d, W.t())       B = W.t(): W's rows read in place (K-major B)
    dx = matmul(dy, W)            B = W as stored: (N, K) is the product's K x N, row-major
    dW = matmul(dy.t(), x2d)      A = dy.t(): dy read in place (M-major A) when M % 16 == 0

matmul(step=0) picks the kernel by shape (gemm.auto_step): without a bias, the plain epilogue
(step 4 v8; for products with few output tiles, the weight gradients, split-K over the tokens:
step 5 v10's planned schedule for c_attn's 2304x768, step 5 v7's equal splits for c_proj's
768x768); with a bias, the fused bias epilogue (step 5 v1 at K <= 1024). db = dy.sum(0).

The GEMM reduces over K in multiples of 16, and dW's reduction runs over the tokens M: when M is
not a multiple of 16 (sampling, odd evaluation batches) dy and x get zero rows appended for dW
(zeros add nothing to the sum). K and N (the layer's widths) must be multiples of 16: why_not
refuses other widths, and `auto` then runs F.linear.

Dtypes. The GEMM computes in bfloat16 (fp32 accumulation); y is bf16. Under
torch.autocast(bfloat16), x and b are cast to bf16 with .to() BEFORE the autograd core, exactly
what autocast's F.linear does (their casts' backward widens dx and db to their dtypes). The WEIGHT
goes into the core in its own dtype (fp32 in training; session 9): the core casts it to bf16 once
in the forward and keeps that copy for dx, and the weight gradient comes out of the GEMM directly
in fp32 (gemm.matmul(out_dtype=float32): split-K's fp32 sums are stored as they are). autocast's
F.linear instead rounds dW to bf16 and then widens it in a separate kernel (the cast's backward),
and step 5 v7's split-K adds a conversion to bf16 before that: per layer this saves 1-2 elementwise
kernels over the weight, and dW is no longer rounded to bf16 (the reference path's rounding adds
~2e-3 relative error to it; the fp32 sums' own error is ~1e-6 to 1e-5). bf16 weights get bf16
gradients; a weight of another dtype (fp16 under bf16 autocast) is cast outside the core as
before. Without autocast the inputs must already be bf16 (otherwise why_not says so and `auto`
runs F.linear).

Where y runs: FORWARD (below) is "tk" by default; TK_LINEAR_FORWARD=cublas (session 9, opt-in, NOT
run on a GPU yet) puts y on torch.mm / addmm and keeps dx and dW on the tk GEMM.

Outside torch.compile the public op calls _LinearEager (a plain autograd.Function around the
same calls; kernels/layernorm.py, section 4, says why: the torch.library dispatch costs CPU per
call); under torch.compile it calls the custom ops tk::linear_fwd / tk::linear_bwd, which have
fake implementations, so the model compiles into one graph. Nothing builds at import.
"""
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _preflight_checks, checks, gemm, register_tk

_ext = gemm._ext          # the GEMM extension (tk_gemm); `python -m kernels` lists it under linear
MULTIPLE = 16             # gemm.matmul: N and K multiples of 16
BF16 = torch.bfloat16
# Where y = x·Wᵀ runs: "tk" (the tk GEMM, the default) or "cublas" (torch.mm / addmm: its host
# path is all C++, while the products with the larger gains, dW, stay on tk in the backward).
# Session 9 (kernels/NOTES.md): the eager GPT-2 step's forward is at the host bound, and this op's
# Python path costs more host time than F.linear's; "cublas" is the experiment that keeps most of
# the kernel savings (dW: -0.29 ms a step) and drops most of the forward's extra host work. NOT
# timed on a GPU yet. TK_LINEAR_FORWARD=cublas sets it at import; tests may set it directly.
FORWARD = os.environ.get("TK_LINEAR_FORWARD", "tk")
if FORWARD not in ("tk", "cublas"):
    raise ValueError(f"TK_LINEAR_FORWARD={FORWARD!r}: use tk (the default) or cublas")


# ---- 1. the three products (after the checks; the GEMM's own checks run in gemm.plan) ----------

def _pad_rows(t, multiple=MULTIPLE):
    """t (M, C) with zero rows appended up to a multiple of `multiple` (t itself when it is one)."""
    extra = -t.shape[0] % multiple
    return F.pad(t, (0, 0, 0, extra)) if extra else t


def _weight_bf16(weight):
    """The weight as the GEMM reads it: bf16 (a no-op for a bf16 weight; one cast kernel for fp32)."""
    return weight.to(BF16)


def _forward(x2d, weight16, bias):
    """y (M, N) = x2d (M, K) · weight16ᵀ (+ bias), bf16, on the tk GEMM or (FORWARD = "cublas") on
    torch's (the operands are bf16 already, so autocast adds no cast)."""
    if FORWARD == "cublas":
        return torch.mm(x2d, weight16.t()) if bias is None else torch.addmm(bias, x2d, weight16.t())
    return gemm.matmul(x2d, weight16.t(), bias=bias, step=0)


def _backward(dy, x2d, weight16, weight_dtype, has_bias):
    """(dx (M, K) bf16, dW (N, K) in weight_dtype (bf16 or fp32), db (N,) bf16 or an empty (0,)
    tensor without a bias). dW is stored by the GEMM in weight_dtype: no cast kernel after it."""
    dy = dy.contiguous()
    dx = gemm.matmul(dy, weight16, step=0)
    dy_k, x_k = _pad_rows(dy), _pad_rows(x2d.contiguous())   # dW reduces over the tokens
    dw = gemm.matmul(dy_k.t(), x_k, step=0, out_dtype=weight_dtype)
    db = dy.sum(0) if has_bias else dy.new_empty(0)
    return dx, dw, db


# ---- 2. the custom ops: what torch.compile sees ----------------------------------------------

@torch.library.custom_op("tk::linear_fwd", mutates_args=())
def linear_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """x (M, K) bf16, weight (N, K) bf16 or fp32, bias (N,) bf16 or None. Returns y (M, N) bf16."""
    return _forward(x, _weight_bf16(weight), bias)


@torch.library.custom_op("tk::linear_bwd", mutates_args=())
def linear_bwd(dy: Tensor, x: Tensor, weight: Tensor, has_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (dx bf16, dW in weight's dtype, db bf16); db is empty (0,) when has_bias is False.
    (A custom op saves only its inputs, so the weight is cast to bf16 again here; the eager path
    keeps the forward's copy.)"""
    return _backward(dy, x, _weight_bf16(weight), weight.dtype, has_bias)


@linear_fwd.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


@linear_bwd.register_fake
def _(dy, x, weight, has_bias):
    return torch.empty_like(x), torch.empty_like(weight), dy.new_empty(weight.shape[0] if has_bias else 0)


# ---- 3. autograd: save x and W; the backward is the two GEMMs (and db) -----------------------

def _setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward_custom(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dw, db = linear_bwd(dy, x, weight, ctx.has_bias)
    return dx, dw, (db if ctx.has_bias else None)


linear_fwd.register_autograd(_backward_custom, setup_context=_setup)


class _LinearEager(torch.autograd.Function):
    """linear_fwd without torch.library: the same products and gradients (bit for bit), but the
    forward's bf16 weight is saved for dx instead of being cast again in the backward."""
    @staticmethod
    def forward(ctx, x, weight, bias):
        weight16 = _weight_bf16(weight)
        y = _forward(x, weight16, bias)
        ctx.save_for_backward(x, weight16)
        ctx.has_bias, ctx.weight_dtype = bias is not None, weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight16 = ctx.saved_tensors
        dx, dw, db = _backward(dy, x, weight16, ctx.weight_dtype, ctx.has_bias)
        return dx, dw, (db if ctx.has_bias else None)


# ---- 4. the public op, with the same signature as reference.linear ---------------------------

def _bf16(t):
    return None if t is None else t.to(BF16)   # a no-op on bf16 tensors; else autocast's cast


CORE_WEIGHT_DTYPES = (BF16, torch.float32)   # the dtypes the core takes a weight in (dW's out_dtype)


def linear(x, weight, bias=None):
    """y = x·weightᵀ (+ bias), x (..., K), weight (N, K), bias (N,) or None; y (..., N) in bf16."""
    lead = x.shape[:-1]
    w = weight if weight.dtype in CORE_WEIGHT_DTYPES else _bf16(weight)   # cast inside the core
    args = (_bf16(x.reshape(-1, x.shape[-1])), w, _bf16(bias))
    y = linear_fwd(*args) if torch.compiler.is_compiling() else _LinearEager.apply(*args)
    return y.reshape(*lead, y.shape[-1])


# ---- 5. the support check and registration ---------------------------------------------------

@torch.compiler.assume_constant_result
def _build_reason():
    # Under torch.compile this runs once at trace time and its answer is a constant, so the
    # build (file locks, nvcc) never gets traced. The GEMM extension is Hopper-only (sm_90):
    # build.py's arch_flags refuses other GPUs with a reason that names the device.
    return gemm.why_not()


def _autocast_bf16():
    return torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == BF16


def why_not(x, weight, bias=None):
    """None if the tk GEMM can run this linear layer, else the reason it cannot."""
    if not checks.on_kernel_device(x):
        return f"x is on {x.device.type}; the tk kernel needs CUDA tensors"
    named = [("x", x), ("weight", weight), ("bias", bias)]
    for name, t in named:
        if t is not None and t.device != x.device:
            return f"{name} is on {t.device}, x on {x.device}"
    for name, t in named:
        if t is not None and not t.is_floating_point():
            return f"{name} is {t.dtype}; a linear layer needs floating-point tensors"
    if torch.is_autocast_enabled("cuda") and not _autocast_bf16():
        return f"autocast to {torch.get_autocast_dtype('cuda')}; the tk GEMM computes in bfloat16"
    if not _autocast_bf16():
        for name, t in named:
            if t is not None and t.dtype != BF16:
                return (f"{name} is {t.dtype}; the tk GEMM computes in bfloat16: pass bfloat16 tensors "
                        f"or run under torch.autocast('cuda', dtype=torch.bfloat16)")
    if x.dim() < 1 or weight.dim() != 2:
        return f"x must have a last (feature) dimension and weight must be 2-D, got {tuple(x.shape)}, {tuple(weight.shape)}"
    N, K = weight.shape
    if x.shape[-1] != K:
        return f"shapes do not match: x (..., {x.shape[-1]}), weight {tuple(weight.shape)}"
    if bias is not None and tuple(bias.shape) != (N,):
        return f"bias has shape {tuple(bias.shape)}, expected ({N},)"
    if K % MULTIPLE or N % MULTIPLE or K == 0 or N == 0:
        return f"in_features {K} and out_features {N} must be positive multiples of {MULTIPLE} (the tk GEMM's k-step)"
    if x.numel() == 0:
        return "x is empty"
    if x.numel() // K >= 2**31 - MULTIPLE:
        return f"x has {x.numel() // K} rows; the GEMM takes fewer than 2^31"
    return _build_reason()


def preflight(n_embd, dtype, device, **_):
    """Start-up check for the configured model (the attention's linears: n_embd -> 3·n_embd and
    n_embd -> n_embd); builds the GEMM extension now, not mid-step."""
    return checks.bf16_preflight("the tk GEMM", n_embd, dtype, device, MULTIPLE, gemm.why_not)


register_tk("linear", linear, why_not)
_preflight_checks["linear"] = preflight

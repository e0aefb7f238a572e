"""tk LM head + cross-entropy, the Python half: the chunk loop, custom ops, autograd, the support
check, registration.

Read after kernels/__init__.py (the switch) and kernels/layernorm.py (the op-module pattern this
file follows). The kernel is kernels/cross_entropy.cu (its opening comment has the arithmetic).

    loss = mean over rows with target != -1 of  lse(x·Wᵀ)[row] - (x·Wᵀ)[row, target]

model.py's last two lines were `logits = lm_head(y); loss = F.cross_entropy(logits, targets)`. At
GPT-2's training shape (N = 32·1024 rows, V = 50304) the bf16 logits are 3.3 GB, and PyTorch
then casts them to fp32 (autocast runs cross_entropy in fp32), writes log_softmax in fp32 and
keeps it for the backward, which reads it again to write the gradient: ~20 GB of traffic for a
loss. Here the logits never exist in full:

  THE IDEA (Liger-Kernel's fused linear cross-entropy, in our words): the gradient of the mean
  loss with respect to the logits is (softmax - onehot)/n_valid, and it is known as soon as the
  forward has each row's max and sum of exponentials. So the forward computes the gradient too,
  chunk by chunk, and keeps only what the backward needs, dx (N, C) and dW (V, C):

      for each chunk of rows c (a few hundred MB of logits):
          logits_c = x_c · Wᵀ                     the tk GEMM (or cuBLAS: TK_LM_HEAD_LOGITS), bf16 out
          loss_c, dlogits_c -> in place           tk kernel (cross_entropy.cu), one pass per row
          dx_c  = dlogits_c · W                   cuBLAS
          dW   += dlogits_cᵀ · x_c                cuBLAS, bf16 in, fp32 accumulator

  and the autograd backward just scales the saved dx and dW by grad_output (a scalar: 1, or
  1/gradient-accumulation steps). The GEMMs are 95% of the op's flops; the kernel replaces what
  was memory-bound (softmax forward and backward, the casts and the round trips of the full
  logits). dx's and dW's GEMMs are cuBLAS's; the logits' runs on the tk GEMM since session 12
  (TK_LM_HEAD_LOGITS, below: cuBLAS ran it at 458 us a chunk against 399 for dx's of equal flops
  in session 11's profile, and the GPT-2 step took 0.40 ms less on the tk GEMM).

  W is the tied wte/lm_head parameter: autograd adds the dW returned here to the embedding's
  gradient, exactly as for the nn.Linear it replaces.

No host sync anywhere: n_valid (rows whose target is not -1) is counted on the GPU and the kernel
reads 1/n_valid from device memory; allocations depend only on the shapes. So CUDA graphs
capture the op, and torch.compile sees one custom op with a fake implementation.

Dtypes: under bf16 autocast (or with bf16 x and W) the GEMMs run in bf16 (W cast once per call,
as autocast's F.linear would) with fp32 math in the kernel; with fp32 x and W and no autocast
everything is fp32. The loss is fp32 under autocast, else in the inputs' dtype (as
F.cross_entropy). dx comes back in x's dtype, dW in W's. An out-of-range target (not -1, not in
[0, V)) cannot raise without a host sync: its row's loss is NaN, so the mean is NaN.
"""
import os

import torch
from torch import Tensor

from . import _preflight_checks, checks, gemm, register_tk
from .build import LazyExtension
from .checks import fail, require_tensor, shape_str

_ext = LazyExtension("tk_lm_head", ["cross_entropy.cu", "lm_head_bindings.cpp"])

OP = "tk_lm_head"
DTYPES = (torch.bfloat16, torch.float32)
# TK_LM_HEAD_CHUNK_MB: a chunk's logits size in MB, read at import (default 512). Smaller chunks need
# less memory; at GPT-2's shape 1024 (4 chunks) ran as fast as 512 (8) in session 11's A/B
# (tk+compile 54.90 / 55.18 vs 55.04 ms a step), so the default stays.
CHUNK_ENV = "TK_LM_HEAD_CHUNK_MB"


def _chunk_bytes():
    text = os.environ.get(CHUNK_ENV, "512").strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{CHUNK_ENV}={text!r}: give a chunk's logits size in MB, a positive whole number "
                         f"(default 512), or unset it")
    return int(text) * 2**20


CHUNK_BYTES = _chunk_bytes()   # a chunk's logits: at most this (GPT-2: 4096 rows, 412 MB; 8 chunks)

# TK_LM_HEAD_LOGITS: which GEMM computes each chunk's logits (x_c·Wᵀ, K = 768 and N = 50304 at
# GPT-2): "tk", the default since session 12, is the tk GEMM (kernels/gemm.py, its auto plan);
# "cublas" (the opt-out) is torch.mm. Why tk: in session 11's profile cuBLAS ran this product at
# 458 us a chunk against 399 for dx's product of the same flops (it writes 412 MB of logits; dx
# writes 6 MB), and the tk GEMM stores its tiles under the next tile's math (issue 3: 1.03-1.09x
# cuBLAS at GPT-2's forward shapes). Measured in session 12 (call 1, H200, GPT-2 124M step under
# torch.compile, tests/gpu_e2e_env_ab.sh, 3 alternating rounds, each run a fresh process): tk
# 55.78, 55.63, 55.57 ms a step, cublas 55.65, 56.24, 56.03; medians 55.63 vs 56.03 (-0.40 ms,
# -0.7%; predicted -0.1..-0.3). One draw, with the machine's other GPU running another benchmark
# at the time. Where the tk GEMM does not take the product (not bf16, K or V not a multiple of 16:
# shakespeare-char's V = 65; no Hopper GPU, so no tk GEMM) cuBLAS runs it.
LOGITS_ENV = "TK_LM_HEAD_LOGITS"


def _logits_gemm():
    name = os.environ.get(LOGITS_ENV, "tk").strip() or "tk"
    if name not in ("tk", "cublas"):
        raise ValueError(f"{LOGITS_ENV}={name!r}: use tk (the default: the tk GEMM) or cublas")
    return name


LOGITS_GEMM = _logits_gemm()

# Which kernel of cross_entropy.cu the op asks for, by row width: rows_in_shared ("shared") for
# GPT-2's 50304-wide rows, rows_per_warp ("warp") for shakespeare-char's 65. "auto" is what ran
# first (rows_in_registers where the row fits, else rows_streamed); a kernel that cannot take a
# row falls back to it. Measured on the H200 (session 3's final call, kernel alone, loss +
# gradient): shared 0.221 ms vs registers 0.327 ms on a 4096 x 50304 bf16 chunk; warp 0.013 ms vs
# streamed 0.067 ms on 16384 x 65. Session 4's probe: every GPU test passed with them (the fp32
# V=5 tolerance fixed), and the GPT-2 tk step went 62.82 -> 61.26 ms with "shared" (bench --e2e).
# TK_LM_HEAD_KERNEL_WIDE / _NARROW override them ("auto" gives the first kernels back). Session 11's
# rows_pipelined (persistent blocks, two row buffers) lost to "shared" on the H200 in session 12
# (253.6 vs 220.3 us a GPT-2 chunk) and was removed.
KERNEL_WIDE = os.environ.get("TK_LM_HEAD_KERNEL_WIDE", "shared")       # rows wider than NARROW_COLS (GPT-2: 50304)
KERNEL_NARROW = os.environ.get("TK_LM_HEAD_KERNEL_NARROW", "warp")   # rows of at most NARROW_COLS (shakespeare-char: 65)
NARROW_COLS = 1024   # the widest row rows_per_warp takes (WARP_ROW_COLS in cross_entropy.cu)


# ---- 0. input checks: the public op's arguments (the bindings check the kernel's own) ---------

def check_inputs(x, weight, targets, cuda=True):
    """Raise TypeError/ValueError naming the argument unless the op takes x (N, C), weight (V, C)
    and targets (N,) int64."""
    require_tensor(OP, "x", x, dtypes=DTYPES, ndim=2, cuda=cuda)
    require_tensor(OP, "weight", weight, dtypes=DTYPES, ndim=2, cuda=cuda, same_device_as=("x", x))
    require_tensor(OP, "targets", targets, dtypes=(torch.int64,), ndim=1, cuda=cuda, same_device_as=("x", x),
                   hint=" (class indices; -1 = ignore)")
    N, C = x.shape
    if weight.shape[1] != C:
        fail(OP, f"weight must have shape (vocab, {C}) to match x's last dimension, got {shape_str(weight.shape)}")
    if targets.shape[0] != N:
        fail(OP, f"targets must have one class per row of x ({N}), got shape {shape_str(targets.shape)}")
    if N < 1 or weight.shape[0] < 1 or C < 1:
        fail(OP, f"x {shape_str(x.shape)} and weight {shape_str(weight.shape)} must be non-empty")
    if N >= 2**31:
        fail(OP, f"x must have fewer than 2^31 rows, got {N}")


# ---- 1. the chunk loop: forward, and the gradient with it ------------------------------------

def chunk_rows(n, vocab, element_size):
    """Rows per chunk: a power of two whose logits fit in CHUNK_BYTES (at least 1, at most n)."""
    fit = max(1, CHUNK_BYTES // (vocab * element_size))
    return min(n, 1 << (fit.bit_length() - 1))


# bf16 x bf16 -> fp32 products through torch's `out_dtype` (cuBLAS accumulates in fp32 and
# stores fp32, no bf16 rounding). Whether addmm takes an fp32 accumulator beside bf16 inputs
# depends on the torch version (some refuse: "self and mat2 must have the same dtype"): the
# first call finds out (the check raises on the host, before anything is queued, so this is
# safe inside CUDA graph capture too) and later calls take the path that works.
_fp32_gemm_ok = {"mm": None, "addmm": None}   # None: not tried yet


def _try(kind, fn):
    """Runs fn (a GEMM with out_dtype) unless this torch refused it before; False if refused.
    Only the first call may conclude "refused": later errors (OOM, a CUDA error) propagate."""
    if _fp32_gemm_ok[kind] is False:
        return False
    if _fp32_gemm_ok[kind]:
        fn()
        return True
    try:
        fn()
    except torch.cuda.OutOfMemoryError:   # a real failure of a supported call
        raise
    except (RuntimeError, TypeError):   # TypeError: a torch without the out_dtype argument
        _fp32_gemm_ok[kind] = False
        return False
    _fp32_gemm_ok[kind] = True
    return True


def _mm_into(out, a, b):
    """out = a·b on cuBLAS; out may be fp32 with bf16 a and b."""
    if out.dtype == a.dtype:
        torch.mm(a, b, out=out)
    elif not out.is_cuda:   # CPU (the tests' fake extension): no out_dtype there
        out.copy_(a.float() @ b.float())
    elif not _try("mm", lambda: torch.mm(a, b, out_dtype=out.dtype, out=out)):
        out.copy_(torch.mm(a, b))   # rounded to bf16 once, then widened


def _addmm_into(acc, a, b):
    """acc += a·b in acc's dtype (fp32 with bf16 a and b: cuBLAS with beta = 1, the partial sums
    never rounded to bf16)."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif not acc.is_cuda:
        acc.add_(a.float() @ b.float())
    elif not _try("addmm", lambda: torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)):
        part = torch.empty_like(acc)                    # one more pass over dW per chunk
        _mm_into(part, a, b)
        acc.add_(part)


def _logits_into(out, x_c, w):
    """out = x_c·wᵀ: the tk GEMM where it takes the product, else (or with TK_LM_HEAD_LOGITS=cublas) cuBLAS."""
    K, V = w.shape[1], w.shape[0]
    if (LOGITS_GEMM == "tk" and x_c.dtype == w.dtype == out.dtype == torch.bfloat16 and K % 16 == 0
            and V % 16 == 0 and gemm.why_not() is None):
        gemm.matmul(x_c, w.t(), out=out, step=0)
    else:
        torch.mm(x_c, w.t(), out=out)


def _cross_entropy_(logits, targets, loss_rows, grad_scale, write_grad):
    """The kernel on one chunk: loss_rows filled; with write_grad, dlogits in place of logits."""
    kernel = KERNEL_NARROW if logits.shape[1] <= NARROW_COLS else KERNEL_WIDE
    _ext.module.cross_entropy_(logits, targets, loss_rows, grad_scale, write_grad, kernel)


def _loss_and_grads(x, weight, targets, compute_bf16, need_grad):
    """(loss fp32 scalar, dx (N, C) in x's dtype, dW (V, C) in weight's dtype); dx and dW are
    None without need_grad. Inputs already checked."""
    N, C = x.shape
    V = weight.shape[0]
    dtype = torch.bfloat16 if compute_bf16 else x.dtype
    with torch.autocast(x.device.type, enabled=False):   # dtypes are chosen here, not by autocast
        w = weight.to(dtype)
        xc = x.to(dtype)
        targets = targets.contiguous()
        n_valid = (targets != -1).sum()
        grad_scale = n_valid.to(torch.float32).reciprocal().reshape(1)   # inf when 0: all grads are 0 then
        loss_rows = torch.empty(N, device=x.device, dtype=torch.float32)
        dx = torch.empty(N, C, device=x.device, dtype=x.dtype) if need_grad else None
        dw = torch.empty(V, C, device=x.device, dtype=torch.float32) if need_grad else None
        rows = chunk_rows(N, V, w.element_size())
        buffer = torch.empty(rows, V, device=x.device, dtype=dtype)
        for r0 in range(0, N, rows):
            r1 = min(N, r0 + rows)
            logits = buffer[: r1 - r0]
            _logits_into(logits, xc[r0:r1], w)
            _cross_entropy_(logits, targets[r0:r1], loss_rows[r0:r1], grad_scale, need_grad)
            if need_grad:
                _mm_into(dx[r0:r1], logits, w)               # dx_c = dlogits_c · W
                if r0 == 0:                                 # dW = dlogits_0ᵀ · x_0 (no zeroing pass)
                    _mm_into(dw, logits.t(), xc[r0:r1])
                else:                                       # dW += dlogits_cᵀ · x_c
                    _addmm_into(dw, logits.t(), xc[r0:r1])
        loss = loss_rows.sum() / n_valid                    # NaN when every target is -1, as torch
        if need_grad:
            dw = dw.to(weight.dtype)
    return loss, dx, dw


# ---- 2. the custom op: what torch.compile sees -----------------------------------------------

@torch.library.custom_op("tk::lm_head_loss", mutates_args=())
def lm_head_loss_op(x: Tensor, weight: Tensor, targets: Tensor, compute_bf16: bool,
                    need_grad: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(loss fp32 scalar, dx, dW); dx and dW are empty (0,) tensors without need_grad."""
    check_inputs(x, weight, targets)
    loss, dx, dw = _loss_and_grads(x, weight, targets, compute_bf16, need_grad)
    if not need_grad:
        dx, dw = x.new_empty(0), weight.new_empty(0)
    return loss, dx, dw


@lm_head_loss_op.register_fake
def _(x, weight, targets, compute_bf16, need_grad):
    loss = x.new_empty((), dtype=torch.float32)
    if not need_grad:
        return loss, x.new_empty(0), weight.new_empty(0)
    return loss, torch.empty_like(x), torch.empty_like(weight)


# ---- 3. autograd: the gradients are already computed; backward scales them by grad_output ----

def _setup(ctx, inputs, output):
    _, dx, dw = output
    ctx.save_for_backward(dx, dw)


def _backward(ctx, grad_loss, _grad_dx, _grad_dw):
    dx, dw = ctx.saved_tensors
    return dx * grad_loss, dw * grad_loss, None, None, None


lm_head_loss_op.register_autograd(_backward, setup_context=_setup)


class _LMHeadEager(torch.autograd.Function):
    """lm_head_loss_op without torch.library (kernels/layernorm.py, section 4, says why): the
    same computation, one output, and a backward that scales the saved gradients."""
    @staticmethod
    def forward(ctx, x, weight, targets, compute_bf16, need_grad):
        check_inputs(x, weight, targets)
        loss, dx, dw = _loss_and_grads(x, weight, targets, compute_bf16, need_grad)
        if need_grad:
            ctx.save_for_backward(dx, dw)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        return _backward(ctx, grad_loss, None, None)


# ---- 4. the public op, with the same signature as reference.lm_head_loss ---------------------

def _autocast_bf16():
    return torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16


def lm_head_loss(x, weight, targets):
    """Mean cross-entropy of x·weightᵀ against targets (-1 = ignore): x (N, C), weight (V, C),
    targets (N,). The gradients of x and weight are computed in this forward when needed."""
    autocast = _autocast_bf16()
    compute_bf16 = autocast or x.dtype == torch.bfloat16
    need_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if torch.compiler.is_compiling():
        loss, _, _ = lm_head_loss_op(x, weight, targets, compute_bf16, need_grad)
    else:
        loss = _LMHeadEager.apply(x, weight, targets, compute_bf16, need_grad)
    # F.cross_entropy's dtype: fp32 under autocast (it is on autocast's fp32 list), else the logits'
    return loss if autocast else loss.to(x.dtype)


# ---- 5. the support check and registration ---------------------------------------------------

@torch.compiler.assume_constant_result
def _build_reason():
    # Under torch.compile this runs once at trace time and its answer is a constant, so the
    # build (file locks, nvcc) never gets traced.
    return _ext.why_not()


def why_not(x, weight, targets):
    """None if the tk LM head can run on these inputs, else the reason it cannot."""
    if not checks.on_kernel_device(x):
        return f"x is on {x.device.type}; the tk kernel needs CUDA tensors"
    for name, t in (("weight", weight), ("targets", targets)):
        if t.device != x.device:
            return f"{name} is on {t.device}, x on {x.device}"
    if x.dim() != 2 or weight.dim() != 2 or targets.dim() != 1:
        return (f"expected x (N, C), weight (V, C), targets (N,); got {tuple(x.shape)}, {tuple(weight.shape)}, "
                f"{tuple(targets.shape)}")
    if weight.shape[1] != x.shape[1] or targets.shape[0] != x.shape[0]:
        return f"shapes do not match: x {tuple(x.shape)}, weight {tuple(weight.shape)}, targets {tuple(targets.shape)}"
    if targets.dtype != torch.int64:
        return f"targets is {targets.dtype}; the kernel takes int64 class indices"
    if torch.is_autocast_enabled("cuda") and not _autocast_bf16():
        return f"autocast to {torch.get_autocast_dtype('cuda')}; the tk LM head computes in bfloat16 or float32"
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in DTYPES:
            return f"{name} is {t.dtype}; the tk LM head takes bfloat16 or float32"
    if not _autocast_bf16() and x.dtype != weight.dtype:
        return f"x is {x.dtype} but weight is {weight.dtype}; cast one, or run under bf16 autocast"
    if x.numel() == 0 or weight.numel() == 0:
        return "x or weight is empty"
    if x.shape[0] >= 2**31:
        return f"x has {x.shape[0]} rows; the kernel takes fewer than 2^31"
    return _build_reason()


def preflight(dtype, device, **_):
    """Start-up check for the configured model; builds the extension now, not mid-step, and the
    tk GEMM's for the logits (if that cannot build, the logits run on cuBLAS: not a failure)."""
    if not str(device).startswith("cuda"):
        return f"device={device}; the tk kernel needs CUDA"
    if dtype not in DTYPES:
        return f"dtype={dtype}; the tk LM head computes in bfloat16 or float32"
    if LOGITS_GEMM == "tk":
        gemm.why_not()
    return _ext.why_not()


register_tk("lm_head", lm_head_loss, why_not)
_preflight_checks["lm_head"] = preflight

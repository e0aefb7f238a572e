"""tk LayerNorm, the Python half: custom ops, autograd, the support check, registration.

Read after kernels/__init__.py (the switch); the kernel itself is kernels/layernorm.cu and its
input checks are in check_forward/check_backward below (kernels/checks.py says why in Python),
repeated in kernels/layernorm_bindings.cpp.

This file is also THE PATTERN for an op module (attention.py, mlp.py copy it):
  1. `_ext = LazyExtension(name, sources)`: the C++/CUDA half, built on first use (build.py).
  2. `torch.library.custom_op`s that call the extension (through one plain function per
     call, which also runs the input checks). Each gets `register_fake` (output shapes and
     dtypes only, so torch.compile can trace without running the kernel); the forward ops get
     `register_autograd`, whose backward calls the backward custom op, so the whole step stays
     visible to torch.compile and DDP. Outside torch.compile the public op takes an eager fast
     path instead: a plain autograd.Function around the same plain functions, with the same
     setup_context and backward (the custom-op path costs too much CPU per call; section 4).
  3. `why_not(...)` with the public op's arguments: None if the kernel takes these inputs,
     else a short reason ("x is on cpu", "hidden size 100 is not a multiple of 64"). Cheap,
     and it builds the extension only after every other check passed on a CUDA tensor.
  4. `register_tk(op, impl, why_not)` and `_preflight_checks[op]` (the start-up check).
Nothing here builds at import.

Dtypes (section 4, add_layernorm, says why): h = x + residual in torch's promoted dtype; y in
bf16 under bf16 autocast (its readers are bf16 matmuls), else in h's dtype; each gradient in its
own input's dtype. The kernel reads and writes every tensor in its own dtype: no cast kernels.

Dropout (session 4): add_layernorm(..., dropout_p) computes h = x + dropout(residual) in the same
kernel. The mask is a function of a seed tensor drawn on the GPU for every call (section 4) and
of each element's index (layernorm.cu, "dropout"; dropout_keep_mask below is its twin in numpy),
so the backward regenerates it from the saved seed and nothing but the seed is saved.
"""
import math
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _preflight_checks, checks, register_tk
from .build import LazyExtension
from .checks import InputDTypeError, dtype_str, fail, realign16, require_number, require_same_dtype, require_tensor, shape_str
import numpy as np

_ext = LazyExtension("tk_layernorm", ["layernorm.cu", "layernorm_bindings.cpp"])

DTYPES = (torch.bfloat16, torch.float32)   # activations and parameters; statistics are fp32
MAX_COLS = 4096                            # hidden sizes: multiples of 64 up to this
OP = "tk_layernorm"


# ---- 0. input checks: those of layernorm_bindings.cpp, in Python (see kernels/checks.py) -------

def _check_activation(name, t, cuda, like=None, or_bf16=""):
    """bf16/fp32, contiguous, 16-byte aligned (the kernel moves 16-byte vectors). like = (name,
    tensor): same device, dtype and shape as it (or_bf16: or bf16 instead of its dtype; the text
    says why, for the error); else a supported hidden size."""
    require_tensor(OP, name, t, dtypes=DTYPES, contiguous=True, aligned=True, cuda=cuda, same_device_as=like)
    if like is not None:
        if not or_bf16:
            require_same_dtype(OP, name, t, *like)
        elif t.dtype not in (like[1].dtype, torch.bfloat16):
            fail(OP, f"{name} is {dtype_str(t.dtype)} but {like[0]} is {dtype_str(like[1].dtype)}; it must have "
                     f"{like[0]}'s dtype{or_bf16}", InputDTypeError)
        if t.shape != like[1].shape:
            fail(OP, f"{name} has shape {shape_str(t.shape)} but {like[0]} has {shape_str(like[1].shape)}")
        return
    if t.dim() < 1:
        fail(OP, f"{name} must have at least one dimension (the hidden size), got a 0-d tensor")
    cols = t.shape[-1]
    if cols % 64 or not 64 <= cols <= MAX_COLS:
        fail(OP, f"{name}'s last dimension (the hidden size) must be a multiple of 64 between 64 and "
                 f"{MAX_COLS}, got {cols}; use --kernels_layernorm=torch for other sizes")


def _check_param(name, p, x_name, x, cuda, weight=None):
    """weight or bias: (hidden,) bf16/fp32 on x's device; bias has weight's dtype. Any strides
    (the bindings make it contiguous)."""
    require_tensor(OP, name, p, dtypes=DTYPES, cuda=cuda, same_device_as=(x_name, x))
    if weight is not None:
        require_same_dtype(OP, name, p, "weight", weight)
    cols = x.shape[-1]
    if p.dim() != 1 or p.shape[0] != cols:
        fail(OP, f"{name} has shape {shape_str(p.shape)}, but {x_name}'s last dimension is {cols}; "
                 f"it must have shape ({cols},)")


def _check_stats(name, t, h, cuda):
    """mean or rstd from the forward: fp32, contiguous, one value per row of h."""
    require_tensor(OP, name, t, dtypes=(torch.float32,), contiguous=True, cuda=cuda, same_device_as=("h", h))
    rows = h.numel() // h.shape[-1]
    if t.numel() != rows:
        fail(OP, f"{name} must have one value per row of h ({rows}), got shape {shape_str(t.shape)}; "
                 f"pass the mean/rstd the forward returned for this h")


def check_dropout_p(p):
    """dropout_p: a number in [0, 1) (1 would drop everything and scale by infinity)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        fail(OP, f"dropout_p must be a number, got {type(p).__name__}", TypeError)
    if not 0 <= p < 1:
        fail(OP, f"dropout_p must be in [0, 1), got {p}")


def _check_dropout(seed, p, like_name, like, cuda):
    """dropout_seed: one int64 on like's device (None: no dropout); dropout_p in [0, 1)."""
    if seed is None:
        return
    require_tensor(OP, "dropout_seed", seed, dtypes=(torch.int64,), cuda=cuda, same_device_as=(like_name, like))
    if seed.numel() != 1:
        fail(OP, f"dropout_seed must hold one value, got shape {shape_str(seed.shape)}")
    check_dropout_p(p)


def check_forward(x, residual, weight, bias, eps, y_bf16=False, dropout_seed=None, dropout_p=0.0, cuda=True):
    """Raise TypeError/ValueError naming the argument unless forward() takes these inputs: x
    (and h) float32 or bf16, the residual x's dtype or bf16, y in x's dtype or (y_bf16) bf16;
    dropout_seed (with a residual to drop) one int64 on x's device, dropout_p in [0, 1)."""
    _check_activation("x", x, cuda)
    if residual is not None:
        _check_activation("residual", residual, cuda, like=("x", x),
                          or_bf16=" (or bfloat16): h = x + residual is stored in x's dtype, so pass the wider one as x")
    require_number(OP, "eps", eps, minimum=0)
    if not isinstance(y_bf16, bool):
        fail(OP, f"y_bf16 must be True or False, got {type(y_bf16).__name__}", TypeError)
    _check_param("weight", weight, "x", x, cuda)
    if bias is not None:
        _check_param("bias", bias, "x", x, cuda, weight=weight)
    if dropout_seed is not None and residual is None:
        fail(OP, "dropout_seed is given but residual is None: dropout applies to the residual")
    _check_dropout(dropout_seed, dropout_p, "x", x, cuda)


def check_backward(dy, dh, h, mean, rstd, weight, residual_grad_bf16=False, dropout_seed=None, dropout_p=0.0,
                   cuda=True):
    """Raise TypeError/ValueError naming the argument unless backward() takes these inputs: dy in
    h's dtype or bf16 (y's dtype), dh in h's; residual_grad_bf16 (a bf16 copy of the gradient for
    a bf16 residual) only with float32 h."""
    _check_activation("h", h, cuda)
    _check_activation("dy", dy, cuda, like=("h", h), or_bf16=" (or bfloat16, when y was bfloat16)")
    if residual_grad_bf16 and h.dtype != torch.float32:
        fail(OP, f"residual_grad_bf16 is for a bfloat16 residual beside float32 h, but h is {dtype_str(h.dtype)}: "
                 f"dh_out is already the residual's gradient")
    if dh is not None:
        _check_activation("dh", dh, cuda, like=("h", h))
    _check_stats("mean", mean, h, cuda)
    _check_stats("rstd", rstd, h, cuda)
    _check_dropout(dropout_seed, dropout_p, "h", h, cuda)
    _check_param("weight", weight, "h", h, cuda)


# ---- 1. the extension calls (after the input checks), used by the custom ops and the fast path

def _options(**flags):
    """The bindings' keyword options that are on. Off is their default (every tensor in h's
    dtype), so a same-dtype call passes none: the call tests/test_fast_path.py's fake knows."""
    return {name: True for name, on in flags.items() if on}


def _dropout_options(seed, p):
    """The bindings' dropout keywords: none without a seed (the call without any dropout code)."""
    return {} if seed is None else {"dropout_seed": seed, "dropout_p": float(p)}


def _ext_forward(x, residual, weight, bias, eps, y_bf16=False, seed=None, p=0.0):
    """h = x + residual (in x's dtype), y = LN(h) (bf16 if y_bf16, else x's dtype); with a seed,
    h = x + dropout(residual). Returns (y, h, mean, rstd); h is None when residual is None."""
    x, residual = realign16(x), realign16(residual)   # a view at an odd offset: copy (why_not takes it)
    check_forward(x, residual, weight, bias, eps, y_bf16, seed, p)
    y, h, mean, rstd = _ext.module.forward(x, residual, weight, bias, eps, **_options(y_bf16=y_bf16),
                                           **_dropout_options(seed, p))
    return y, h, mean, rstd


def _ext_backward_both(dy, dh, h, mean, rstd, weight, residual_grad_bf16, seed=None, p=0.0):
    """(dh_out, dresidual, dweight, dbias): dh_out = dh + LN's input gradient in h's dtype (dh may
    be None); dresidual is the residual's gradient: in bf16 when residual_grad_bf16, else h's
    dtype; with a seed, dh_out * mask / (1 - p) (the forward's mask); else dh_out itself."""
    dy, h = realign16(dy), realign16(h)
    dh = None if dh is None else realign16(dh)
    check_backward(dy, dh, h, mean, rstd, weight, residual_grad_bf16, seed, p)
    out = _ext.module.backward(dy, dh, h, mean, rstd, weight, **_options(residual_grad_bf16=residual_grad_bf16),
                               **_dropout_options(seed, p))
    dx, dw, db = out[:3]
    return dx, (out[3] if len(out) == 4 else dx), dw, db


def _ext_backward(dy, dh, h, mean, rstd, weight):
    """Returns (dh_out, dweight, dbias): dh_out = dh + LN's input gradient (dh may be None)."""
    dx, _, dw, db = _ext_backward_both(dy, dh, h, mean, rstd, weight, False)
    return dx, dw, db


def _ext_backward_mixed(dy, dh, h, mean, rstd, weight):
    """As _ext_backward, for a bf16 residual beside fp32 h: (dh_out, dresidual_bf16, dweight, dbias)."""
    return _ext_backward_both(dy, dh, h, mean, rstd, weight, True)


def _ext_backward_dropout(dy, dh, h, mean, rstd, weight, seed, p, residual_grad_bf16):
    """With the forward's dropout: (dh_out, dresidual, dweight, dbias), dresidual = dh_out * mask
    / (1 - p) in bf16 (residual_grad_bf16) or h's dtype."""
    return _ext_backward_both(dy, dh, h, mean, rstd, weight, residual_grad_bf16, seed, p)


# ---- 2. the custom ops: what torch.compile sees ----------------------------------------------

@torch.library.custom_op("tk::add_layernorm_fwd", mutates_args=())
def add_layernorm_fwd(x: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor],
                      eps: float, y_bf16: bool = False, seed: Optional[Tensor] = None,
                      dropout_p: float = 0.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """h = x + residual in x's dtype (residual: x's dtype or bf16), y = LN(h) in bf16 if y_bf16
    else x's dtype. Returns (y, h, mean, rstd); mean/rstd are fp32, per row. With a seed (one
    int64 on the device), h = x + dropout(residual, dropout_p), the mask a function of the seed."""
    y, h, mean, rstd = _ext_forward(x, residual, weight, bias, eps, y_bf16, seed, dropout_p)
    return y, h, mean, rstd


@torch.library.custom_op("tk::layernorm_fwd", mutates_args=())
def layernorm_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                  y_bf16: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """y = LN(x), no residual: the kernel skips reading r and writing h. Returns (y, mean, rstd)."""
    y, _, mean, rstd = _ext_forward(x, None, weight, bias, eps, y_bf16)
    return y, mean, rstd


@torch.library.custom_op("tk::layernorm_bwd", mutates_args=())
def layernorm_bwd(dy: Tensor, dh: Optional[Tensor], h: Tensor, mean: Tensor, rstd: Tensor,
                  weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (dh_out, dweight, dbias): dh_out = dh + LN's input gradient (dh may be None)."""
    dx, dw, db = _ext_backward(dy, dh, h, mean, rstd, weight)
    return dx, dw, db


@torch.library.custom_op("tk::layernorm_bwd_mixed", mutates_args=())
def layernorm_bwd_mixed(dy: Tensor, dh: Optional[Tensor], h: Tensor, mean: Tensor, rstd: Tensor,
                        weight: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """layernorm_bwd for a bf16 residual beside fp32 h: (dh_out, dresidual, dweight, dbias), the
    kernel writing the residual's gradient in bf16 next to dh_out (no cast kernel)."""
    dx, dr, dw, db = _ext_backward_mixed(dy, dh, h, mean, rstd, weight)
    return dx, dr, dw, db


@torch.library.custom_op("tk::layernorm_bwd_dropout", mutates_args=())
def layernorm_bwd_dropout(dy: Tensor, dh: Optional[Tensor], h: Tensor, mean: Tensor, rstd: Tensor,
                          weight: Tensor, seed: Tensor, dropout_p: float,
                          residual_grad_bf16: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """layernorm_bwd after a forward with dropout: (dh_out, dresidual, dweight, dbias), the
    residual's gradient dh_out * mask / (1 - p) (the mask regenerated from the forward's seed),
    in bf16 with residual_grad_bf16, else in h's dtype."""
    dx, dr, dw, db = _ext_backward_dropout(dy, dh, h, mean, rstd, weight, seed, dropout_p, residual_grad_bf16)
    return dx, dr, dw, db


def _y_like(x, y_bf16):
    return torch.empty_like(x, dtype=torch.bfloat16 if y_bf16 else x.dtype)


@add_layernorm_fwd.register_fake
def _(x, residual, weight, bias, eps, y_bf16=False, seed=None, dropout_p=0.0):
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return _y_like(x, y_bf16), torch.empty_like(x), stats, torch.empty_like(stats)


@layernorm_fwd.register_fake
def _(x, weight, bias, eps, y_bf16=False):
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return _y_like(x, y_bf16), stats, torch.empty_like(stats)


@layernorm_bwd.register_fake
def _(dy, dh, h, mean, rstd, weight):
    return torch.empty_like(h), torch.empty_like(weight), torch.empty_like(weight)


@layernorm_bwd_mixed.register_fake
def _(dy, dh, h, mean, rstd, weight):
    return (torch.empty_like(h), torch.empty_like(h, dtype=torch.bfloat16), torch.empty_like(weight),
            torch.empty_like(weight))


@layernorm_bwd_dropout.register_fake
def _(dy, dh, h, mean, rstd, weight, seed, dropout_p, residual_grad_bf16):
    dr = torch.empty_like(h, dtype=torch.bfloat16 if residual_grad_bf16 else h.dtype)
    return torch.empty_like(h), dr, torch.empty_like(weight), torch.empty_like(weight)


# ---- 3. autograd: save h (not x and r) and the fp32 statistics; backward is one more call ----
# One setup_context and one backward body serve both paths: registered on the custom ops, the
# backward calls the custom op layernorm_bwd (so torch.compile sees it); on the eager fast path
# (section 4) it calls _ext_backward directly.

def _setup_add(ctx, inputs, output):
    x, residual, weight, bias, _, _, seed, dropout_p = inputs
    y, h, mean, rstd = output
    ctx.save_for_backward(h, mean, rstd, weight, seed)   # seed: None without dropout
    ctx.dropout_p = dropout_p
    ctx.has_bias = bias is not None
    ctx.y_dtype = y.dtype
    ctx.mixed = residual.dtype != x.dtype   # a bf16 residual beside fp32 x: its gradient in bf16


def _make_backward_add(ln_backward, ln_backward_mixed, ln_backward_dropout):
    def backward(ctx, dy, dh, _dmean, _drstd):
        h, mean, rstd, weight, seed = ctx.saved_tensors
        # None: y did not reach the loss
        dy = torch.zeros_like(h, dtype=ctx.y_dtype) if dy is None else dy.contiguous()
        dh = None if dh is None else dh.contiguous()
        # h = x + residual, so both get the same gradient (as torch.add's backward does), each in
        # its own dtype (as the cast in torch's promoted add would give it). With dropout the
        # residual's is masked and scaled: the kernel regenerates the forward's mask from seed.
        if seed is not None:
            dx, dr, dw, db = ln_backward_dropout(dy, dh, h, mean, rstd, weight, seed, ctx.dropout_p, ctx.mixed)
        elif ctx.mixed:
            dx, dr, dw, db = ln_backward_mixed(dy, dh, h, mean, rstd, weight)
        else:
            dx, dw, db = ln_backward(dy, dh, h, mean, rstd, weight)
            dr = dx
        return dx, dr, dw, (db if ctx.has_bias else None), None, None, None, None
    return backward


def _setup_plain(ctx, inputs, output):
    x, weight, bias, _, _ = inputs
    y, mean, rstd = output
    ctx.save_for_backward(x, mean, rstd, weight)
    ctx.has_bias = bias is not None
    ctx.y_dtype = y.dtype


def _make_backward_plain(ln_backward):
    def backward(ctx, dy, _dmean, _drstd):
        x, mean, rstd, weight = ctx.saved_tensors
        dy = torch.zeros_like(x, dtype=ctx.y_dtype) if dy is None else dy.contiguous()
        dx, dw, db = ln_backward(dy, None, x, mean, rstd, weight)
        return dx, dw, (db if ctx.has_bias else None), None, None
    return backward


add_layernorm_fwd.register_autograd(_make_backward_add(layernorm_bwd, layernorm_bwd_mixed, layernorm_bwd_dropout),
                                    setup_context=_setup_add)
layernorm_fwd.register_autograd(_make_backward_plain(layernorm_bwd), setup_context=_setup_plain)


# The fast path's autograd.Functions. Old style on purpose (ctx is forward's first argument and
# forward does the setup): with a separate setup_context staticmethod, Function.apply binds the
# arguments through inspect.signature on every call (~20 µs of CPU, torch 2.13). They also skip
# materializing zeros for the gradients of outputs that reached no loss (mean and rstd always;
# custom ops allocate and fill them): the backward takes None for those.
class _AddLayerNormEager(torch.autograd.Function):
    """add_layernorm_fwd without torch.library: the same call, saved tensors and backward."""
    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, y_bf16, seed, dropout_p):
        ctx.set_materialize_grads(False)
        output = _ext_forward(x, residual, weight, bias, eps, y_bf16, seed, dropout_p)   # (y, h, mean, rstd)
        _setup_add(ctx, (x, residual, weight, bias, eps, y_bf16, seed, dropout_p), output)
        return output

    backward = staticmethod(_make_backward_add(_ext_backward, _ext_backward_mixed, _ext_backward_dropout))


class _LayerNormEager(torch.autograd.Function):
    """layernorm_fwd without torch.library: the same call, saved tensors and backward."""
    @staticmethod
    def forward(ctx, x, weight, bias, eps, y_bf16):
        ctx.set_materialize_grads(False)
        y, _, mean, rstd = _ext_forward(x, None, weight, bias, eps, y_bf16)
        _setup_plain(ctx, (x, weight, bias, eps, y_bf16), (y, mean, rstd))
        return y, mean, rstd

    backward = staticmethod(_make_backward_plain(_ext_backward))


# ---- 4. the public op, with the same signature as reference.add_layernorm ---------------------
# Eager fast path: outside torch.compile the public op calls the autograd.Functions above, not
# the custom ops. Through torch.library (Python dispatch of the custom op, its generated autograd
# wrapper, then the backward custom op) fwd+bwd cost ~380 µs of CPU per call at 16384x768 on the
# H200 host, more than eager PyTorch's whole call (242 µs; kernels/NOTES.md, LayerNorm run 2).
# Under torch.compile the custom ops stay: the graph, fake tensors and opcheck are unchanged.

def _autocast_bf16():
    return torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16


def draw_dropout_seed(device):
    """The seed of one call's dropout mask: one int64 drawn ON the device with torch's generator.
    No host sync, and inside a CUDA graph the draw is replayed too (PyTorch makes its RNG ops
    graph-safe), so every replay gets a fresh seed and so a fresh mask."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def dropout_keep_mask(seed, rows, cols, p):
    """The kernels' dropout mask (layernorm.cu, "dropout"), in numpy: a (rows, cols) bool array,
    True where the element of the residual is kept, for an int seed. For tests and readers.

    Element i = row * cols + col is kept when its 16 bits of mix64(seed + (i // 4) * GAMMA) (bits
    16 * (i % 4) and up) are >= round(p * 65536); uint64 arithmetic wraps, as on the GPU."""
    gamma, m1, m2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    n = np.arange(rows * cols // 4, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed % 2**64) + n * gamma
        z = (z ^ (z >> np.uint64(30))) * m1
        z = (z ^ (z >> np.uint64(27))) * m2
        z = z ^ (z >> np.uint64(31))
    bits = (z[:, None] >> (np.uint64(16) * np.arange(4, dtype=np.uint64))) & np.uint64(0xFFFF)
    threshold = math.floor(p * 65536 + 0.5)
    return (bits >= np.uint64(threshold)).reshape(rows, cols)


# For A/B runs of the mask itself: TK_LAYERNORM_DROPOUT=unfused drops the residual with F.dropout
# (torch's mask, its own kernels) before the kernel, as model.py did before session 4.
DROPOUT_UNFUSED = os.environ.get("TK_LAYERNORM_DROPOUT", "") == "unfused"


def add_layernorm(x, residual, weight, bias, eps=1e-5, dropout_p=0.0):
    """h = x + residual (residual may be None); y = LayerNorm(h). Returns (y, h).
    With dropout_p > 0 (training): h = x + dropout(residual, dropout_p), in the same kernel
    (a fresh mask each call: draw_dropout_seed). dropout_p = 0 is the call without dropout.

    Dtypes: x and residual may be float32 and bf16 in either order (under autocast the model
    passes its fp32 residual stream and a bf16 branch output). h has x + residual's promoted
    dtype, as in the reference. y is bf16 when bf16 autocast is on, else h's dtype: under
    autocast y's readers are bf16 matmuls (c_attn, the MLP, lm_head), which would cast an fp32
    y to bf16 anyway. So this differs from reference.add_layernorm, which returns fp32 y for
    fp32 h under autocast: the values are the same up to that one bf16 rounding, and the
    kernel writing bf16 y directly saves the cast's read and write (and in the backward, the
    cast of the bf16 dy back to fp32). Each input's gradient comes back in its own dtype.
    """
    eager = not torch.compiler.is_compiling()
    y_bf16 = _autocast_bf16()
    check_dropout_p(dropout_p)
    if DROPOUT_UNFUSED and residual is not None and dropout_p > 0:
        residual, dropout_p = F.dropout(residual, dropout_p), 0.0
    if residual is None:   # (nothing to drop)
        op = _LayerNormEager.apply if eager else layernorm_fwd
        y, _, _ = op(x.contiguous(), weight.contiguous(), _contiguous(bias), float(eps), y_bf16)
        return y, x
    if residual.dtype != x.dtype and torch.promote_types(x.dtype, residual.dtype) == residual.dtype:
        # The kernel stores h in its first input's dtype; x + residual = residual + x, so the
        # wider one goes first. Autograd still returns each gradient to its own tensor.
        if dropout_p > 0:   # the kernel drops its second input, which would now be x (why_not says so too)
            fail(OP, f"dropout of a residual wider than x ({dtype_str(residual.dtype)} residual beside {dtype_str(x.dtype)} "
                     f"x): the kernel stores h in its first input's dtype and drops its second; apply F.dropout to the "
                     f"residual before the call, or use the reference (--kernels_layernorm=torch)")
        x, residual = residual, x
    seed = draw_dropout_seed(x.device) if dropout_p > 0 else None
    op = _AddLayerNormEager.apply if eager else add_layernorm_fwd
    y, h, _, _ = op(x.contiguous(), residual.contiguous(), weight.contiguous(), _contiguous(bias), float(eps), y_bf16,
                    seed, float(dropout_p))
    return y, h


def _contiguous(t):
    return None if t is None else t.contiguous()


# ---- 5. measuring variants of the kernels' plan (kernels/layernorm.cu, "variants") ------------

VARIANT_FLAGS = ("fwd_full", "bwd_reverse", "bwd_tree", "pdl", "fwd_early_pdl", "bwd_l2_first", "bwd_l2_first2",
                 "fwd_lean", "bwd_lean", "bwd_wide")


def set_variant(spec="default"):
    """Choose the kernels' plan for the launches that follow: a comma-separated list of
    VARIANT_FLAGS, "default" (the default plan, layernorm.cu's DEFAULT_PLAN; may be combined
    with more flags) or "none" (no flag: session 2's plan). Returns the flags now on ("none" if
    none). For measuring (kernels/layernorm_bench.py); a process starts with
    $TK_LAYERNORM_VARIANT, or the default plan. A CUDA graph keeps the plan it was captured with."""
    if not isinstance(spec, str):
        raise TypeError(f"tk_layernorm: set_variant takes a string of flags, got {type(spec).__name__}")
    return _ext.module.set_variant(spec)


def variant():
    """The flags on, comma-separated, or 'none'."""
    return _ext.module.variant()


# ---- 6. the support check and registration ---------------------------------------------------

@torch.compiler.assume_constant_result
def _build_reason():
    # Under torch.compile this runs once at trace time and its answer is a constant, so the
    # build (file locks, nvcc) never gets traced.
    return _ext.why_not()


def why_not(x, residual, weight, bias, eps=1e-5, dropout_p=0.0):
    """None if the tk kernel can run add_layernorm on these inputs, else the reason it cannot."""
    if not checks.on_kernel_device(x):
        return f"x is on {x.device.type}; the tk kernel needs CUDA tensors"
    if x.dim() < 1:
        return "x is a 0-d tensor; LayerNorm needs a hidden dimension"
    cols = x.shape[-1]
    if x.dtype not in DTYPES:
        return f"x is {x.dtype}; the tk kernel takes bfloat16 or float32"
    if residual is not None:
        if residual.device != x.device:
            return f"residual is on {residual.device}, x on {x.device}"
        if residual.shape != x.shape:
            return f"residual shape {tuple(residual.shape)} differs from x {tuple(x.shape)} (no broadcasting)"
        if residual.dtype not in DTYPES:
            return f"residual is {residual.dtype}; the tk kernel takes bfloat16 or float32"
        if dropout_p and torch.promote_types(x.dtype, residual.dtype) != x.dtype:
            return (f"dropout of a residual wider than x ({residual.dtype} beside {x.dtype}): the kernel drops "
                    f"its second input and stores h in its first's dtype, so it would have to drop x")
    if cols % 64 != 0 or not 64 <= cols <= MAX_COLS:
        return f"hidden size {cols} is not a multiple of 64 between 64 and {MAX_COLS}"
    if weight is None:
        return "LayerNorm without a weight is not supported by the tk kernel"
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if p.device != x.device or p.shape != (cols,) or p.dtype not in DTYPES:
            return f"{name} must be a ({cols},) bfloat16/float32 tensor on {x.device}, got {tuple(p.shape)} {p.dtype} on {p.device}"
    if bias is not None and bias.dtype != weight.dtype:
        return f"bias is {bias.dtype} but weight is {weight.dtype}"
    if not (isinstance(eps, (int, float)) and 0 <= eps < math.inf):   # as check_forward: NaN fails too
        return f"eps={eps} is not a finite number >= 0"
    if x.numel() == 0:
        return "x is empty"
    return _build_reason()


def preflight(batch_size, block_size, n_embd, device, **_):
    """Start-up check for the configured model; builds the extension now, not mid-step."""
    if not str(device).startswith("cuda"):
        return f"device={device}; the tk kernel needs CUDA"
    if n_embd % 64 != 0 or not 64 <= n_embd <= MAX_COLS:
        return f"n_embd={n_embd} is not a multiple of 64 between 64 and {MAX_COLS}"
    return _ext.why_not()


register_tk("layernorm", add_layernorm, why_not)
_preflight_checks["layernorm"] = preflight

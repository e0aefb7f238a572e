"""tk flash attention, the Python half: backends, custom ops, autograd, the support check.

(Named attention_op.py, not attention.py: a submodule kernels.attention would replace the
function kernels.attention() that model.py calls, because importing a submodule sets it as an
attribute of its package. kernels/__init__.py imports this module with the other op modules.)

Read after kernels/__init__.py (the switch) and kernels/layernorm.py (the op-module pattern this
file follows). The portable kernel is kernels/attention_portable.cu (read it first: its opening
comment explains the algorithm); its input checks are check_forward_inputs/check_backward_inputs
below (kernels/checks.py says why in Python), repeated in kernels/attention_bindings.cpp.

Backends. More than one kernel computes the same thing: the portable one (mma.sync, sm_80+)
and a Hopper one (wgmma + TMA, sm_90a, kernels/attention_hopper.cu). All take and return the
same tensors: o (B, H, T, D) bf16 laid out as (B, T, H, D), and lse (B, H, T) fp32 in natural
log. So the forward and the backward may even come from different backends. A backend is
registered with `register_backend(Backend(...), prefer=True|False)`; for each call the first
backend (in order of preference) that can take the inputs runs. `set_backend(name)` or the
environment variable TK_ATTENTION_BACKEND=<name> pins one (tests and bench.py use this).
Streams: the Hopper forward hands out its work through a counter that no other launch in flight
shares (the default's: one per CUDA stream and one per launch captured into a CUDA graph; the other
variants': one zeroed per call), so calls may run at once on several CUDA streams
(kernels/attention_hopper.py; until session 5 there was one counter per GPU and they could not).

The ops: `tk::attention_fwd(q, k, v, causal, scale, fwd_backend, bwd_backend) -> (o, lse)`
with `register_fake` and `register_autograd` (its backward is the op `tk::attention_bwd`), so
torch.compile traces through them and DDP sees ordinary autograd. The model calls the packed
twin, `tk::attention_qkv_fwd(qkv, ...)` on the c_attn output (B, T, 3, H, D), whose backward
`tk::attention_qkv_bwd` returns d(qkv) as one tensor: the kernel writes dq, dk, dv straight
into its three slices (the binding `backward_into`), so no stack or copy follows. Outside torch.compile the
public op calls _AttentionEager instead, a plain autograd.Function around the same backend calls
(less CPU per call). Nothing builds at import.
"""
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from . import _preflight_checks, checks, register_tk
from .build import LazyExtension
from .checks import FLOAT32_OVERFLOW, FLOAT32_UNDERFLOW, fail, require_number, require_tensor, shape_str

HEAD_DIMS = (64, 128)

_portable = LazyExtension("tk_attention", ["attention_portable.cu", "attention_bindings.cpp"])

OP = "tk attention"
MAX_SEQ = 65535 * 64      # grid.y = T / 64 blocks of at most 65535
INT32_MAX = 2**31 - 1


# ---- 0. input checks: those of attention_bindings.cpp, in Python (see kernels/checks.py) -------

def _check_input(name, t, q, cuda):
    """q, k, v, o, grad_out: bf16 (B, H, T, D) with q's shape on q's device, D in HEAD_DIMS, last
    dim contiguous, every row 16-byte aligned (cp.async moves 16 bytes at a time)."""
    require_tensor(OP, name, t, dtypes=(torch.bfloat16,), cuda=cuda, same_device_as=("q", q),
                   hint="; cast it or use --kernels_attention=torch")
    if t.dim() != 4:
        fail(OP, f"{name} must have shape (batch, heads, seq, head_dim); got {shape_str(t.shape)}")
    if t.shape != q.shape:
        fail(OP, f"{name} has shape {shape_str(t.shape)} but q has {shape_str(q.shape)} "
                 f"(q, k and v must match: no cross-attention or grouped heads)")
    B, H, T, D = t.shape
    if D not in HEAD_DIMS:
        fail(OP, f"head_dim of {name} is {D}; the kernel takes {' or '.join(map(str, HEAD_DIMS))}")
    if B == 0 or H == 0 or T == 0:
        fail(OP, f"{name} is empty: {shape_str(t.shape)}")
    if t.stride(3) != 1:
        fail(OP, f"{name} must be contiguous in its last (head_dim) dimension (strides {tuple(t.stride())}); "
                 f"call .contiguous() on it")
    if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:3]):
        fail(OP, f"every row of {name} must start on a 16-byte boundary (strides {tuple(t.stride())} must be "
                 f"multiples of 8 elements); call .contiguous() on it")
    if B * H > INT32_MAX or T > MAX_SEQ:
        fail(OP, f"{name} is too large: {shape_str(t.shape)} (batch*heads < 2^31, seq <= {MAX_SEQ})")


def check_forward_inputs(q, k, v, scale, cuda=True):
    """Raise TypeError/ValueError naming the argument unless the portable forward takes these."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_input(name, t, q, cuda)
    require_number(OP, "scale", scale, positive=True, float32=True)


def check_backward_inputs(grad_out, q, k, v, o, lse, scale, cuda=True):
    """Raise TypeError/ValueError naming the argument unless the portable backward takes these."""
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("grad_out", grad_out)):
        _check_input(name, t, q, cuda)
    require_tensor(OP, "lse", lse, dtypes=(torch.float32,), shape=tuple(q.shape[:3]), contiguous=True,
                   cuda=cuda, same_device_as=("q", q))
    require_number(OP, "scale", scale, positive=True, float32=True)


# ---- 1. backends -----------------------------------------------------------------------------

@dataclass
class Backend:
    name: str
    # (q, causal, scale) -> None, or the reason this backend cannot run here. Called after the
    # common checks of `why_not` below passed (CUDA, bf16, shapes, head_dim), so it only checks
    # what is its own (GPU architecture, its build, its extra limits).
    why_not: Callable
    forward: Optional[Callable] = None    # (q, k, v, causal, scale) -> (o, lse)
    # (grad_out, q, k, v, o, lse, causal, scale, out=None) -> (dq, dk, dv); with out=(dq, dk, dv)
    # (views, e.g. of one packed gradient buffer) it writes those and returns them
    backward: Optional[Callable] = None
    # (q, causal, scale) -> None or a reason: what only the backward refuses (checked after
    # why_not). Where it declines, another backend's backward runs (every backend's lse is the same).
    backward_why_not: Optional[Callable] = None


BACKENDS = {}          # name -> Backend, most preferred first
_pinned = os.environ.get("TK_ATTENTION_BACKEND", "auto")


def register_backend(backend, prefer=False):
    """Add a backend; `prefer=True` puts it before the ones already registered."""
    others = {name: b for name, b in BACKENDS.items() if name != backend.name}
    BACKENDS.clear()
    if prefer:
        BACKENDS[backend.name] = backend
    BACKENDS.update(others)
    if not prefer:
        BACKENDS[backend.name] = backend


def set_backend(name="auto"):
    """Pin a backend by name ('portable', 'hopper', ...) or go back to 'auto'. Returns the old one."""
    global _pinned
    if name != "auto" and name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; registered: {', '.join(BACKENDS)} (or 'auto')")
    old, _pinned = _pinned, name
    return old


def _choose(q, causal, scale, direction):
    """(name, None) of the backend that runs `direction` ('forward' | 'backward'), or (None, reason)."""
    names = list(BACKENDS) if _pinned == "auto" else [_pinned]
    if direction == "backward" and _pinned != "auto":
        # a pinned backend without a backward, or whose backward declines these inputs, borrows
        # the next backend's that takes them (every backend's lse is the same)
        names += [name for name in BACKENDS if name != _pinned]
    reasons = []
    for name in names:
        backend = BACKENDS[name]
        if getattr(backend, direction) is None:
            continue
        reason = backend.why_not(q, causal, scale)
        if reason is None and direction == "backward" and backend.backward_why_not is not None:
            reason = backend.backward_why_not(q, causal, scale)
        if reason is None:
            return name, None
        reasons.append(f"{name}: {reason}")
    return None, "; ".join(reasons) or f"no attention backend implements the {direction} pass"


@torch.compiler.assume_constant_result
def _portable_build_reason():
    # Under torch.compile this runs once at trace time and becomes a constant: the build
    # (file locks, nvcc) is never traced.
    return _portable.why_not()


_capabilities = {}   # device index -> (major, minor)


@torch.compiler.assume_constant_result
def device_capability(index):
    """(major, minor) of CUDA device `index`; a constant under torch.compile. Remembered: every
    attention call asks up to four times (why_not and the op each choose a forward and a backward
    backend), and torch.cuda.get_device_capability queries the device properties each time."""
    if index not in _capabilities:
        _capabilities[index] = torch.cuda.get_device_capability(index)
    return _capabilities[index]


def _portable_why_not(q, causal, scale):
    if not torch.cuda.is_available():
        return "no CUDA device is available"
    major, minor = device_capability(q.device.index or 0)
    if major < 8:
        return f"needs an sm_80 or newer GPU (mma.sync bf16); this one is sm_{major}{minor}"
    return _portable_build_reason()


# The inputs are checked here, in Python; the bindings' own checks (check_forward/backward return
# the problem as a string, see attention_bindings.cpp) stay as a second line and never throw.
def _portable_forward(q, k, v, causal, scale):
    check_forward_inputs(q, k, v, scale)
    problem = _portable.module.check_forward(q, k, v, scale)
    if problem:
        raise ValueError(problem)
    o, lse = _portable.module.forward(q, k, v, causal, scale)
    return o, lse


def _portable_backward(grad_out, q, k, v, o, lse, causal, scale, out=None):
    check_backward_inputs(grad_out, q, k, v, o, lse, scale)
    problem = _portable.module.check_backward(grad_out, q, k, v, o, lse, scale)
    if problem:
        raise ValueError(problem)
    if out is None:
        dq, dk, dv = _portable.module.backward(grad_out, q, k, v, o, lse, causal, scale)
        return dq, dk, dv
    for name, t in zip(("dq", "dk", "dv"), out):
        _check_input(name, t, q, cuda=q.is_cuda)
    problem = _portable.module.check_outputs(*out, q)
    if problem:
        raise ValueError(problem)
    _portable.module.backward_into(grad_out, q, k, v, o, lse, causal, scale, *out)
    return out


register_backend(Backend("portable", _portable_why_not, _portable_forward, _portable_backward))


# ---- 2. the backend calls, used by the custom ops and the eager fast path -------------------

def _run_forward(q, k, v, causal, scale, fwd_backend):
    """(o, lse) from backend `fwd_backend`, after copying inputs the kernels cannot read in place."""
    q, k, v = (_kernel_layout(t) for t in (q, k, v))
    o, lse = BACKENDS[fwd_backend].forward(q, k, v, causal, scale)
    return o, lse


def _run_backward(grad_out, q, k, v, o, lse, causal, scale, backend):
    """(dq, dk, dv) from backend `backend` (P is recomputed from lse, never stored)."""
    grad_out, q, k, v, o = (_kernel_layout(t) for t in (grad_out, q, k, v, o))
    dq, dk, dv = BACKENDS[backend].backward(grad_out, q, k, v, o, lse, causal, scale)
    return dq, dk, dv


def split_qkv(qkv):
    """(B, T, 3, H, D) -> q, k, v as (B, H, T, D) views (no copy)."""
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def _run_forward_qkv(qkv, causal, scale, fwd_backend):
    return _run_forward(*split_qkv(qkv), causal, scale, fwd_backend)


def _run_backward_qkv(grad_out, qkv, o, lse, causal, scale, backend):
    """d(qkv) as one (B, T, 3, H, D) tensor: the kernel writes dq, dk, dv straight into its three
    slices, so the gradient reaches c_attn without the stack + copy that three separate
    gradients of qkv.unbind() would cost (two full passes over 3·B·T·C elements per layer)."""
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    grad_out, o = _kernel_layout(grad_out), _kernel_layout(o)
    q, k, v = (_kernel_layout(t) for t in split_qkv(qkv))
    BACKENDS[backend].backward(grad_out, q, k, v, o, lse, causal, scale, out=split_qkv(dqkv))
    return dqkv


# ---- 3. the custom ops: what torch.compile sees -----------------------------------------------

def _empty_bthd(q):
    """(B, H, T, D) laid out as (B, T, H, D), exactly as the bindings allocate o, dq, dk, dv."""
    B, H, T, D = q.shape
    return q.new_empty(B, T, H, D).transpose(1, 2)


@torch.library.custom_op("tk::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, fwd_backend: str,
                  bwd_backend: str) -> tuple[Tensor, Tensor]:
    """softmax(scale q k^T [causal mask]) v. Returns (o, lse); bwd_backend is kept for the backward."""
    o, lse = _run_forward(q, k, v, causal, scale, fwd_backend)
    return o, lse


@attention_fwd.register_fake
def _(q, k, v, causal, scale, fwd_backend, bwd_backend):
    B, H, T, _ = q.shape
    return _empty_bthd(q), q.new_empty(B, H, T, dtype=torch.float32)


@torch.library.custom_op("tk::attention_bwd", mutates_args=())
def attention_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool,
                  scale: float, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) from the forward's o and lse (P is recomputed, never stored)."""
    dq, dk, dv = _run_backward(grad_out, q, k, v, o, lse, causal, scale, backend)
    return dq, dk, dv


@attention_bwd.register_fake
def _(grad_out, q, k, v, o, lse, causal, scale, backend):
    return _empty_bthd(q), _empty_bthd(q), _empty_bthd(q)


@torch.library.custom_op("tk::attention_qkv_fwd", mutates_args=())
def attention_qkv_fwd(qkv: Tensor, causal: bool, scale: float, fwd_backend: str,
                      bwd_backend: str) -> tuple[Tensor, Tensor]:
    """attention_fwd on the packed (B, T, 3, H, D) c_attn output. Returns (o, lse)."""
    o, lse = _run_forward_qkv(qkv, causal, scale, fwd_backend)
    return o, lse


@attention_qkv_fwd.register_fake
def _(qkv, causal, scale, fwd_backend, bwd_backend):
    B, T, _, H, D = qkv.shape
    return qkv.new_empty(B, T, H, D).transpose(1, 2), qkv.new_empty(B, H, T, dtype=torch.float32)


@torch.library.custom_op("tk::attention_qkv_bwd", mutates_args=())
def attention_qkv_bwd(grad_out: Tensor, qkv: Tensor, o: Tensor, lse: Tensor, causal: bool, scale: float,
                      backend: str) -> Tensor:
    """d(qkv), one (B, T, 3, H, D) tensor."""
    return _run_backward_qkv(grad_out, qkv, o, lse, causal, scale, backend)


@attention_qkv_bwd.register_fake
def _(grad_out, qkv, o, lse, causal, scale, backend):
    return qkv.new_empty(qkv.shape)


# ---- 4. autograd: one setup_context and backward body for both paths --------------------------
# On the custom op the backward calls the custom op attention_bwd; on the eager fast path
# (_AttentionEager, as in kernels/layernorm.py) it calls _run_backward directly.

def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, _, bwd_backend = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.bwd_backend = causal, scale, bwd_backend


def _make_backward(attention_backward):
    def backward(ctx, grad_out, _grad_lse):
        # lse is an internal by-product: its gradient is ignored (zeros on the custom op, None on
        # the fast path). o is the only differentiable output, so grad_out is never None.
        q, k, v, o, lse = ctx.saved_tensors
        if ctx.bwd_backend == "":
            raise RuntimeError("tk attention: no backend can run the backward pass for these inputs "
                               "(see kernels.attention.why_not); use --kernels_attention=torch")
        dq, dk, dv = attention_backward(grad_out, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.bwd_backend)
        return dq, dk, dv, None, None, None, None
    return backward


attention_fwd.register_autograd(_make_backward(attention_bwd), setup_context=_setup_context)


# The packed op saves qkv itself (the same memory as the q, k, v views) and returns one gradient.
def _setup_context_qkv(ctx, inputs, output):
    qkv, causal, scale, _, bwd_backend = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(qkv, o, lse)
    ctx.causal, ctx.scale, ctx.bwd_backend = causal, scale, bwd_backend


def _make_backward_qkv(attention_backward):
    def backward(ctx, grad_out, _grad_lse):
        qkv, o, lse = ctx.saved_tensors
        if ctx.bwd_backend == "":
            raise RuntimeError("tk attention: no backend can run the backward pass for these inputs "
                               "(see kernels.attention.why_not); use --kernels_attention=torch")
        return attention_backward(grad_out, qkv, o, lse, ctx.causal, ctx.scale, ctx.bwd_backend), None, None, None, None
    return backward


attention_qkv_fwd.register_autograd(_make_backward_qkv(attention_qkv_bwd), setup_context=_setup_context_qkv)


class _AttentionEager(torch.autograd.Function):
    """attention_fwd without torch.library: the same backend calls, saved tensors and backward.
    Old style and no materialized zero gradient for lse, as kernels/layernorm.py explains."""
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, fwd_backend, bwd_backend):
        ctx.set_materialize_grads(False)
        output = _run_forward(q, k, v, causal, scale, fwd_backend)   # (o, lse)
        _setup_context(ctx, (q, k, v, causal, scale, fwd_backend, bwd_backend), output)
        return output

    backward = staticmethod(_make_backward(_run_backward))


class _AttentionQKVEager(torch.autograd.Function):
    """attention_qkv_fwd without torch.library (as _AttentionEager)."""
    @staticmethod
    def forward(ctx, qkv, causal, scale, fwd_backend, bwd_backend):
        ctx.set_materialize_grads(False)
        output = _run_forward_qkv(qkv, causal, scale, fwd_backend)   # (o, lse)
        _setup_context_qkv(ctx, (qkv, causal, scale, fwd_backend, bwd_backend), output)
        return output

    backward = staticmethod(_make_backward_qkv(_run_backward_qkv))


# ---- 5. the public op, with the same signature as reference.attention --------------------------

def _kernel_layout(t):
    """t itself if the kernels can read it in place (last dim contiguous, 16-byte aligned rows),
    else a contiguous copy. Views of the c_attn output (B, T, 3, H, D) need no copy. Called by
    _run_forward/_run_backward, on real tensors (torch.compile never traces it)."""
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1])
    return t if ok else t.contiguous()


def _plan_call(q, causal, dropout_p, scale):
    """(scale, forward backend, backward backend or '') for a call on q's shape, or a clear error."""
    if dropout_p:
        raise ValueError(f"tk attention has no dropout on the attention probabilities (dropout_p={dropout_p}); "
                         "set attn_dropout=0 or use --kernels_attention=torch")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    fwd_backend, reason = _choose(q, causal, scale, "forward")
    if fwd_backend is None:
        raise RuntimeError(f"tk attention cannot run here: {reason}")
    bwd_backend, _ = _choose(q, causal, scale, "backward")
    return scale, fwd_backend, bwd_backend or ""


def attention(q, k, v, causal=True, dropout_p=0.0, scale=None):
    """Scaled dot-product attention on (B, H, T, D) bf16 tensors, causal by default."""
    scale, fwd_backend, bwd_backend = _plan_call(q, causal, dropout_p, scale)
    # Outside torch.compile: the eager fast path, not the custom op (the torch.library dispatch
    # costs hundreds of µs of CPU per fwd+bwd; kernels/layernorm.py, section 4).
    op = attention_fwd if torch.compiler.is_compiling() else _AttentionEager.apply
    o, _ = op(q, k, v, bool(causal), scale, fwd_backend, bwd_backend)
    return o


def attention_qkv(qkv, causal=True, dropout_p=0.0, scale=None):
    """Attention on the packed c_attn output qkv (B, T, 3, H, D) bf16; returns y (B, T, H, D),
    contiguous (so y.reshape(B, T, C) is free). Same kernels as attention(); the difference is
    the backward, which returns d(qkv) as one tensor (see _run_backward_qkv)."""
    q = qkv.select(2, 0).transpose(1, 2)   # a (B, H, T, D) view, for the backend choice
    scale, fwd_backend, bwd_backend = _plan_call(q, causal, dropout_p, scale)
    op = attention_qkv_fwd if torch.compiler.is_compiling() else _AttentionQKVEager.apply
    o, _ = op(qkv, bool(causal), scale, fwd_backend, bwd_backend)
    return o.transpose(1, 2)


# ---- 6. the support check and registration ----------------------------------------------------

def why_not(q, k, v, causal=True, dropout_p=0.0, scale=None):
    """None if a tk attention kernel can run on these inputs, else the reason it cannot."""
    if dropout_p:
        return f"dropout on the attention probabilities (dropout_p={dropout_p}) is not supported by the tk kernel"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            return f"{name} is not a tensor"
        if not checks.on_kernel_device(t):
            return f"{name} is on {t.device.type}; the tk kernel needs CUDA tensors"
        if t.dtype != torch.bfloat16:
            return f"{name} is {t.dtype}; the tk kernel takes bfloat16 (train with dtype=bfloat16)"
        if t.dim() != 4:
            return f"{name} has {t.dim()} dimensions; the tk kernel takes (batch, heads, seq, head_dim)"
    if not (q.shape == k.shape == v.shape):
        return f"q, k, v shapes differ ({tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}); the tk kernel needs equal shapes"
    if not (q.device == k.device == v.device):
        return "q, k, v are on different devices"
    B, H, T, D = q.shape
    if D not in HEAD_DIMS:
        return f"head_dim {D} is not supported (the tk kernel takes {' or '.join(map(str, HEAD_DIMS))})"
    if B * H * T == 0:
        return "the inputs are empty"
    if T > MAX_SEQ:
        return f"sequence length {T} is longer than the kernel's grid allows ({MAX_SEQ})"
    if B * H > INT32_MAX:
        return f"batch * heads = {B * H} is more than the kernel's grid allows (2^31 - 1)"
    if scale is not None and not _float32_positive(scale):
        return f"scale={scale} is not a finite positive number (as the float32 the kernels take)"
    s = 1.0 / math.sqrt(D) if scale is None else float(scale)
    for direction in ("forward", "backward") if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)) else ("forward",):
        name, reason = _choose(q, causal, s, direction)
        if name is None:
            return f"no backend for the {direction} pass ({reason})"
    return None


def why_not_qkv(qkv, causal=True, dropout_p=0.0, scale=None):
    """why_not for attention_qkv: qkv must be (B, T, 3, H, D); then as for its q, k, v views."""
    if not isinstance(qkv, Tensor):
        return "qkv is not a tensor"
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        return f"qkv has shape {tuple(qkv.shape)}; the packed op takes (batch, seq, 3, heads, head_dim)"
    return why_not(*split_qkv(qkv), causal=causal, dropout_p=dropout_p, scale=scale)


def _float32_positive(scale):
    # as require_number(..., positive=True, float32=True), in plain comparisons (torch.compile traces why_not)
    return isinstance(scale, (int, float)) and FLOAT32_UNDERFLOW < scale < FLOAT32_OVERFLOW


def preflight(batch_size, block_size, n_embd, n_head, dtype, device, attn_dropout=0.0, **_):
    """Start-up check for the configured model; builds the extension now, not mid-step."""
    if not str(device).startswith("cuda"):
        return f"device={device}; the tk kernel needs CUDA"
    if attn_dropout and attn_dropout > 0:
        return f"attn_dropout={attn_dropout}: the tk kernel has no dropout on attention probabilities"
    if dtype != torch.bfloat16:
        return f"dtype={dtype}; the tk kernel takes bfloat16 activations"
    if n_embd % n_head or n_embd // n_head not in HEAD_DIMS:
        return f"head size n_embd/n_head = {n_embd}/{n_head} is not {' or '.join(map(str, HEAD_DIMS))}"
    q = torch.empty(1, 1, 1, n_embd // n_head, device=device, dtype=torch.bfloat16)
    for direction in ("forward", "backward"):
        name, reason = _choose(q, True, 1.0, direction)
        if name is None:
            return f"no backend for the {direction} pass ({reason})"
    return None


register_tk("attention", attention, why_not)
register_tk("attention", attention_qkv, why_not_qkv, entry="attention_qkv")
_preflight_checks["attention"] = preflight


# ---- 7. the Hopper kernels (kernels/attention_hopper.py) ---------------------------------------
# Importing it registers Backend("hopper", forward and backward) first in BACKENDS; it declines
# anywhere but sm_90, and where only its backward declines (backward_why_not) the portable
# backward runs on its lse. If it cannot be imported, the portable kernel still runs everything,
# and this says why once.
try:
    from . import attention_hopper  # noqa: E402,F401
except Exception as _e:   # report, keep the portable backend working
    print(f"kernels: attention_hopper failed to import, attention uses the portable kernel only "
          f"({type(_e).__name__}: {_e})", file=sys.stderr)

"""The Hopper (sm_90a) attention forward: its extension handle, support check and Python call.

The kernel is kernels/attention_hopper.cu (TMA + mbarrier ring, producer/consumer warpgroups,
wgmma); its input checks are check_inputs below (kernels/checks.py says why in Python), repeated
in kernels/attention_hopper_bindings.cpp and attention_hopper_why_not (attention_hopper.cu).
The backward is kernels/attention_hopper_bwd.cu (its own extension, `backward` below); it reads
the forward's LSE (natural log, (B, H, T) fp32, the same convention as the portable kernel, so
either backward follows either forward). kernels/attention_op.py calls both through its backend
table. See kernels/NOTES.md, attention / Hopper forward and Session 3 (Hopper backward).

Nothing here builds at import; `why_not` builds the extension only after every cheap check
passed on CUDA tensors of a Hopper GPU.

Streams: the persistent forwards (variants 11-13, 21, 26, 30, 33, 37, "dynamic scheduling") hand
out their work items through a counter that must be zero at the start and used by no other launch in
flight. 11-13, 21 and 26 get one zeroed for each call (a fill kernel before the forward, ~1.2 us on
the H200). 30, 33 and 37 (the default) set their counter back to 0 themselves when they hand out
the last item, so the bindings keep one per CUDA stream (launches on a stream run one after the other) and
give each launch captured into a CUDA graph one of its own (attention_hopper_bindings.cpp,
owned_counter). Until session 5 there was one self-resetting counter per GPU, which two forwards in
flight on two streams shared: they took each other's items (tests/test_attention_hopper.py::
test_two_streams_at_once checks that this cannot happen). The backward has no counter.
"""
import math
import os

import torch

from .build import LazyExtension
from .checks import FLOAT32_OVERFLOW, FLOAT32_UNDERFLOW, fail, require_number, require_tensor, shape_str

_ext = LazyExtension("tk_attention_hopper", ["attention_hopper.cu", "attention_hopper_bindings.cpp"],
                     hopper=True)

HEAD_DIMS = (64, 128)


def _strides_ok(t):
    # TMA reads q, k, v: last dim contiguous, other strides multiples of 16 bytes (8 bf16),
    # pointer 16-byte aligned. A view of c_attn's (B, T, 3, H, D) output passes as it is.
    return (t.stride(3) == 1 and t.data_ptr() % 16 == 0
            and all(t.size(i) == 1 or (t.stride(i) > 0 and t.stride(i) % 8 == 0) for i in range(3)))


def why_not(q, k, v, causal=True, dropout_p=0.0, scale=None):
    """None if the Hopper forward kernel takes these inputs, else a short reason."""
    if dropout_p:
        return "dropout on the attention probabilities is not supported by the tk kernels (set attn_dropout=0)"
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        return "q, k, v must be CUDA tensors"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the Hopper kernel needs an sm_90 GPU"
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        return f"q, k, v must share one (B, H, T, D) shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    if not (q.dtype == k.dtype == v.dtype == torch.bfloat16):
        return f"q, k, v must be bfloat16; got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head_dim {q.shape[-1]} is not supported (64 or 128)"
    if q.shape[2] < 1 or q.shape[0] * q.shape[1] < 1:
        return "empty input"
    if q.shape[0] * q.shape[1] * -(-q.shape[2] // 64) > 2**31 - 1 or q.shape[2] > 65535 * 64:
        return f"q is too large: {tuple(q.shape)}"
    if scale is not None and not (FLOAT32_UNDERFLOW < scale < FLOAT32_OVERFLOW):
        return f"scale must be a positive finite number (as the float32 the kernel takes); got {scale}"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not _strides_ok(t):
            return (f"{name} has strides {t.stride()} (need a contiguous last dimension and other strides "
                    f"that are multiples of 8 elements); call .contiguous() on it")
    return _ext.why_not()


# The kernel variants (kernels/attention_hopper.cu, attention_hopper_forward_variant); 0 is the
# default, the fastest measured. Tests run all of them, bench.py times all of them. The missing
# numbers lost on the H200 and were removed (the .cu's opening comment: what they measured and
# the commit that still has them); kernels/NOTES.md's figures use these numbers.
VARIANTS = {0: "default (37 for D=64 and D=128)",
            2: "2 consumers, ping-pong, one CTA per query block",
            4: "1 consumer, 2 CTAs/SM (D=64; D=128 runs 2)",
            5: "session 3's default (4 for D=64, 2 for D=128) with L2 groups of heads",
            8: "persistent: CTAs over many query blocks, 1 consumer, 2 CTAs/SM, L2 groups (D=64; D=128 runs 11)",
            11: "persistent, 2 consumers, ping-pong, L2 groups, consumer 0's diagonal tile as a half tile, "
                "lazy rescaling (the running max moves only when it grows by more than 2^8), dynamic "
                "scheduling (a counter hands out the query blocks)",
            12: "11 without lazy rescaling",
            13: "1 consumer, 2 CTAs/SM, half tile, lazy rescaling, dynamic scheduling (D=64; D=128 runs 11)",
            21: "12 (D=64) / 11 (D=128) with O stored through shared memory by TMA, items decoded by the "
                "producer, approximate 1/l and log2(l)",
            26: "21 launched as a programmatic dependent (PDL): its start overlaps the end of the kernel "
                "before it (griddepcontrol.wait before any global memory access)",
            30: "21 whose work counter sets itself back to 0, so a call needs no zeroing kernel (the bindings "
                "give it a counter owned by the stream, or by the CUDA graph that captured the call)",
            33: "30 with a leaner softmax: the mask decision once per item, consumer 1's diagonal tile masks "
                "only its second half, the rescale factor by ex2.approx",
            37: "30 with 33's softmax, P in two register buffers that alternate by tile (converted to bf16 "
                "between the exponentials), and the exponentials taken against the running max before the "
                "tile's own max is known: the max moves (and O is rescaled) only when a row's scores grew "
                "by more than 2^8; the row sums as four running sums (D=128 fits it too)"}


OP = "tk Hopper attention"


def check_inputs(q, k, v, scale, variant=0, cuda=True):
    """Raise TypeError/ValueError naming the argument unless forward() takes these: the checks of
    attention_hopper_bindings.cpp and attention_hopper_why_not, in Python."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(OP, name, t, dtypes=(torch.bfloat16,), cuda=cuda, same_device_as=("q", q),
                       hint="; cast it or use --kernels_attention=torch")
        if t.dim() != 4:
            fail(OP, f"{name} must have shape (batch, heads, seq, head_dim); got {shape_str(t.shape)}")
        if t.shape != q.shape:
            fail(OP, f"{name} has shape {shape_str(t.shape)} but q has {shape_str(q.shape)}")
        if t.stride(3) != 1:
            fail(OP, f"{name} must be contiguous in its last (head_dim) dimension (strides {tuple(t.stride())}); "
                     f"call .contiguous() on it or take it from a (B, T, 3, H, D) qkv tensor")
    B, H, T, D = q.shape
    if D not in HEAD_DIMS:
        fail(OP, f"head_dim is {D}; the kernel takes 64 or 128")
    if B < 1 or H < 1 or T < 1:
        fail(OP, f"q is empty: {shape_str(q.shape)}")
    if B * H * -(-T // 64) > 2**31 - 1 or T > 65535 * 64:
        fail(OP, f"q is too large: {shape_str(q.shape)} (batch*heads*ceil(seq/64) < 2^31, seq <= {65535 * 64})")
    require_number(OP, "scale", scale, positive=True, float32=True)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not _strides_ok(t):
            fail(OP, f"{name} has strides {tuple(t.stride())} at offset {t.data_ptr() % 16} bytes from a 16-byte "
                     f"boundary: TMA needs a 16-byte aligned start and batch/head/seq strides that are positive "
                     f"multiples of 8 elements; call .contiguous() on it")
    if variant not in VARIANTS:
        fail(OP, f"variant must be one of {sorted(VARIANTS)} (0 is the default); got {variant}")


def forward(q, k, v, causal=True, scale=None, variant=0):
    """(o, lse): o (B, H, T, D) bf16 (a view of (B, T, H, D) memory), lse (B, H, T) fp32.

    No two launches in flight share a work counter, so calls may run on several streams at once (module docstring)."""
    if scale is None and isinstance(q, torch.Tensor) and q.dim() > 0 and q.shape[-1] > 0:
        scale = 1.0 / math.sqrt(q.shape[-1])   # (otherwise check_inputs names what is wrong with q)
    check_inputs(q, k, v, scale, variant)
    o, lse = _ext.module.forward(q, k, v, bool(causal), float(scale), int(variant))
    return o, lse


# ---- the backward (kernels/attention_hopper_bwd.cu, its own extension) --------------------------
# A separate extension: the backward builds (and could fail) without touching the forward's.
_bwd_ext = LazyExtension("tk_attention_hopper_bwd", ["attention_hopper_bwd.cu", "attention_hopper_bwd_bindings.cpp"],
                         hopper=True)

# Head dims the Hopper backward takes; others go to the portable backward (same lse convention).
BACKWARD_HEAD_DIMS = (64, 128)


# The backward's variants (attention_hopper_backward_variant in the .cu); 0 is the default.
BACKWARD_VARIANTS = {0: "default (19 for D=64, 5 for D=128; see attention_hopper_bwd.cu)", 1: "five products in turn, 2 slots",
                     2: "3 slots, two dQ buffers, masked first block skipped (D=64; D=128 runs 1)",
                     3: "dQ split by columns over both consumers (D=128; D=64 runs its default)",
                     4: "session 3's default kernel (2 for D=64, 1 for D=128) with the CTAs in L2 groups of heads",
                     5: "3 with L2 groups of heads (D=128; D=64 runs 4)",
                     8: "4 with the dQ partials added by vector atomics (D=64; D=128 runs 5)",
                     11: "4 with prep_kernel: dq_accum zeroed and Di in one pass (D=128: 5 with it)",
                     12: "8 with prep_kernel (faster, but the dS tile's reuse races: see attention_hopper_bwd.cu; D=128 runs 5 with prep_kernel)",
                     15: "12 with a bar.sync after the dQ atomics, closing 12's race (D=64's default in session 8; D=128 runs 5 with prep_kernel)",
                     16: "15 on a persistent grid: one CTA per SM takes items from a counter, the next item's K/V loaded "
                         "under the current one (D=64's default in session 9; D=128 runs 5 with prep_kernel)",
                     19: "16 with P's mask compares only in the diagonal and tail blocks (D=64's default since session 10; "
                         "D=128 runs 5 with prep_kernel)"}


def backward(grad_out, q, k, v, o, lse, causal=True, scale=None, out=None, variant=0):
    """(dq, dk, dv) of causal (or full) attention from the forward's o and lse (natural log).

    out=(dq, dk, dv): bf16 (B, H, T, D) views to write (e.g. the three slices of one packed
    (B, T, 3, H, D) gradient); they are returned. Without it, each is allocated (B, T, H, D)."""
    if variant not in BACKWARD_VARIANTS:
        fail(OP, f"variant must be one of {sorted(BACKWARD_VARIANTS)} (0 is the default); got {variant}")
    from .attention_op import _check_input, _empty_bthd, check_backward_inputs
    if scale is None and isinstance(q, torch.Tensor) and q.dim() > 0 and q.shape[-1] > 0:
        scale = 1.0 / math.sqrt(q.shape[-1])
    check_backward_inputs(grad_out, q, k, v, o, lse, scale)
    if out is None:
        out = (_empty_bthd(q), _empty_bthd(q), _empty_bthd(q))
    else:
        out = tuple(out)
        if len(out) != 3:
            fail(OP, f"out must be (dq, dk, dv); got {len(out)} tensors")
        for name, t in zip(("dq", "dk", "dv"), out):
            _check_input(name, t, q, cuda=True)
    problem = _bwd_ext.module.check_backward(grad_out, q, k, v, o, lse, float(scale), *out)
    if problem:
        raise ValueError(problem)
    _bwd_ext.module.backward_into(grad_out, q, k, v, o, lse, bool(causal), float(scale), *out, int(variant))
    return out


# ---- the hook into kernels/attention_op.py's backend table ------------------------------------
# attention_op's Backend wants why_not(q, causal, scale) (called after its common checks: CUDA,
# bf16, equal (B, H, T, D) shapes, head_dim 64/128, and _kernel_layout's strides),
# forward(q, k, v, causal, scale) -> (o, lse), and backward(grad_out, q, k, v, o, lse, causal,
# scale, out=None) -> (dq, dk, dv), with backward_why_not for what only the backward refuses.
# Where backward_why_not declines, attention_op borrows the portable backward (same lse).

@torch.compiler.assume_constant_result
def _build_reason():
    # Constant under torch.compile: the build (file locks, nvcc) is never traced.
    return _ext.why_not()


@torch.compiler.assume_constant_result
def _bwd_build_reason():
    return _bwd_ext.why_not()


def backend_why_not(q, causal, scale):
    from .attention_op import device_capability
    if not torch.cuda.is_available():
        return "no CUDA device is available"
    major, minor = device_capability(q.device.index or 0)
    if (major, minor) != (9, 0):
        return f"needs an sm_90 (Hopper) GPU; this one is sm_{major}{minor}"
    return _build_reason()


def backend_backward_why_not(q, causal, scale):
    """None if the Hopper backward takes q's shape here (checked after backend_why_not)."""
    if q.shape[-1] not in BACKWARD_HEAD_DIMS:
        return f"the Hopper backward takes head_dim {' or '.join(map(str, BACKWARD_HEAD_DIMS))}, not {q.shape[-1]}"
    if q.shape[2] > 65535 * 128:
        return f"sequence length {q.shape[2]} is longer than the Hopper backward's grid allows"
    return _bwd_build_reason()


# The forward variant the op runs: 0 = the kernel's default per head dim.
# TK_ATTENTION_HOPPER_FWD_VARIANT=6 (read once, at import) runs another one everywhere;
# set_forward_variant changes it in-process (bench.py's tk-hopper-vN rows time each variant).
OP_FORWARD_VARIANT = int(os.environ.get("TK_ATTENTION_HOPPER_FWD_VARIANT", "0") or 0)


def set_forward_variant(variant):
    """Make the op's Hopper forward run `variant` (a key of VARIANTS); returns the previous one."""
    global OP_FORWARD_VARIANT
    if variant not in VARIANTS:
        fail(OP, f"variant must be one of {sorted(VARIANTS)} (0 is the default); got {variant}")
    old, OP_FORWARD_VARIANT = OP_FORWARD_VARIANT, variant
    return old


def backend_forward(q, k, v, causal, scale):
    return forward(q, k, v, causal, scale, variant=OP_FORWARD_VARIANT)


# The variant the op runs: 0 = the kernel's default per head dim. TK_ATTENTION_HOPPER_BWD_VARIANT=3
# (read once, at import) runs another one everywhere, e.g. to time it in bench.py before it
# becomes a default.
OP_BACKWARD_VARIANT = int(os.environ.get("TK_ATTENTION_HOPPER_BWD_VARIANT", "0") or 0)


def backend_backward(grad_out, q, k, v, o, lse, causal, scale, out=None):
    return backward(grad_out, q, k, v, o, lse, causal, scale, out=out, variant=OP_BACKWARD_VARIANT)


def register(prefer=True):
    """Put the Hopper kernels into attention_op's backend table (first choice on sm_90)."""
    from .attention_op import Backend, register_backend
    register_backend(Backend("hopper", backend_why_not, backend_forward, backend_backward,
                             backward_why_not=backend_backward_why_not), prefer=prefer)


# Importing this module registers the backend (kernels/attention_op.py imports it; see
# kernels/NOTES.md). Elsewhere than sm_90 backend_why_not declines, and the portable kernel runs
# as before.
register()

"""tk MLP, the Python half: custom ops, autograd, the support check, registration.

(Named mlp_op.py, not mlp.py: a submodule kernels.mlp would replace the function kernels.mlp()
that model.py calls, because importing a submodule sets it as an attribute of its package; the
same reason as attention_op.py.)

Read after kernels/__init__.py (the switch) and kernels/layernorm.py (the op-module pattern this
file follows). The GEMMs and their fused epilogues are kernels/mlp.cu (its opening comment has
the roofline and what each epilogue does); input checks are check_forward/check_backward below
(kernels/checks.py says why in Python), repeated in kernels/mlp_bindings.cpp.

    y = GELU_tanh(x·w_fcᵀ + b_fc)·w_projᵀ + b_proj

The ops:
  tk::mlp_fwd(x, w_fc, b_fc, w_proj, b_proj) -> (y, pre, h)     two GEMMs
      pre = x·w_fcᵀ + b_fc and h = GELU(pre) come out of ONE GEMM's epilogue; both are kept for
      the backward (pre for GELU', h for dw_proj), what eager PyTorch keeps. Under the default
      (fcfast=11 since session 10; fcfast=5 in sessions 8-9, the same values) the second output holds
      gelu'(pre) (bf16) in pre's place, what the backward needs of it (fcfast=4 writes pre itself).
  tk::mlp_bwd(dy, x, pre, h, w_fc, w_proj, bias_grads=True, saved=-1) -> (dx, dw_fc, db_fc, dw_proj, db_proj)   four GEMMs (the two dW on cuBLAS by default)
      dpre = (dy·w_proj) ⊙ GELU'(pre) in one GEMM's epilogue (which also sums db_fc per 16
      rows); dx = dpre·w_fc; dw_proj = dyᵀ·h and dw_fc = dpreᵀ·x on cuBLAS (the default since
      session 13: DW_GEMM_ENV below) or the tk GEMM with split-K (TK_MLP_DW_GEMM=tk). With fcfast=5
      (session 7), 9 (its c_fc on a lean k-step), 10 or 11 (9 with the dGELU GEMM on the lean k-step
      too; 11, the default since session 10, also packs its product) the forward saves gelu'(pre) in pre's place and
      the dGELU epilogue is one product: `saved` says which the forward wrote (1 gelu'(pre),
      0 pre, -1 as the fcfast flag says now); autograd passes what its forward ran (section 3).
Both have `register_fake` (shapes only) and mlp_fwd has `register_autograd`, so torch.compile
traces through them and DDP sees ordinary autograd. Outside torch.compile the public op calls
_MLPEager instead, a plain autograd.Function around the same extension calls (less CPU per call),
or, when no gradient is needed (torch.no_grad, or no input requires grad), the extension's
forward_inference: the same y without writing pre (section 4; TK_MLP_INFERENCE=0 turns it off).

The kernels compute in bfloat16 (fp32 accumulation). Under torch.autocast(dtype=bfloat16) the
fp32 activations and parameters are cast on the way in, as autocast does for F.linear, and the
casts' own backward returns fp32 gradients to fp32 parameters. Nothing builds at import.
"""
import os
import sys
from typing import Optional

import torch
from torch import Tensor

from . import _preflight_checks, checks, register_tk
from .build import LazyExtension
from .checks import fail, realign16, require_tensor, shape_str

_ext = LazyExtension("tk_mlp", ["mlp.cu", "mlp_pingpong.cu", "mlp_pingpong_gelu_grad.cu", "mlp_pingpong_gelu_fast.cu",
                               "mlp_inference.cu", "mlp_finish.cu", "mlp_dgelu_deferred.cu", "mlp_fc_deferred.cu",
                               "mlp_bindings.cpp"],
                     hopper=True)

MULTIPLE = 64          # the embedding and hidden sizes must be multiples of this
OP = "tk_mlp"
BF16 = (torch.bfloat16,)
_CAST = " (run under torch.autocast('cuda', dtype=torch.bfloat16) or cast it)"


# ---- 0. input checks: those of mlp_bindings.cpp, in Python (see kernels/checks.py) -----------

def _check_matrix(name, t, rows, cols, x, cuda):
    """A bf16 2-D matrix of shape (rows, cols) (None: any size) on x's device, contiguous and
    16-byte aligned (TMA reads it). x=None: t is x itself."""
    like = None if x is None else ("x", x)
    require_tensor(OP, name, t, dtypes=BF16, cuda=cuda, same_device_as=like, hint=_CAST)
    if t.dim() != 2:
        fail(OP, f"{name} must be a 2-D matrix, got shape {shape_str(t.shape)}; flatten the batch and "
                 f"time dimensions first")
    require_tensor(OP, name, t, shape=(rows, cols), contiguous=True, aligned=True, cuda=False)


def _check_bias(name, b, n, x, cuda):
    if b is not None:
        require_tensor(OP, name, b, dtypes=BF16, shape=(n,), contiguous=True, cuda=cuda,
                       same_device_as=("x", x), hint=_CAST)


def _check_sizes(x, w_fc, w_proj, cuda):
    """x (M, C), w_fc (H, C), w_proj (C, H); returns (M, C, H)."""
    _check_matrix("x", x, None, None, None, cuda)
    M, C = x.shape
    _check_matrix("w_fc", w_fc, None, C, x, cuda)
    H = w_fc.shape[0]
    if not 1 <= M < 2**31:
        fail(OP, f"x must have between 1 and 2^31-1 rows (tokens), got {M}")
    if C % MULTIPLE or C < MULTIPLE:
        fail(OP, f"the embedding size (x's last dimension) must be a positive multiple of {MULTIPLE}, got {C}")
    if H % MULTIPLE or H < MULTIPLE:
        fail(OP, f"the hidden size (w_fc's first dimension) must be a positive multiple of {MULTIPLE}, got {H}")
    _check_matrix("w_proj", w_proj, C, H, x, cuda)
    return M, C, H


def check_forward(x, w_fc, b_fc, w_proj, b_proj, cuda=True):
    """Raise TypeError/ValueError naming the argument unless forward() takes these inputs."""
    _, C, H = _check_sizes(x, w_fc, w_proj, cuda)
    _check_bias("b_fc", b_fc, H, x, cuda)
    _check_bias("b_proj", b_proj, C, x, cuda)


def check_backward(dy, x, pre, h, w_fc, w_proj, cuda=True):
    """Raise TypeError/ValueError naming the argument unless backward() takes these inputs."""
    M, C, H = _check_sizes(x, w_fc, w_proj, cuda)
    _check_matrix("dy", dy, M, C, x, cuda)
    _check_matrix("pre", pre, M, H, x, cuda)
    _check_matrix("h", h, M, H, x, cuda)


# ---- 0b. which kernel schedule each GEMM runs (kernels/mlp.h: 0 auto, 4 step 4, 5-8 and 10 ping-pong, 9 step 4 clusters)

PRODUCTS = ("fc", "proj", "dgelu", "dx", "dw")   # c_fc fwd, c_proj fwd, dGELU, dx, weight gradients
SCHEDULES = {0: "auto by shape", 4: "step 4 (cooperative 128x256)", 5: "step 5 ping-pong 128x128",
             6: "step 5 ping-pong 64x256", 7: "step 5 ping-pong 128x128 in 2-CTA clusters (B multicast)",
             8: "step 5 ping-pong 64x256 in 2-CTA clusters (B multicast)",
             9: "step 4 (cooperative 128x256) in 2-CTA clusters (B multicast)",
             10: "step 5 ping-pong 64x256, 5 stages, one staging box per warp"}
SCHEDULE_ENV = "TK_MLP_SCHEDULE"


# dGELU GEMM: side jobs on (1) or off (0); pre by TMA (1) or per-thread loads (0); fast=1 its cheaper
# epilogue (session 5); finish=1: the backward's bias sums and dW casts in one kernel (session 5);
# fcfast=1: c_fc's cheaper epilogue (session 6: GELU in 5 operations, the bias without per-column checks);
# fcfast=2: the same values staged by stmatrix with one fence per box (gemm4's STORES_SLAB hook);
# fcfast=3 (with fc=4): c_fc deferred on step 4, h from the bf16 pre (gemm4's DEFERS_STORE hook);
# defer=1: c_proj's and dx's stores deferred the same way on step 4 (session 6). (Session 6's fast=2,
# the dGELU epilogue deferred on step 4, lost on the H200 and was removed: kernels/NOTES.md, session 6 M.)
# fast=3 (session 7, opt-in): the dGELU epilogue deferred on step 4's tile with pre by TMA, half a box
# after each of 8 of the next tile's first 10 k-steps (kernels/mlp_dgelu_deferred.cu); elsewhere as
# fast=1 (its one-loop form, fast=4, lost on the H200 and was removed: kernels/NOTES.md, session 7 M).
# fcfast=4 (session 7, the default until session 8): c_fc's fcfast=3 values the same way, half boxes on step 4's
# tile (kernels/mlp_fc_deferred.cu). fcfast=5 (the default in sessions 8-9): as 4,
# but the forward saves gelu'(pre) in pre's place and the backward's dGELU multiplies by it (step 4 only).
# fcfast=6 (session 8): 5 for an MLP without biases (GPT-2's bias=False), 4 with.
# fcfast=9 (session 9; session 10's default after its call 1): 5's values (the same outputs bit for bit), its c_fc
# on a k-step that does not rebuild its addresses and descriptors from scratch (kernels/mlp_deferred.cuh,
# lean_kstep). fcfast=10 (session 10, opt-in): 9, and the backward's dGELU GEMM on the lean k-step too (the
# same values); fcfast=11 (session 10; the default since its call 2): 10, and that GEMM's product one packed bf16x2 multiply per
# pair when no bias gradient is wanted (the same values: kernels/mlp_dgelu_deferred.cu, PACKED). (fcfast=7, 5's epilogue in quarter boxes, and fcfast=8, whole boxes with the consumers
# taking turns, lost on the H200, 0.4-1.0% slower in the MLP, and were removed: kernels/NOTES.md, sessions 9-10 M.)
FLAGS = ("side", "pre", "fast", "finish", "fcfast", "defer")
FLAG_DEFAULTS = (1, 0, 1, 1, 11, 0)     # fast=1 by default since session 5; finish=1 since session 7 (kernels/NOTES.md,
                                       # session 7 M, call 4); fcfast=5 since session 8 (was 4; session 8 M: the
                                       # dGELU GEMM one product per value); fcfast=11 since session 10 (5's values
                                       # on a lean k-step, dGELU's product packed: 1.2-1.3% over 9 and 9 0.5-0.6%
                                       # over 5 on the H200; 'fcfast=5' restores the old default)
REMOVED_FCFAST = {7: "fcfast=7 (quarter boxes) lost on the H200 and was removed",
                  8: "fcfast=8 (whole boxes, the consumers taking turns) lost on the H200 and was removed"}


def parse_schedule(spec):
    """'5' (every GEMM) or 'fc=5,dgelu=5,dx=4' (the rest auto), optionally with 'side=0' (the
    dGELU GEMM's side jobs off: separate fill and dy reduction kernels) and 'pre=1' (session 4,
    opt-in: the dGELU epilogue gets pre by TMA instead of per-thread loads, and its side job
    pipelines dy's column sums), 'fast=0' (session 5's fast=1 is the default: the dGELU epilogue's
    cheaper form; fast=0 restores sessions 3-4's; 'fast=3', session 7, opt-in: its
    epilogue deferred under the next tile's math in half boxes with pre by TMA, on step 4's tile) and
    'finish=1' (session 5, the default since session 7: one kernel for the backward's bias sums and
    dW casts; finish=0 restores the separate reductions and casts) and
    'side=2' (session 8, opt-in: the side jobs with dy's column sums 8 row loads in flight instead of
    one dependent load per row; the same sums bit for bit) and
    'fcfast=1' (session 6, opt-in: c_fc's epilogue with GELU in 5 operations and the bias of a
    box without per-column checks; the evaluation forward follows it) or 'fcfast=2' (the same
    values, staged by stmatrix with one fence per box) or 'fcfast=3' (with fc=4: c_fc's epilogue
    under the next tile's math on step 4, h from the bf16 pre as eager computes it) or 'fcfast=4'
    (session 7: fcfast=3's values in half boxes on step 4's tile) or 'fcfast=5' (session 8's default: as 4, saving gelu'(pre)
    in pre's place for the backward; fc and dgelu on 0 or 4) or 'fcfast=6' (session 8: 5 for an MLP
    without biases, 4 with) or 'fcfast=9' (session 9, opt-in: 5 on a leaner k-step, the same
    values) or 'fcfast=10' (session 10, opt-in: 9 with the dGELU GEMM on the lean k-step too) or
    'fcfast=11' (the default since session 10: 10 with dGELU's product packed, without bias gradients;
    7 and 8 were removed) and 'defer=1' (session 6, opt-in: c_proj's
    and dx's stores under the next tile's math on step 4)
    -> eleven ints: the five schedules in PRODUCTS order, then the flags in FLAGS order
    (defaults FLAG_DEFAULTS). A DEFAULT fcfast of 5 or more (not named in the spec) steps back to 4 where
    it cannot apply or would override what the spec asks for: a c_fc or dGELU schedule other than
    0/4, pre=1, or a dGELU epilogue named by fast=... (fcfast=5 replaces that epilogue)."""
    out = [0] * len(PRODUCTS) + list(FLAG_DEFAULTS)
    names = PRODUCTS + FLAGS
    text = str(spec).strip()
    named = set()
    try:
        for item in filter(None, (t.strip() for t in text.split(","))):
            if "=" not in item:
                out[:len(PRODUCTS)] = [int(item)] * len(PRODUCTS)
                named.update(PRODUCTS)
                continue
            name, value = (u.strip() for u in item.split("="))
            out[names.index(name)] = int(value)
            named.add(name)
    except ValueError:
        raise ValueError(f"{OP}: schedule {spec!r} is not '<n>' or 'name=<n>,...' with names {', '.join(names)}") from None
    bad = [v for v in out[:len(PRODUCTS)] if v not in SCHEDULES]
    if bad:
        raise ValueError(f"{OP}: schedule {spec!r}: each value must be one of {sorted(SCHEDULES)} "
                         f"({'; '.join(f'{k} {v}' for k, v in SCHEDULES.items())}), got {bad[0]}")
    fcfast = len(PRODUCTS) + FLAGS.index("fcfast")
    if out[fcfast] >= 5 and "fcfast" not in named and ("fast" in named or out[PRODUCTS.index("fc")] not in (0, 4) or
                                                      out[PRODUCTS.index("dgelu")] not in (0, 4) or
                                                      out[len(PRODUCTS) + FLAGS.index("pre")] != 0):
        out[fcfast] = 4                       # (only when the default is 5 or more: see the docstring)
    if out[fcfast] >= 5 and (out[PRODUCTS.index("fc")] not in (0, 4) or
                             out[PRODUCTS.index("dgelu")] not in (0, 4) or
                             out[len(PRODUCTS) + FLAGS.index("pre")] != 0):
        raise ValueError(f"{OP}: schedule {spec!r}: fcfast=5, 6, 9, 10 and 11 (gelu'(pre) saved in place of pre) run c_fc and the "
                         f"dGELU GEMM on schedule 4 only (fc and dgelu 0 or 4, pre=0)")
    for name, value in zip(FLAGS, out[len(PRODUCTS):]):
        allowed = (0, 1, 2, 3, 4, 5, 6, 9, 10, 11) if name == "fcfast" else (0, 1, 3) if name == "fast" else (0, 1, 2) if name == "side" else (0, 1)
        if value not in allowed:
            removed = f" ({REMOVED_FCFAST[value]})" if name == "fcfast" and value in REMOVED_FCFAST else ""
            raise ValueError(f"{OP}: schedule {spec!r}: {name} must be {' or '.join(map(str, allowed))}, got {value}{removed}")
    return out


def set_schedule(spec):
    """Pick the kernel schedule of the five GEMMs for later calls in this process (the bench
    times several in one run); spec as parse_schedule. The default is auto by shape."""
    global _env_checked, _fcfast
    _env_checked = True                           # an explicit choice wins over the environment
    values = parse_schedule(spec)
    _ext.module.set_schedule(values)
    _fcfast = values[len(PRODUCTS) + FLAGS.index("fcfast")]


_env_checked = False
_fcfast = FLAG_DEFAULTS[FLAGS.index("fcfast")]   # the extension's fcfast flag, as set_schedule last set it


# Session 13: the backward's two weight gradients, dw_proj = dyᵀ·h and dw_fc = dpreᵀ·x, run on cuBLAS
# by default (torch's mm with an fp32 out_dtype, called from mlp_bindings.cpp), not on the tk split-K
# GEMM: at GPT-2's 32768 tokens the tk product takes ~224 us in the training step against ~213 for
# cuBLAS's (its split-K reduce included), and the step was 0.36 ms faster (kernels/NOTES.md, session 13). TK_MLP_DW_GEMM=tk (or
# set_dw_gemm('tk')) puts them back on tk. The other four products are on tk either way.
DW_GEMM_ENV = "TK_MLP_DW_GEMM"
DW_GEMMS = ("tk", "cublas")


def parse_dw_gemm(name):
    """'tk' or 'cublas' (case and spaces ignored) -> True for cuBLAS; anything else is refused."""
    value = str(name).strip().lower()
    if value not in DW_GEMMS:
        raise ValueError(f"{OP}: {DW_GEMM_ENV}={name!r}: the MLP's weight-gradient GEMM is one of "
                         f"{', '.join(DW_GEMMS)} (cublas, the default: torch's mm; tk: the tk split-K GEMM)")
    return value == "cublas"


def set_dw_gemm(name):
    """Run the backward's weight gradients on 'cublas' (the default) or 'tk' from now on, in this process."""
    global _dw_env_checked
    on = parse_dw_gemm(name)
    _dw_env_checked = True                        # an explicit choice wins over the environment
    _ext.module.set_dw_on_cublas(on)


_dw_env_checked = False


def _module():
    """The extension, after applying TK_MLP_SCHEDULE and TK_MLP_DW_GEMM (if set) once."""
    global _env_checked, _dw_env_checked
    if not _env_checked:
        _env_checked = True
        if os.environ.get(SCHEDULE_ENV):
            set_schedule(os.environ[SCHEDULE_ENV])
    if not _dw_env_checked:
        if os.environ.get(DW_GEMM_ENV):
            set_dw_gemm(os.environ[DW_GEMM_ENV])   # (a bad value raises here, and again at the next call)
        _dw_env_checked = True
    return _ext.module


def _saves_gelu_grad(has_biases):
    """True when the training forward's c_fc writes gelu'(pre) in pre's place: fcfast=5, 9, 10 or 11 (the
    default), or fcfast=6 for an MLP without biases (b_fc and b_proj both None). The binding's
    saves_gelu_grad, mirrored."""
    if not _env_checked and os.environ.get(SCHEDULE_ENV):
        _module()
    return _fcfast == 5 or _fcfast >= 9 or (_fcfast == 6 and not has_biases)


# ---- 1. the extension calls (after the input checks), used by the custom ops and the fast path

def _ext_forward(x, w_fc, b_fc, w_proj, b_proj):
    """x (M, C) bf16. Returns (y, pre, h): y (M, C), pre = x·w_fcᵀ + b_fc (gelu'(pre) under fcfast=11,
    the default, 5, 9 and 10, or fcfast=6 without biases: _saves_gelu_grad) and h = GELU(pre), (M, H)."""
    x, w_fc, w_proj = realign16(x), realign16(w_fc), realign16(w_proj)   # odd-offset views: copy
    check_forward(x, w_fc, b_fc, w_proj, b_proj)
    y, pre, h = _module().forward(x, w_fc, b_fc, w_proj, b_proj)
    return y, pre, h


def _ext_forward_inference(x, w_fc, b_fc, w_proj, b_proj):
    """Evaluation: y alone, bit-identical to _ext_forward's y, without allocating or writing pre."""
    x, w_fc, w_proj = realign16(x), realign16(w_fc), realign16(w_proj)
    check_forward(x, w_fc, b_fc, w_proj, b_proj)
    return _module().forward_inference(x, w_fc, b_fc, w_proj, b_proj)


def _ext_backward(dy, x, pre, h, w_fc, w_proj, bias_grads=True, saved=-1, dw_float=False):
    """Returns (dx, dw_fc, db_fc, dw_proj, db_proj), all bf16. bias_grads=False (a model without
    biases, GPT-2's bias=False): db_fc and db_proj come back empty (0 elements) and the backward
    skips the work that only they need (session 5). saved: what `pre` holds, 1 gelu'(pre) (the
    forward ran fcfast=5, 9, 10 or 11), 0 pre, -1 as the fcfast flag says now (session 8)."""
    dy, x, pre, h, w_fc, w_proj = (realign16(t) for t in (dy, x, pre, h, w_fc, w_proj))
    check_backward(dy, x, pre, h, w_fc, w_proj)
    if saved not in (-1, 0, 1):
        fail(OP, f"saved must be -1 (as the fcfast flag says), 0 (pre) or 1 (gelu'(pre)), got {saved!r}")
    # dw_float (bias_grads=False only): dw_fc and dw_proj come back in fp32 (the fp32-weight path, below)
    dx, dw_fc, db_fc, dw_proj, db_proj = _module().backward(dy, x, pre, h, w_fc, w_proj, bool(bias_grads), int(saved),
                                                            bool(dw_float))
    return dx, dw_fc, db_fc, dw_proj, db_proj


# ---- 2. the custom ops: what torch.compile sees ----------------------------------------------

def _check_saves(saves, has_biases):
    """saves (mlp_fwd's argument): what the caller was told pre would hold when it decided, 1
    gelu'(pre), 0 pre, -1 (nothing promised). Under torch.compile that decision is made once, when
    the graph is traced, and the backward graph reads pre accordingly; the fcfast flag is process
    state that set_schedule can change later. A flag that now disagrees would have the backward read
    gelu'(pre) as pre or the reverse (wrong gradients, silently): refuse it here, before any kernel."""
    if saves not in (-1, 0, 1):
        fail(OP, f"saves must be -1 (as the fcfast flag says), 0 (pre) or 1 (gelu'(pre)), got {saves!r}")
    if saves != -1 and int(_saves_gelu_grad(has_biases)) != saves:
        now = "gelu'(pre)" if _saves_gelu_grad(has_biases) else "pre"
        then = "gelu'(pre)" if saves else "pre"
        fail(OP, f"this call was traced (torch.compile) when c_fc saved {then} for the backward, but the MLP "
                 f"schedule has changed since (fcfast={_fcfast}: it would save {now}), and the traced backward would "
                 f"misread it. Set the schedule (set_schedule / {SCHEDULE_ENV}) before compiling, or call "
                 f"torch._dynamo.reset() after changing it so that the model is traced again", RuntimeError)


@torch.compiler.assume_constant_result
def _saves_when_traced(has_biases: bool) -> int:
    # Called by mlp() under torch.compile: runs once at trace time (not traced into: it may build
    # the extension) and its answer becomes a constant of the graph.
    return 1 if _saves_gelu_grad(has_biases) else 0


def _check_fp32_weights(w_fc, w_proj, w_fc32, w_proj32, has_biases):
    """mlp_fwd's optional fp32 weights: both or neither, fp32, the bf16 weights' shapes, no biases
    (the kernels' fp32 weight gradients come without bias gradients: dw_float)."""
    if (w_fc32 is None) != (w_proj32 is None):
        fail(OP, "pass both fp32 weights (w_fc32 and w_proj32) or neither")
    if w_fc32 is None:
        return
    if has_biases:
        fail(OP, "w_fc32 and w_proj32 (fp32 weight gradients) are for an MLP without biases: pass b_fc=None "
                 "and b_proj=None, or leave the fp32 weights out")
    for name, w32, w in (("w_fc32", w_fc32, w_fc), ("w_proj32", w_proj32, w_proj)):
        if w32.dtype != torch.float32 or w32.shape != w.shape:
            fail(OP, f"{name} must be the fp32 weight that {name[:-2]} was cast from: got {w32.dtype} "
                     f"{tuple(w32.shape)}, {name[:-2]} is {tuple(w.shape)}")


@torch.library.custom_op("tk::mlp_fwd", mutates_args=())
def mlp_fwd(x: Tensor, w_fc: Tensor, b_fc: Optional[Tensor], w_proj: Tensor,
            b_proj: Optional[Tensor], saves: int = -1, w_fc32: Optional[Tensor] = None,
            w_proj32: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """x (M, C) bf16. Returns (y, pre, h) as _ext_forward: pre holds gelu'(pre) under the default.
    saves: what the caller expects pre to hold (1 gelu'(pre), 0 pre, -1 whatever the fcfast flag says
    now); the public op passes it under torch.compile, where the backward's reading of pre is fixed
    when the graph is traced (review R2, session 8): a flag changed since is refused (_check_saves).
    w_fc32, w_proj32 (the fp32-weight path under torch.compile, section 4): the fp32 weights that
    w_fc and w_proj were cast from. Never read here; the backward returns their gradients in fp32
    (dw_float) and none for the bf16 copies, so autograd never widens a bf16 gradient."""
    _check_saves(saves, b_fc is not None or b_proj is not None)
    _check_fp32_weights(w_fc, w_proj, w_fc32, w_proj32, b_fc is not None or b_proj is not None)
    y, pre, h = _ext_forward(x, w_fc, b_fc, w_proj, b_proj)
    return y, pre, h


@torch.library.custom_op("tk::mlp_bwd", mutates_args=())
def mlp_bwd(dy: Tensor, x: Tensor, pre: Tensor, h: Tensor, w_fc: Tensor,
            w_proj: Tensor, bias_grads: bool = True, saved: int = -1,
            dw_float: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (dx, dw_fc, db_fc, dw_proj, db_proj), all bf16. saved: as _ext_backward's.
    dw_float (bias_grads=False only): the two fp32 weight gradients come back as ONE flat fp32
    tensor in dw_fc's place, dw_fc's values then dw_proj's (_split_dw takes them apart), and dw_proj's
    place is empty: the extension's two are views of one buffer (its dGELU GEMM zeroes it as one
    range), and a custom op may not return outputs that alias each other (session 11's first run)."""
    dx, dw_fc, db_fc, dw_proj, db_proj = _ext_backward(dy, x, pre, h, w_fc, w_proj, bias_grads, saved, dw_float)
    if dw_float:
        return dx, _one_buffer(dw_fc, dw_proj), db_fc, dw_proj.new_empty(0), db_proj
    return dx, dw_fc, db_fc, dw_proj, db_proj


def _one_buffer(a, b):
    """a and b flattened into one tensor: a view of their storage when b follows a in it (the
    extension's dw_float buffer), else a copy."""
    if (a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype and a.untyped_storage().data_ptr() ==
            b.untyped_storage().data_ptr() and b.storage_offset() == a.storage_offset() + a.numel()):
        return a.as_strided((a.numel() + b.numel(),), (1,), a.storage_offset())
    return torch.cat((a.reshape(-1), b.reshape(-1)))


def _split_dw(flat, w_fc, w_proj):
    """mlp_bwd's flat dw_float output taken apart: (dw_fc, dw_proj), views shaped as the weights."""
    n = w_fc.numel()
    return flat[:n].view(w_fc.shape), flat[n:].view(w_proj.shape)


@mlp_fwd.register_fake
def _(x, w_fc, b_fc, w_proj, b_proj, saves=-1, w_fc32=None, w_proj32=None):
    _check_fp32_weights(w_fc, w_proj, w_fc32, w_proj32, b_fc is not None or b_proj is not None)
    M, H = x.shape[0], w_fc.shape[0]
    return x.new_empty(M, w_proj.shape[0]), x.new_empty(M, H), x.new_empty(M, H)


@mlp_bwd.register_fake
def _(dy, x, pre, h, w_fc, w_proj, bias_grads=True, saved=-1, dw_float=False):
    if dw_float:   # (the flat fp32 buffer of both weight gradients, then an empty tensor)
        dw_fc = w_fc.new_empty(w_fc.numel() + w_proj.numel(), dtype=torch.float32)
        dw_proj = w_proj.new_empty(0, dtype=torch.float32)
    else:
        dw_fc, dw_proj = torch.empty_like(w_fc), torch.empty_like(w_proj)
    return (torch.empty_like(x), dw_fc, w_fc.new_empty(w_fc.shape[0] if bias_grads else 0),
            dw_proj, w_proj.new_empty(w_proj.shape[0] if bias_grads else 0))


# ---- 3. autograd: the forward keeps x, pre, h and the weights; backward is one more call -----
# One setup_context and one backward body serve both paths (as in kernels/layernorm.py): on the
# custom op the backward calls the custom op mlp_bwd; on the eager fast path, _ext_backward.

def _setup(ctx, inputs, output):
    x, w_fc, b_fc, w_proj, b_proj, *rest = inputs      # (mlp_fwd's saves, w_fc32, w_proj32; _MLPEager has none)
    saves = rest[:1]
    _, pre, h = output
    ctx.save_for_backward(x, pre, h, w_fc, w_proj)
    ctx.has_b_fc, ctx.has_b_proj = b_fc is not None, b_proj is not None
    if rest:   # mlp_fwd: given the fp32 weights (torch.compile's fp32-weight path), their gradients in fp32
        ctx.dw_float = rest[1] is not None
    # What the forward wrote into pre (session 8): gelu'(pre) when its c_fc ran with fcfast=5, 9, 10 or 11. The
    # backward is told, so a schedule changed in between cannot make it read one as the other.
    # Under torch.compile this runs once, at trace time: the caller's saves (mlp() passes it there)
    # is then what the forward checks at every run (_check_saves), so the two cannot disagree.
    if saves and saves[0] != -1:
        ctx.saved = saves[0]
    else:
        ctx.saved = 1 if _saves_gelu_grad(ctx.has_b_fc or ctx.has_b_proj) else 0


def _make_backward(mlp_backward, inputs=5):
    def backward(ctx, dy, _dpre, _dh):
        # pre and h are internal outputs (the public op returns only y): their gradients are unused
        # (zeros on the custom op, None on the fast path), and dy is never None.
        x, pre, h, w_fc, w_proj = ctx.saved_tensors
        # A model without biases (GPT-2's bias=False) skips the bias-gradient work: the column sums
        # of dy and dpre and their casts (~0.3 ms of a GPT-2 step).
        bias_grads = ctx.has_b_fc or ctx.has_b_proj
        # fp32 weights ask for fp32 weight gradients (_MLPEager.forward, or mlp_fwd's w_fc32 / w_proj32)
        dw_float = getattr(ctx, "dw_float", False)
        extra = {"dw_float": True} if dw_float else {}
        dx, dw_fc, db_fc, dw_proj, db_proj = mlp_backward(dy.contiguous(), x, pre, h, w_fc, w_proj, bias_grads, ctx.saved,
                                                          **extra)
        grads = [dx, dw_fc, db_fc if ctx.has_b_fc else None, dw_proj, db_proj if ctx.has_b_proj else None]
        grads += [None] * (inputs - 5)                  # (mlp_fwd's saves, w_fc32, w_proj32)
        if dw_float and inputs == 8:                    # mlp_fwd: the fp32 gradients go to the fp32 weights,
            grads[1] = grads[3] = None                  # none to their bf16 copies (nothing to widen)
            grads[6], grads[7] = _split_dw(dw_fc, w_fc, w_proj)   # (mlp_bwd returned them as one buffer)
        return tuple(grads)
    return backward


mlp_fwd.register_autograd(_make_backward(mlp_bwd, inputs=8), setup_context=_setup)


class _MLPEager(torch.autograd.Function):
    """mlp_fwd without torch.library: the same call, saved tensors and backward. Old style and no
    materialized zero gradients, as kernels/layernorm.py explains: here that saves two (M, H)
    zero tensors per backward, for pre and h, which the custom-op path allocates and fills."""
    @staticmethod
    def forward(ctx, x, w_fc, b_fc, w_proj, b_proj):
        ctx.set_materialize_grads(False)
        # fp32 weights come only from mlp()'s _fp32_weight_path: cast here, outside autograd, and
        # the backward returns their gradients in fp32 (dw_float)
        ctx.dw_float = w_fc.dtype == torch.float32
        if ctx.dw_float:
            w_fc, w_proj = _bf16(w_fc), _bf16(w_proj)
        output = _ext_forward(x, w_fc, b_fc, w_proj, b_proj)   # (y, pre, h)
        _setup(ctx, (x, w_fc, b_fc, w_proj, b_proj), output)
        return output

    backward = staticmethod(_make_backward(_ext_backward))


# ---- 4. the public op, with the same signature as reference.mlp ------------------------------
# Outside torch.compile it takes the eager fast path (_MLPEager), not the custom op: the
# torch.library dispatch costs hundreds of µs of CPU per fwd+bwd (kernels/layernorm.py, section 4).

def _bf16(t):
    return None if t is None else t.to(torch.bfloat16).contiguous()


# In evaluation (no gradient will be asked for) the eager path calls forward_inference, whose
# c_fc epilogue writes h but not pre: pre is read only by the backward, and writing it costs
# 2·M·4C bytes per layer (50 MB at shakespeare's eval shape, ~6% of an eval forward). y is
# bit-identical. TK_MLP_INFERENCE=0 turns this off (every call then runs the training forward).
# Under torch.compile the custom op stays as it is (one graph for training and evaluation).
INFERENCE_ENV = "TK_MLP_INFERENCE"


def _wants_inference(tensors):
    """True when no gradient can flow back through this call and TK_MLP_INFERENCE is not '0'."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False
    return os.environ.get(INFERENCE_ENV, "1").strip() != "0"


# Training under autocast with fp32 weights and no biases (GPT-2's bias=False), the eager path hands
# _MLPEager the fp32 weights themselves: it casts them to bf16 inside, and its backward returns the
# weight gradients in fp32 straight from the kernels' fp32 split-K sums (kernels/mlp_bindings.cpp,
# dw_float). Otherwise autograd's casts would take bf16 gradients back to fp32: three launches a
# layer (the finish kernel's cast to bf16, one cast back per weight), the gradient rounded to bf16.
# Under torch.compile (session 11) the custom op gets the bf16 casts (made outside it, where inductor
# fuses them) AND the fp32 weights, w_fc32 / w_proj32: its backward returns the fp32 gradients to
# the fp32 weights and none to the casts, so no widening runs there either.
# TK_MLP_DW_FLOAT=0 turns it off (the weights cast outside, as before session 10).
DW_FLOAT_ENV = "TK_MLP_DW_FLOAT"


@torch.compiler.assume_constant_result
def _dw_float_env():
    # (under torch.compile read once, at trace time: a graph keeps the path it was traced with)
    return os.environ.get(DW_FLOAT_ENV, "1").strip() != "0"


def _fp32_weight_path(w_fc, b_fc, w_proj, b_proj):
    return (b_fc is None and b_proj is None and w_fc.dtype == torch.float32 and w_proj.dtype == torch.float32
            and _autocast_bf16() and _dw_float_env())


def mlp(x, w_fc, b_fc, w_proj, b_proj):
    """y = GELU_tanh(x @ w_fc.T + b_fc) @ w_proj.T + b_proj (biases may be None), in bf16."""
    lead = x.shape[:-1]
    x2 = _bf16(x.reshape(-1, x.shape[-1]))
    # (the weights cast only on the paths that take them in bf16: the fp32-weight path casts them
    # inside _MLPEager, and casting here too would add two launches a layer for nothing)
    args = lambda: (x2, _bf16(w_fc), _bf16(b_fc), _bf16(w_proj), _bf16(b_proj))
    if torch.compiler.is_compiling():
        # The backward graph's reading of pre is fixed now, at trace time: the forward is told the
        # same, and refuses to run if the fcfast flag has changed since (_check_saves).
        saves = _saves_when_traced(b_fc is not None or b_proj is not None)
        if _fp32_weight_path(w_fc, b_fc, w_proj, b_proj):
            y, _, _ = mlp_fwd(*args(), saves, w_fc, w_proj)
        else:
            y, _, _ = mlp_fwd(*args(), saves)
    elif _wants_inference((x, w_fc, b_fc, w_proj, b_proj)):
        y = _ext_forward_inference(*args())
    elif _fp32_weight_path(w_fc, b_fc, w_proj, b_proj):
        y, _, _ = _MLPEager.apply(x2, w_fc, None, w_proj, None)
    else:
        y, _, _ = _MLPEager.apply(*args())
    return y.reshape(*lead, y.shape[-1])


# ---- 5. the support check and registration ---------------------------------------------------

@torch.compiler.assume_constant_result
def _build_reason():
    # Under torch.compile this runs once at trace time and its answer is a constant, so the
    # build (file locks, nvcc) never gets traced.
    return _ext.why_not()


def _autocast_bf16():
    return torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16


def why_not(x, w_fc, b_fc, w_proj, b_proj):
    """None if the tk kernel can run the MLP on these inputs, else the reason it cannot."""
    if not checks.on_kernel_device(x):
        return f"x is on {x.device.type}; the tk kernel needs CUDA tensors"
    named = [("x", x), ("w_fc", w_fc), ("b_fc", b_fc), ("w_proj", w_proj), ("b_proj", b_proj)]
    for name, t in named:
        if t is not None and t.device != x.device:
            return f"{name} is on {t.device}, x on {x.device}"
    if not _autocast_bf16():
        for name, t in named:
            if t is not None and t.dtype != torch.bfloat16:
                return (f"{name} is {t.dtype}; the tk MLP computes in bfloat16: pass bfloat16 tensors "
                        f"or run under torch.autocast('cuda', dtype=torch.bfloat16)")
    for name, t in named:
        if t is not None and not t.is_floating_point():
            return f"{name} is {t.dtype}; the MLP needs floating-point tensors"
    if x.dim() < 1 or w_fc.dim() != 2 or w_proj.dim() != 2:
        return "x must have a last (embedding) dimension and w_fc, w_proj must be 2-D"
    C, H = x.shape[-1], w_fc.shape[0]
    if w_fc.shape[1] != C or tuple(w_proj.shape) != (C, H):
        return f"shapes do not match: x (..., {C}), w_fc {tuple(w_fc.shape)}, w_proj {tuple(w_proj.shape)}"
    if b_fc is not None and tuple(b_fc.shape) != (H,):
        return f"b_fc has shape {tuple(b_fc.shape)}, expected ({H},)"
    if b_proj is not None and tuple(b_proj.shape) != (C,):
        return f"b_proj has shape {tuple(b_proj.shape)}, expected ({C},)"
    if C % MULTIPLE or H % MULTIPLE or C == 0 or H == 0:
        return f"embedding size {C} and hidden size {H} must be positive multiples of {MULTIPLE}"
    if x.numel() == 0:
        return "x is empty"
    if x.numel() // C >= 2**31:
        return f"x has {x.numel() // C} rows; the kernel takes fewer than 2^31"
    return _build_reason()


def preflight(n_embd, dtype, device, **_):
    """Start-up check for the configured model; builds the extension now, not mid-step. A bad
    TK_MLP_DW_GEMM is refused here too, before any step."""
    if os.environ.get(DW_GEMM_ENV):
        parse_dw_gemm(os.environ[DW_GEMM_ENV])
    return checks.bf16_preflight("the tk MLP", n_embd, dtype, device, MULTIPLE, _ext.why_not)


register_tk("mlp", mlp, why_not)
_preflight_checks["mlp"] = preflight


# ---- 6. bench.py's MLP rows (kernels/mlp_bench.py), when bench.py is the running script --------

def _register_bench_cases():
    # bench.py runs as __main__, so `from bench import register` would load a second copy with
    # its own registry; register into the running script's instead.
    bench = sys.modules.get("__main__")
    if bench is None or not (hasattr(bench, "register") and hasattr(bench, "Case") and hasattr(bench, "REGISTRY")):
        bench = sys.modules.get("bench")
    if bench is None or not hasattr(bench, "register"):
        return
    from . import mlp_bench
    bench.register("mlp")(lambda quick: mlp_bench.cases(bench.Case, quick))


_register_bench_cases()

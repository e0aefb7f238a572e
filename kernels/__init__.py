"""The seam between the model and the kernels: one switch, five ops.

model.py calls only `add_layernorm`, `attention` (or `attention_qkv`, the same op on the packed
c_attn output), `mlp`, `lm_head_loss` (the LM head and its cross-entropy) and `linear` (the
attention's c_attn and c_proj) from here. Each call goes to the
hand-written tk kernel or to its PyTorch reference twin (kernels/reference.py), as the switch
says:

    kernels = 'auto' | 'tk' | 'torch'      one global choice
    kernels_<op> = '' | 'auto' | 'tk' | 'torch'   per-op override ('' follows `kernels`)

(train.py and sample.py set kernels_linear = 'torch': the tk linear is off unless asked.)

- 'torch': always the reference (runs anywhere, CPU included).
- 'tk': always the kernel; if it cannot run (no CUDA, unsupported shape or dtype, kernel not
  built) the call raises `KernelUnavailable` saying why and how to fall back.
- 'auto': the kernel where it can run, else the reference, logging one line per (op, reason).

Support is checked on every call (sampling runs T=1 where training ran T=256), so `used()`
reports what each op really ran on. A tk implementation registers itself with
`register_tk(op, impl, why_not)`, where `why_not(*args, **kwargs)` returns None when the kernel
can take these inputs and otherwise a short reason.

The op modules (kernels/layernorm.py, attention_op.py, ...: OP_MODULES) are imported at the bottom of this
file; kernels/layernorm.py shows the pattern. Importing never builds: an extension is built on
the first tk call (or at preflight), and only where CUDA is available. An op module that fails
to import is reported on stderr, and its op's reason says why; the other ops still work.
"""
import importlib
import sys
from pathlib import Path

import torch

from . import reference

OPS = ("attention", "layernorm", "mlp", "lm_head", "linear")
CHOICES = ("auto", "tk", "torch")


class KernelUnavailable(RuntimeError):
    """Raised when `tk` was asked for an op whose kernel cannot run on these inputs."""


_choice = {op: "auto" for op in OPS}   # resolved per-op choice
_tk_impls = {}                         # op -> (impl, why_not)
_used = {op: set() for op in OPS}      # op -> {'tk', 'torch'} actually run
_logged = set()                        # (op, reason) already reported by 'auto'


def register_tk(op, impl, why_not, entry=None):
    """`entry` names a second public function of the same op (attention_qkv for attention): it
    follows the op's switch setting and shows in used() under the op's name."""
    assert op in OPS, op
    _tk_impls[entry or op] = (impl, why_not)


def configure(kernels="auto", attention="", layernorm="", mlp="", lm_head="", linear=""):
    """Set the switch. Returns the per-op choice as a dict."""
    overrides = {"attention": attention, "layernorm": layernorm, "mlp": mlp, "lm_head": lm_head, "linear": linear}
    for name, value in [("kernels", kernels)] + [(f"kernels_{op}", v) for op, v in overrides.items()]:
        if value not in CHOICES and not (name != "kernels" and value == ""):
            allowed = " | ".join(CHOICES) + ("" if name == "kernels" else " | '' (follow kernels)")
            raise ValueError(f"{name}={value!r} is not a valid choice; use one of {allowed}")
    for op in OPS:
        _choice[op] = overrides[op] or kernels
    return dict(_choice)


def choice():
    return dict(_choice)


def used():
    """What each op really ran on so far: {'attention': 'tk' | 'torch' | 'tk+torch' | 'unused'}."""
    return {op: "+".join(sorted(s)) if s else "unused" for op, s in _used.items()}


def reset_used():
    for s in _used.values():
        s.clear()


# The two pieces of bookkeeping in _dispatch are marked assume_constant_result: under
# torch.compile dynamo then runs them once, when it traces the call (the op's choice is fixed in
# the compiled graph), instead of tracing into them. Traced, `print` was a graph break (one per
# falling-back op, kernels=auto), and `_used[op].add` left a guard on the set's contents, so the
# second step recompiled the whole model (and again after every reset_used()). Eager calls run
# them as before. Consequence: used() reports what each compiled graph was traced with, and a
# reset_used() after compiling is not refilled until the graph is traced again.

@torch.compiler.assume_constant_result
def _log_once(op, reason):
    if (op, reason) not in _logged:
        _logged.add((op, reason))
        print(f"kernels: {op} falls back to torch ({reason})")


@torch.compiler.assume_constant_result
def _record_use(op, backend):
    _used[op].add(backend)


def _owner(module):
    """The op a module belongs to (layernorm.py, attention_op.py, linear_op.py), or None for a
    helper that is no op's (gemm.py)."""
    return next((o for o in OPS if module == o or module.startswith(o + "_")), None)


def _missing_reason(op):
    # the op's own modules, or a helper that is no op's
    def related(m):
        return _owner(m) in (op, None)
    failed = [f"kernels/{m}.py failed to import ({err})" for m, err in _import_errors.items() if related(m)]
    return f"no tk kernel for {op} is available in this build" + (": " + "; ".join(failed) if failed else "")


def why_not_tk(op, *args, **kwargs):
    """None if the tk kernel for `op` can run on these inputs, else the reason it cannot."""
    if op not in _tk_impls:
        return _missing_reason(op)
    return _tk_impls[op][1](*args, **kwargs)


def preflight(batch_size, block_size, n_embd, n_head, dtype, device, attn_dropout=0.0, bias=True):
    """Start-up check for the configured model shapes: one line per op saying what it will run
    on, raising KernelUnavailable for an op set to 'tk' whose kernel cannot run. Returns
    {op: 'tk' | 'torch'}. (Each call is still checked again: sampling runs other shapes.)"""
    plan = {}
    for op in OPS:
        if _choice[op] == "torch":
            plan[op] = "torch"
            continue
        reason = None if op in _tk_impls else _missing_reason(op)
        if reason is None and op in _preflight_checks:
            reason = _preflight_checks[op](batch_size=batch_size, block_size=block_size, n_embd=n_embd,
                                           n_head=n_head, dtype=dtype, device=device,
                                           attn_dropout=attn_dropout, bias=bias)
        if reason is not None and _choice[op] == "tk":
            raise KernelUnavailable(f"kernels_{op}=tk, but the tk kernel cannot run here: {reason}. "
                                    f"Use --kernels_{op}=torch (or --kernels=auto) to run the PyTorch reference.")
        if reason is not None:
            _log_once(op, reason)
        plan[op] = "torch" if reason else "tk"
    return plan


_preflight_checks = {}   # op -> fn(**shapes) -> None | reason; registered by each tk op module


def _dispatch(op, ref, *args, entry=None, **kwargs):
    mode = _choice[op]
    if mode != "torch":
        key = entry or op
        reason = _tk_impls[key][1](*args, **kwargs) if key in _tk_impls else _missing_reason(op)
        if reason is None:
            _record_use(op, "tk")
            return _tk_impls[key][0](*args, **kwargs)
        if mode == "tk":
            raise KernelUnavailable(
                f"kernels_{op}=tk, but the tk kernel cannot run here: {reason}. "
                f"Use --kernels_{op}=torch (or --kernels=auto) to run the PyTorch reference.")
        _log_once(op, reason)
    _record_use(op, "torch")
    return ref(*args, **kwargs)


def add_layernorm(x, residual, weight, bias, eps=1e-5, dropout_p=0.0):
    """h = x + residual (residual may be None); y = LayerNorm(h; weight, bias). Returns (y, h).
    dropout_p > 0: h = x + dropout(residual, dropout_p) (training; the caller passes 0 in eval).
    The tk kernel draws its own mask (another one than F.dropout's, with the same law)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p < 1:
        raise ValueError(f"add_layernorm: dropout_p must be a number in [0, 1), got {dropout_p!r}")
    # Passed on only when on, so a call without dropout is exactly the call it was before.
    drop = {"dropout_p": dropout_p} if dropout_p else {}
    return _dispatch("layernorm", reference.add_layernorm, x, residual, weight, bias, eps, **drop)


def attention(q, k, v, causal=True, dropout_p=0.0, scale=None):
    """Causal self-attention on (B, H, T, D) q, k, v."""
    return _dispatch("attention", reference.attention, q, k, v, causal=causal, dropout_p=dropout_p, scale=scale)


def attention_qkv(qkv, causal=True, dropout_p=0.0, scale=None):
    """The same on the packed c_attn output qkv (B, T, 3, H, D); returns (B, T, H, D). The tk
    kernel reads q, k, v in place and returns the gradient of qkv as one tensor (no stacking)."""
    return _dispatch("attention", reference.attention_qkv, qkv, causal=causal, dropout_p=dropout_p, scale=scale,
                     entry="attention_qkv")


def mlp(x, w_fc, b_fc, w_proj, b_proj):
    """GELU(tanh) MLP: (x @ w_fc.T + b_fc) -> GELU -> @ w_proj.T + b_proj."""
    return _dispatch("mlp", reference.mlp, x, w_fc, b_fc, w_proj, b_proj)


def lm_head_loss(x, weight, targets):
    """Mean cross-entropy of the logits x @ weight.T against targets, ignoring targets == -1:
    x (N, C), weight (V, C) (the tied embedding), targets (N,) int64. Returns a scalar. The tk
    version never holds the (N, V) logits in full (kernels/lm_head_op.py)."""
    return _dispatch("lm_head", reference.lm_head_loss, x, weight, targets)


def linear(x, weight, bias=None):
    """y = x @ weight.T + bias (F.linear): x (..., K), weight (N, K), bias (N,) or None. The
    attention block's c_attn and c_proj; the tk version runs the tk GEMM (kernels/linear_op.py)."""
    return _dispatch("linear", reference.linear, x, weight, bias)


# ---- torch.compile: inductor's fallbacks for the tk ops, registered before it traces ---------
def prepare_for_compile():
    """Call before torch.compile of a model that uses tk ops (train.py and bench.py --e2e do).

    Inductor has no lowering for a custom op: it creates a fallback (the op called as it is) the
    first time it meets one. Before that it logs the op's arguments, and torch 2.11 formats them
    eagerly: each argument's IR prints every unrealized node it depends on, nested, so at GPT-2's
    12 layers the strings explode and the compile never finishes (session 7: Python stacks every
    20 s all inside inductor's exc.operator_str; the probe, tests/tk_compile_time.py, is in git before
    4e3c0c8, which removed it). Registering the same
    fallback here, with the layout constraint inductor would pick (the op's tag, else the default
    for custom ops), means inductor finds the op in its lowerings and never builds that string.
    Idempotent; returns the ops registered now."""
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag
    done = []
    for qualname in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualname.startswith("tk::"):
            continue
        packet = getattr(torch.ops.tk, qualname[len("tk::"):])
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op in lowering.lowerings:
                continue
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            lowering.make_fallback(op, layout_constraint=constraint, warn=False)
            done.append(op)
    return done


# ---- the op modules: each registers its tk kernel when imported -------------------------------
# Listed by name so one that is missing (not written yet) is simply skipped, while one that
# exists but fails to import is reported loudly instead of silently running torch.
# A new op module adds its name here (and follows kernels/layernorm.py's pattern). It must not
# be named after a function above (a submodule `kernels.attention` would replace the function
# `kernels.attention` that model.py calls): hence attention_op, mlp_op, lm_head_op and linear_op.
OP_MODULES = ("layernorm", "attention_op", "gemm", "mlp_op", "lm_head_op", "linear_op")
_import_errors = {}   # module name -> "ErrorType: message"

for _name in OP_MODULES:
    if not (Path(__file__).parent / f"{_name}.py").exists():
        continue
    try:
        importlib.import_module(f".{_name}", __name__)
    except Exception as _e:   # report, keep the other ops working
        _import_errors[_name] = f"{type(_e).__name__}: {_e}"
        print(f"kernels: WARNING kernels/{_name}.py failed to import, its tk kernel is unavailable: "
              f"{_import_errors[_name]}", file=sys.stderr)

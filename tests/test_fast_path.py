"""CPU tests of the eager fast path of the tk ops (kernels/layernorm.py section 4, mlp_op.py,
attention_op.py): outside torch.compile the public op runs a plain autograd.Function, under
torch.compile the torch.library custom ops. Both must run the same extension calls, with the same
input checks, saved tensors and backward.

No GPU and no build: each module's extension is replaced by a fake written in plain torch on CPU
tensors, with the bindings' signatures and return conventions (*_bindings.cpp: lists, h None
without a residual, o/dq/dk/dv laid out as (B, T, H, D), lse in natural log, bf16 MLP outputs).
The CUDA-only part of the Python input checks is switched off (cuda=False); the rest runs, and
is counted. The impls are called directly (why_not needs CUDA).

Asserted for each op: the fast path and the custom-op path give bit-identical outputs and
gradients; both match the PyTorch reference (so the gradient plumbing of both is right); the
fast path never calls a tk:: custom op and the compile path calls only custom ops (seen with a
TorchDispatchMode); the extension and the input checks run once per call on either path; and a
real torch.compile (aot_eager, fullgraph) takes the custom ops, not the fast path.
"""
import collections
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
from kernels import attention_hopper, attention_op, layernorm, linear_op, mlp_op, reference

torch.manual_seed(0)


# ---- fakes of the extensions: the bindings' signatures, reference math --------------------------

class FakeLayerNormExt:
    """layernorm_bindings.cpp: forward -> [y, h | None, mean, rstd]; backward -> [dh_out, dw, db]."""

    def __init__(self, calls):
        self.calls = calls
        self.dh_seen = []   # per backward call: None, "zeros" or "tensor"

    def forward(self, x, residual, weight, bias, eps):
        self.calls["ln.forward"] += 1
        h = None if residual is None else x + residual
        hf = (x if h is None else h).float()
        mean = hf.mean(-1)
        rstd = torch.rsqrt(hf.var(-1, unbiased=False) + eps)
        y = (hf - mean[..., None]) * rstd[..., None] * weight.float()
        if bias is not None:
            y = y + bias.float()
        return [y.to(x.dtype), h, mean, rstd]

    def backward(self, dy, dh, h, mean, rstd, weight):
        self.calls["ln.backward"] += 1
        self.dh_seen.append(None if dh is None else "zeros" if not dh.any() else "tensor")
        cols = h.shape[-1]
        hf, dyf = h.float().reshape(-1, cols), dy.float().reshape(-1, cols)
        mean, rstd = mean.reshape(-1, 1), rstd.reshape(-1, 1)
        xhat = (hf - mean) * rstd
        g = dyf * weight.float()
        dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        if dh is not None:
            dx = dx + dh.float().reshape(-1, cols)
        dw, db = (dyf * xhat).sum(0), dyf.sum(0)
        return [dx.reshape(h.shape).to(h.dtype), dw.to(weight.dtype), db.to(weight.dtype)]


def _gelu_grad(pre, grad):
    """grad * GELU_tanh'(pre), written out (inside a custom op autograd is off)."""
    x = pre.float()
    k = math.sqrt(2 / math.pi)
    t = torch.tanh(k * (x + 0.044715 * x**3))
    return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x))


class FakeMLPExt:
    """mlp_bindings.cpp: forward -> [y, pre, h]; backward -> [dx, dw_fc, db_fc, dw_proj, db_proj], bf16."""

    def __init__(self, calls):
        self.calls = calls

    def forward(self, x, w_fc, b_fc, w_proj, b_proj):
        self.calls["mlp.forward"] += 1
        pre = x.float() @ w_fc.float().T + (0 if b_fc is None else b_fc.float())
        h = F.gelu(pre, approximate="tanh").bfloat16()
        y = h.float() @ w_proj.float().T + (0 if b_proj is None else b_proj.float())
        return [y.bfloat16(), pre.bfloat16(), h]

    def backward(self, dy, x, pre, h, w_fc, w_proj, bias_grads=True, saved=-1, dw_float=False):
        # saved (session 8): what the real forward left in pre (1 gelu'(pre), 0 pre, -1 per the
        # fcfast flag); this fake's forward always stores pre, so only the argument is checked
        assert saved in (-1, 0, 1), saved
        assert w_fc.dtype == w_proj.dtype == torch.bfloat16   # the kernels read bf16 weights, always
        assert not (dw_float and bias_grads), "the extension refuses dw_float with bias gradients"
        self.calls["mlp.backward"] += 1
        self.calls[f"mlp.backward bias_grads={bias_grads}"] += 1
        self.calls[f"mlp.backward dw_float={dw_float}"] += 1
        dyf = dy.float()
        dpre = _gelu_grad(pre, dyf @ w_proj.float())
        grads = (dpre @ w_fc.float(), dpre.T @ x.float(), dpre.sum(0), dyf.T @ h.float(), dyf.sum(0))
        out = [g.bfloat16() for g in grads]
        if dw_float:         # session 10: the weight gradients in fp32, from the split-K sums,
            buf = torch.cat((grads[1].reshape(-1), grads[3].reshape(-1)))   # as two views of one buffer
            n = grads[1].numel()
            out[1], out[3] = buf[:n].view(grads[1].shape), buf[n:].view(grads[3].shape)
        if not bias_grads:   # as the extension: empty bias gradients, their work skipped
            out[2], out[4] = out[2][:0], out[4][:0]
        return out


def _bthd(t):
    """A (B, H, T, D) bf16 copy of t laid out as (B, T, H, D), as the attention bindings allocate."""
    B, H, T, D = t.shape
    out = torch.empty(B, T, H, D, dtype=torch.bfloat16).transpose(1, 2)
    out.copy_(t)
    return out


def _probabilities(q, k, causal, scale):
    s = torch.einsum("bhtd,bhsd->bhts", q.float(), k.float()) * scale
    if causal:
        T = q.shape[2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]), lse


def _attention_forward(q, k, v, causal, scale):
    p, lse = _probabilities(q, k, causal, scale)
    return [_bthd(p @ v.float()), lse]


class FakePortableAttentionExt:
    """attention_bindings.cpp: check_forward/check_backward -> '' (fine); forward -> [o, lse];
    backward -> [dq, dk, dv], all (B, H, T, D) laid out as (B, T, H, D)."""

    def __init__(self, calls):
        self.calls = calls

    def check_forward(self, q, k, v, scale):
        return ""

    def check_backward(self, grad_out, q, k, v, o, lse, scale):
        return ""

    def check_outputs(self, dq, dk, dv, q):
        return ""

    def backward_into(self, grad_out, q, k, v, o, lse, causal, scale, dq, dk, dv):
        self.calls["portable.backward_into"] += 1
        for out, grad in zip((dq, dk, dv), self._grads(grad_out, q, k, v, o, lse, causal, scale)):
            out.copy_(grad)

    def forward(self, q, k, v, causal, scale):
        self.calls["portable.forward"] += 1
        return _attention_forward(q, k, v, causal, scale)

    def backward(self, grad_out, q, k, v, o, lse, causal, scale):
        self.calls["portable.backward"] += 1
        return [_bthd(g) for g in self._grads(grad_out, q, k, v, o, lse, causal, scale)]

    @staticmethod
    def _grads(grad_out, q, k, v, o, lse, causal, scale):
        p = torch.exp(torch.einsum("bhtd,bhsd->bhts", q.float(), k.float()) * scale - lse[..., None])
        if causal:
            p = p.tril()
        do = grad_out.float()
        dv = p.transpose(-1, -2) @ do
        dp = do @ v.float().transpose(-1, -2)
        ds = p * (dp - (do * o.float()).sum(-1, keepdim=True))
        dq, dk = ds @ k.float() * scale, ds.transpose(-1, -2) @ q.float() * scale
        return dq, dk, dv


class FakeHopperAttentionExt:
    """attention_hopper_bindings.cpp: forward(q, k, v, causal, scale, variant) -> [o, lse]."""

    def __init__(self, calls):
        self.calls = calls

    def forward(self, q, k, v, causal, scale, variant):
        self.calls["hopper.forward"] += 1
        return _attention_forward(q, k, v, causal, scale)


# ---- fixtures: install the fakes, count the checks ---------------------------------------------

def _counted_cpu_check(monkeypatch, calls, module, name):
    """module.name, the real check with cuda=False, counting its calls."""
    real = getattr(module, name)

    def check(*args, **kwargs):
        calls[name] += 1
        return real(*args, **{**kwargs, "cuda": False})
    monkeypatch.setattr(module, name, check)


@pytest.fixture
def calls(monkeypatch):
    """Installs every fake extension and CPU check; returns the call counter."""
    calls = collections.Counter()
    monkeypatch.setattr(layernorm._ext, "_module", FakeLayerNormExt(calls))
    monkeypatch.setattr(mlp_op._ext, "_module", FakeMLPExt(calls))
    monkeypatch.setattr(attention_op._portable, "_module", FakePortableAttentionExt(calls))
    monkeypatch.setattr(attention_hopper._ext, "_module", FakeHopperAttentionExt(calls))
    for module, name in [(layernorm, "check_forward"), (layernorm, "check_backward"),
                         (mlp_op, "check_forward"), (mlp_op, "check_backward"),
                         (attention_op, "check_forward_inputs"), (attention_op, "check_backward_inputs"),
                         (attention_hopper, "check_inputs")]:
        _counted_cpu_check(monkeypatch, calls, module, name)
    monkeypatch.setattr(attention_op, "_pinned", "auto")
    return calls


def _attention_backends(hopper):
    """A backend table whose backends accept CPU tensors: hopper forward + portable backward
    (as on the H200), or portable only."""
    def accept(q, causal, scale):
        return None
    table = {}
    if hopper:
        table["hopper"] = attention_op.Backend("hopper", accept, attention_hopper.backend_forward, None)
    table["portable"] = attention_op.Backend("portable", accept, attention_op._portable_forward,
                                             attention_op._portable_backward)
    return table


class OpLog(TorchDispatchMode):
    """Every op that reaches the dispatcher below autograd (a custom op shows as one op)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))

    def tk_ops(self):
        return sorted({n for n in self.names if n.startswith("tk.")})


def _run(op, args, grad_inputs, compiling=None):
    """Forward and backward of op(*args) with random output gradients, torch.compiler.is_compiling
    patched to return `compiling` (None: left alone, for a real torch.compile). Returns (outputs,
    grads, tk custom ops seen (not logged under a real compile), grad_fn name of the first output)."""
    log = OpLog()
    with pytest.MonkeyPatch.context() as patch, (log if compiling is not None else contextlib.nullcontext()):
        if compiling is not None:
            patch.setattr(torch.compiler, "is_compiling", lambda: compiling)
        out = op(*args)
        outs = out if isinstance(out, tuple) else (out,)
        gen = torch.Generator().manual_seed(1)
        loss = sum((o.float() * torch.randn(o.shape, generator=gen)).sum() for o in outs)
        grads = torch.autograd.grad(loss, grad_inputs)
    grad_fn = outs[0].grad_fn
    while type(grad_fn).__name__ in ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0",
                                     "TransposeBackward0"):
        grad_fn = grad_fn.next_functions[0][0]     # the mlp reshapes y back to (..., C)
    return [o.detach() for o in outs], grads, log.tk_ops(), type(grad_fn).__name__


def _both_paths(op, args, grad_inputs, calls, fast_class, custom_ops):
    """Runs op on the fast path and on the custom-op path; asserts identical results, each path's
    ops, and one extension call and one check per direction on each. Returns (outputs, grads)."""
    results = {}
    for compiling in (False, True):
        calls.clear()
        outs, grads, tk_ops, grad_fn = _run(op, args, grad_inputs, compiling)
        results[compiling] = outs, grads
        if compiling:
            assert tk_ops == sorted(custom_ops) and grad_fn.startswith("GeneratedBackwardFor_tk_"), (tk_ops, grad_fn)
        else:
            assert tk_ops == [] and grad_fn == fast_class + "Backward", (tk_ops, grad_fn)
        assert calls and all(n == 1 for n in calls.values()), dict(calls)
    (fast_outs, fast_grads), (op_outs, op_grads) = results[False], results[True]
    for a, b in zip(fast_outs + list(fast_grads), op_outs + list(op_grads)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b)
    return fast_outs, fast_grads


def _rel_err(a, b):
    """Relative norm error; absolute where b is all zeros (a gradient of an output with no loss)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / (b.norm() if b.any() else 1)).item()


def _reference_grads(fn, tensors, out_count):
    """The PyTorch reference's outputs and gradients in float64, with the same output gradients as _run."""
    leaves = [t.detach().double().requires_grad_() for t in tensors]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=gen).double()).sum() for o in outs[:out_count])
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)   # LN's weight is unused when only h is
    return [o.detach() for o in outs], [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


# ---- layernorm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("residual, loss_on", [(True, "y+h"), (True, "y"), (True, "h"), (False, "y")])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layernorm_fast_path_matches_custom_ops(calls, residual, loss_on, bias, dtype):
    x = torch.randn(3, 7, 128, dtype=dtype, requires_grad=True)
    r = torch.randn(3, 7, 128, dtype=dtype, requires_grad=True) if residual else None
    w = (1 + 0.1 * torch.randn(128)).requires_grad_()
    b = (0.1 * torch.randn(128)).requires_grad_() if bias else None
    leaves = [t for t in (x, r, w, b) if t is not None]
    fast_class = "_AddLayerNormEager" if residual else "_LayerNormEager"
    custom_ops = (["tk.add_layernorm_fwd.default"] if residual else ["tk.layernorm_fwd.default"]) + \
        ["tk.layernorm_bwd.default"]

    def pick(y, h):   # the outputs that reach the loss (without a residual h is x itself)
        return {"y+h": (y, h), "y": y, "h": h}[loss_on]
    outs, grads = _both_paths(lambda x, r, w, b: pick(*layernorm.add_layernorm(x, r, w, b, 1e-5)),
                              (x, r, w, b), leaves, calls, fast_class, custom_ops)
    assert calls["check_forward"] == calls["check_backward"] == 1
    if loss_on == "y" and residual:
        # h reached no loss: the fast path passes dh=None (the kernel skips it), the custom op zeros
        assert layernorm._ext.module.dh_seen == [None, "zeros"]

    def ref(*ts):
        it = iter(ts)
        xr, rr, wr = next(it), (next(it) if residual else None), next(it)
        return pick(*reference.add_layernorm(xr, rr, wr, next(it) if bias else None, 1e-5))
    ref_outs, ref_grads = _reference_grads(ref, leaves, len(outs))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for got, want in zip(outs + list(grads), ref_outs + list(ref_grads)):
        assert _rel_err(got, want) < tol


# ---- mlp ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])   # fp32: cast as under autocast
def test_mlp_fast_path_matches_custom_ops(calls, bias, param_dtype):
    C, H = 64, 192
    x = torch.randn(2, 19, C, dtype=torch.bfloat16, requires_grad=True)
    w_fc = (torch.randn(H, C) / C**0.5).to(param_dtype).requires_grad_()
    w_proj = (torch.randn(C, H) / H**0.5).to(param_dtype).requires_grad_()
    b_fc = (0.1 * torch.randn(H)).to(param_dtype).requires_grad_() if bias else None
    b_proj = (0.1 * torch.randn(C)).to(param_dtype).requires_grad_() if bias else None
    leaves = [t for t in (x, w_fc, b_fc, w_proj, b_proj) if t is not None]
    outs, grads = _both_paths(mlp_op.mlp, (x, w_fc, b_fc, w_proj, b_proj), leaves, calls,
                              "_MLPEager", ["tk.mlp_bwd.default", "tk.mlp_fwd.default"])
    assert calls["check_forward"] == calls["check_backward"] == 1
    # both paths ask for bias gradients only when there are biases (GPT-2's bias=False skips them)
    assert calls[f"mlp.backward bias_grads={bias}"] == calls["mlp.backward"] == 1, dict(calls)   # (the custom-op run's count)
    assert outs[0].shape == x.shape and outs[0].dtype == torch.bfloat16
    assert [g.dtype for g in grads] == [t.dtype for t in leaves]   # fp32 parameters get fp32 gradients

    def ref(*ts):
        it = iter(ts)
        xr, wf = next(it), next(it)
        bf = next(it) if bias else None
        wp = next(it)
        return reference.mlp(xr, wf, bf, wp, next(it) if bias else None)
    ref_outs, ref_grads = _reference_grads(ref, leaves, 1)
    for got, want in zip(outs + list(grads), ref_outs + list(ref_grads)):
        assert _rel_err(got, want) < 2e-2


@pytest.mark.parametrize("env", ["1", "0"])
@pytest.mark.parametrize("compiling", [False, True], ids=["eager", "custom_op"])
def test_mlp_fp32_weights_get_fp32_gradients_from_the_kernel(calls, monkeypatch, env, compiling):
    """Session 10: under bf16 autocast, fp32 weights and no biases, the eager path hands the fp32
    weights to _MLPEager, which casts them inside, and asks the backward for fp32 weight gradients
    (dw_float): no cast to bf16 and back. TK_MLP_DW_FLOAT=0: the casts outside, as before.
    Session 11: the custom-op path (torch.compile's) the same: mlp_fwd gets the bf16 casts and the
    fp32 weights, and its backward returns fp32 gradients to the fp32 weights, none to the casts."""
    monkeypatch.setattr(mlp_op, "_autocast_bf16", lambda: True)   # as under torch.autocast on a GPU
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    monkeypatch.setenv(mlp_op.DW_FLOAT_ENV, env)
    C, H = 64, 192
    x = torch.randn(2, 19, C, dtype=torch.bfloat16, requires_grad=True)
    w_fc = (torch.randn(H, C) / C**0.5).requires_grad_()
    w_proj = (torch.randn(C, H) / H**0.5).requires_grad_()
    casts = collections.Counter()       # the weights are cast to bf16 once a call, on either path
    real_bf16 = mlp_op._bf16
    monkeypatch.setattr(mlp_op, "_bf16", lambda t: (casts.update([id(t)]), real_bf16(t))[1])
    y = mlp_op.mlp(x, w_fc, None, w_proj, None)
    assert casts[id(w_fc)] == casts[id(w_proj)] == 1, "a weight cast twice (or never) in one call"
    assert type(y.grad_fn).__name__ != "ToCopyBackward0"
    dy = torch.randn_like(y)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    y.backward(dy)
    assert calls["mlp.backward"] == 1 and calls[f"mlp.backward dw_float={env == '1'}"] == 1, dict(calls)
    assert w_fc.grad.dtype == w_proj.grad.dtype == torch.float32
    ref_w = [w.detach().clone().requires_grad_() for w in (w_fc, w_proj)]
    reference.mlp(x.detach().float(), ref_w[0], None, ref_w[1], None).backward(dy.float())
    for got, want in zip((w_fc.grad, w_proj.grad), (r.grad for r in ref_w)):
        assert _rel_err(got, want) < 2e-2
    # the fp32 path hands back the (fake) kernel's fp32 sums unrounded; the other rounds them to bf16
    for g in (w_fc.grad, w_proj.grad):
        assert torch.equal(g, g.bfloat16().float()) == (env == "0")


# ---- attention ---------------------------------------------------------------------------------

@pytest.mark.parametrize("hopper", [True, False], ids=["hopper_fwd+portable_bwd", "portable"])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_fast_path_matches_custom_ops(calls, monkeypatch, hopper, causal):
    monkeypatch.setattr(attention_op, "BACKENDS", _attention_backends(hopper))
    B, T, H, D = 2, 37, 3, 64
    qkv = torch.randn(B, T, 3, H, D, dtype=torch.bfloat16, requires_grad=True)   # as the model's c_attn

    def op(qkv):
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))   # views, read in place
        return attention_op.attention(q, k, v, causal=causal)
    outs, grads = _both_paths(op, (qkv,), [qkv], calls, "_AttentionEager",
                              ["tk.attention_bwd.default", "tk.attention_fwd.default"])
    forward = "hopper.forward" if hopper else "portable.forward"
    assert calls[forward] == calls["portable.backward"] == 1 and len(calls) == 4, dict(calls)

    def ref(qkv):
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        return reference.attention(q, k, v, causal=causal)
    ref_outs, ref_grads = _reference_grads(ref, [qkv], 1)
    for got, want in zip(outs + list(grads), ref_outs + list(ref_grads)):
        assert _rel_err(got, want) < 2e-2


@pytest.mark.parametrize("hopper", [True, False], ids=["hopper_fwd+portable_bwd", "portable"])
def test_packed_attention_fast_path_matches_custom_ops(calls, monkeypatch, hopper):
    # attention_qkv (the model's call): one input, the packed qkv; the backward writes the three
    # gradients into one (B, T, 3, H, D) tensor through backward_into (no stack, no copy).
    monkeypatch.setattr(attention_op, "BACKENDS", _attention_backends(hopper))
    B, T, H, D = 2, 37, 3, 64
    qkv = torch.randn(B, T, 3, H, D, dtype=torch.bfloat16, requires_grad=True)
    outs, grads = _both_paths(attention_op.attention_qkv, (qkv,), [qkv], calls, "_AttentionQKVEager",
                              ["tk.attention_qkv_bwd.default", "tk.attention_qkv_fwd.default"])
    forward = "hopper.forward" if hopper else "portable.forward"
    assert calls[forward] == calls["portable.backward_into"] == 1 and calls["portable.backward"] == 0
    assert outs[0].shape == (B, T, H, D) and outs[0].is_contiguous()
    assert grads[0].shape == qkv.shape and grads[0].is_contiguous()
    ref_outs, ref_grads = _reference_grads(reference.attention_qkv, [qkv], 1)
    for got, want in zip(outs + list(grads), ref_outs + list(ref_grads)):
        assert _rel_err(got, want) < 2e-2


def test_attention_backward_without_a_backend_raises_on_the_fast_path(calls, monkeypatch):
    table = {"hopper": attention_op.Backend("hopper", lambda q, causal, scale: None,
                                            attention_hopper.backend_forward, None)}
    monkeypatch.setattr(attention_op, "BACKENDS", table)
    q = torch.randn(1, 2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    o = attention_op.attention(q, q, q)
    with pytest.raises(RuntimeError, match="no backend can run the backward pass"):
        o.sum().backward()


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_fast_path_without_grad(calls, mode):
    """Sampling: no graph is recorded, nothing is saved, the result is the same."""
    x = torch.randn(4, 64, requires_grad=True)
    w = torch.ones(64, requires_grad=True)
    with mode():
        y, h = layernorm.add_layernorm(x, x, w, None)
    assert y.grad_fn is None and not y.requires_grad and torch.equal(h, x.detach() + x.detach())
    assert torch.equal(y, layernorm.add_layernorm(x, x, w, None)[0].detach())
    assert calls["ln.forward"] == 2 and calls["ln.backward"] == 0


# ---- a real torch.compile takes the custom ops ---------------------------------------------------

class _Forbidden:
    @staticmethod
    def apply(*args):
        raise AssertionError("the eager fast path ran under torch.compile")


def _compiled_vs_eager(fn, args, leaves, monkeypatch, module, fast_classes):
    eager_outs, eager_grads, _, _ = _run(fn, args, leaves, compiling=False)
    for name in fast_classes:
        monkeypatch.setattr(module, name, _Forbidden)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    outs, grads, _, grad_fn = _run(compiled, args, leaves)
    assert grad_fn == "CompiledFunctionBackward", grad_fn   # one graph, compiled by aot_eager
    for a, b in zip(outs + list(grads), eager_outs + list(eager_grads)):
        assert torch.equal(a, b)


def test_mlp_fwd_refuses_fp32_weights_with_biases_or_alone(calls):
    """The custom op's fp32 weights (torch.compile's fp32-weight path) are refused at the forward,
    naming the problem, where they cannot be honoured: with biases, or one without the other."""
    C, H = 64, 192
    x = torch.randn(5, C, dtype=torch.bfloat16)
    w_fc, w_proj = torch.randn(H, C), torch.randn(C, H)
    b_fc = torch.zeros(H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="without biases"):
        mlp_op.mlp_fwd(x, w_fc.bfloat16(), b_fc, w_proj.bfloat16(), None, -1, w_fc, w_proj)
    with pytest.raises(ValueError, match="both fp32 weights"):
        mlp_op.mlp_fwd(x, w_fc.bfloat16(), None, w_proj.bfloat16(), None, -1, w_fc, None)
    with pytest.raises(ValueError, match="w_proj32 must be the fp32 weight"):
        mlp_op.mlp_fwd(x, w_fc.bfloat16(), None, w_proj.bfloat16(), None, -1, w_fc, w_proj.bfloat16())


def test_one_buffer_is_a_view_when_it_can_be_and_a_copy_otherwise():
    buf = torch.randn(5 * 3 + 3 * 5)
    a, b = buf[:15].view(5, 3), buf[15:].view(3, 5)              # as the extension's dw_float views
    flat = mlp_op._one_buffer(a, b)
    assert flat.data_ptr() == buf.data_ptr() and torch.equal(flat, buf)
    a2, b2 = mlp_op._split_dw(flat, a, b)
    assert torch.equal(a2, a) and torch.equal(b2, b) and a2.data_ptr() == a.data_ptr()
    apart = mlp_op._one_buffer(b, a)                               # b's storage does not follow a's end
    assert apart.data_ptr() not in (buf.data_ptr(), b.data_ptr())
    assert torch.equal(apart, torch.cat((b.reshape(-1), a.reshape(-1))))


def test_torch_compile_gives_fp32_weights_fp32_gradients(calls, monkeypatch):
    """Session 11: a real compile (aot_eager, fullgraph) of the MLP with fp32 weights under (patched)
    bf16 autocast takes the custom op with the fp32 weights beside their casts: the backward asks
    the kernel for fp32 weight gradients, and the results equal the eager fast path's bit for bit."""
    monkeypatch.setattr(mlp_op, "_autocast_bf16", lambda: True)
    xm = torch.randn(2, 3, 64, dtype=torch.bfloat16, requires_grad=True)
    w_fc = (torch.randn(128, 64) / 8).requires_grad_()
    w_proj = (torch.randn(64, 128) / 11).requires_grad_()
    _compiled_vs_eager(lambda x, a, b: mlp_op.mlp(x, a, None, b, None), (xm, w_fc, w_proj), (xm, w_fc, w_proj),
                       monkeypatch, mlp_op, ["_MLPEager"])
    assert calls["mlp.backward dw_float=True"] == calls["mlp.backward"] == 2, dict(calls)   # eager, compiled


@pytest.mark.parametrize("backend,env", [("aot_eager", "1"), ("aot_eager", "0"), ("inductor", "1")])
def test_compiled_mlp_fp32_gradients_accumulate_over_two_backwards(calls, monkeypatch, backend, env):
    """Review R (session 11): under a real compile the fp32 weight gradients come back as two views
    of one flat buffer (_split_dw); autograd may keep them as .grad. A second backward must add
    into them (gradient accumulation), each weight its own half, and a no-grad call of the same
    function must still run (the fp32 weights are passed, never read). TK_MLP_DW_FLOAT=0 alike."""
    monkeypatch.setattr(mlp_op, "_autocast_bf16", lambda: True)
    monkeypatch.setenv(mlp_op.DW_FLOAT_ENV, env)
    kernels.prepare_for_compile()
    torch._dynamo.reset()                                     # the env is read at trace time
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16, requires_grad=True)
    w_fc = (torch.randn(128, 64) / 8).requires_grad_()
    w_proj = (torch.randn(64, 128) / 11).requires_grad_()
    dys = [torch.randn(2, 3, 64, dtype=torch.bfloat16) for _ in range(2)]
    compiled = torch.compile(lambda x, a, b: mlp_op.mlp(x, a, None, b, None), backend=backend, fullgraph=True)
    alone = []                                                # each backward's gradients on their own
    for dy in dys:
        w_fc.grad = w_proj.grad = None
        compiled(x, w_fc, w_proj).backward(dy)
        alone.append((w_fc.grad.clone(), w_proj.grad.clone()))
    assert alone[0][0].dtype == alone[0][1].dtype == torch.float32
    assert torch.equal(alone[0][0], alone[0][0].bfloat16().float()) == (env == "0")   # fp32 sums, or bf16 widened
    w_fc.grad = w_proj.grad = None
    for dy in dys:                                            # accumulated: the first .grad may be a view of
        compiled(x, w_fc, w_proj).backward(dy)                # the kernel's buffer, which must stay its own
    assert torch.equal(w_fc.grad, alone[0][0] + alone[1][0]) and torch.equal(w_proj.grad, alone[0][1] + alone[1][1])
    assert calls[f"mlp.backward dw_float={env == '1'}"] == calls["mlp.backward"] == 4, dict(calls)
    with torch.no_grad():
        y = compiled(x, w_fc, w_proj)
    assert y.shape == x.shape and torch.isfinite(y.float()).all()
    assert calls["mlp.backward"] == 4
    torch._dynamo.reset()


def test_torch_compile_uses_the_custom_ops(calls, monkeypatch):
    x = torch.randn(2, 5, 64, requires_grad=True)
    r = torch.randn(2, 5, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    _compiled_vs_eager(lambda x, r, w: layernorm.add_layernorm(x, r, w, None), (x, r, w), (x, r, w),
                       monkeypatch, layernorm, ["_AddLayerNormEager", "_LayerNormEager"])
    assert calls["ln.forward"] == calls["ln.backward"] == 2   # eager once, compiled once

    xm = torch.randn(2, 3, 64, dtype=torch.bfloat16, requires_grad=True)
    w_fc = (torch.randn(128, 64) / 8).bfloat16().requires_grad_()
    w_proj = (torch.randn(64, 128) / 11).bfloat16().requires_grad_()
    _compiled_vs_eager(lambda x, a, b: mlp_op.mlp(x, a, None, b, None), (xm, w_fc, w_proj), (xm, w_fc, w_proj),
                       monkeypatch, mlp_op, ["_MLPEager"])
    assert calls["mlp.forward"] == calls["mlp.backward"] == 2

    monkeypatch.setattr(attention_op, "BACKENDS", _attention_backends(hopper=True))
    q = torch.randn(1, 2, 9, 64, dtype=torch.bfloat16, requires_grad=True)
    _compiled_vs_eager(lambda q: attention_op.attention(q, q * 0.5, q), (q,), (q,),
                       monkeypatch, attention_op, ["_AttentionEager"])
    assert calls["hopper.forward"] == calls["portable.backward"] == 2
    torch._dynamo.reset()


def test_device_capability_is_remembered(monkeypatch):
    asked = []
    monkeypatch.setattr(attention_op, "_capabilities", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or (9, 0))
    assert attention_op.device_capability(0) == attention_op.device_capability(0) == (9, 0)
    assert attention_op.device_capability(1) == (9, 0) and asked == [0, 1]


def test_registered_impls_are_the_public_ops():
    assert kernels._tk_impls["layernorm"][0] is layernorm.add_layernorm
    assert kernels._tk_impls["mlp"][0] is mlp_op.mlp
    assert kernels._tk_impls["attention"][0] is attention_op.attention
    assert kernels._tk_impls["linear"][0] is linear_op.linear

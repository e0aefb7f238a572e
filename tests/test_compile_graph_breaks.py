"""CPU tests: the whole GPT on the tk path compiles into ONE graph (no graph break, no recompile),
and the compiled step gives the eager step's loss and gradients.

No GPU and no build: every extension is replaced by tests/test_fast_path.py's fakes (plain torch
on CPU tensors, with the bindings' signatures), the CUDA-only part of the Python input checks is
off, and `kernels.checks.on_kernel_device` says True, so the REAL why_not checks of the three ops
run (and are traced by dynamo) on CPU tensors. The attention backends are stand-ins with the real
backends' shape: they ask `attention_op.device_capability` (its cache set to an sm_90 answer) and
the real `_build_reason` functions, everything the real ones do except torch.cuda.is_available(),
which cannot say True on a CPU-only torch (dynamo itself then asks for CUDA RNG state).

Two settings, as the model is run: a bf16 model, and fp32 parameters under bf16 autocast (the H200
runs: the layernorm then takes the fp32 residual stream beside a bf16 branch, the MLP casts the
fp32 weights). CPU autocast stands in for CUDA autocast, so the ops' `_autocast_bf16` is pointed at
the CPU autocast state. What this does not show: anything about speed, and anything inductor does
(aot_eager traces the same graph, fake tensors and custom ops, and runs it eagerly).
"""
import collections
import contextlib

import pytest
import torch

import kernels
from kernels import attention_hopper, attention_op, checks, gemm, layernorm, linear_op, lm_head_op, mlp_op
from model import GPT, GPTConfig
from test_fast_path import (FakeHopperAttentionExt, FakeLayerNormExt, FakeMLPExt, FakePortableAttentionExt,
                            _counted_cpu_check, _Forbidden)
from test_linear import FakeGemmExt
from test_lm_head import FakeLMHeadExt

CONFIG = dict(block_size=64, vocab_size=96, n_layer=2, n_head=2, n_embd=128, dropout=0.0, bias=True)
B, T = 2, 37                       # T odd: not a multiple of any tile
SETTINGS = ["bf16", "fp32_autocast"]


class FakeMixedLayerNormExt(FakeLayerNormExt):
    """FakeLayerNormExt with the bindings' keyword options: y_bf16 (y in bf16 under autocast) and
    residual_grad_bf16 (a bf16 copy of dh_out for a bf16 residual beside fp32 h)."""

    def forward(self, x, residual, weight, bias, eps, y_bf16=False):
        y, h, mean, rstd = super().forward(x, residual, weight, bias, eps)
        return [y.bfloat16() if y_bf16 else y, h, mean, rstd]

    def backward(self, dy, dh, h, mean, rstd, weight, residual_grad_bf16=False):
        dx, dw, db = super().backward(dy, dh, h, mean, rstd, weight)
        return [dx, dw, db] + ([dx.bfloat16()] if residual_grad_bf16 else [])


class WithoutAutocast:
    """A fake extension whose calls run with CPU autocast off, as a real kernel is untouched by
    autocast (the fakes' float32 matmuls would otherwise run in bf16, and lse come back bf16)."""

    def __init__(self, fake):
        self._fake = fake

    def __getattr__(self, name):
        method = getattr(self._fake, name)

        def call(*args, **kwargs):
            with torch.autocast("cpu", enabled=False):
                return method(*args, **kwargs)
        return call


def _hopper_why_not(q, causal, scale):
    """attention_hopper.backend_why_not without its torch.cuda.is_available()."""
    major, minor = attention_op.device_capability(q.device.index or 0)
    if (major, minor) != (9, 0):
        return f"needs an sm_90 (Hopper) GPU; this one is sm_{major}{minor}"
    return attention_hopper._build_reason()


def _portable_why_not(q, causal, scale):
    """attention_op._portable_why_not without its torch.cuda.is_available()."""
    major, minor = attention_op.device_capability(q.device.index or 0)
    if major < 8:
        return f"needs an sm_80 or newer GPU (mma.sync bf16); this one is sm_{major}{minor}"
    return attention_op._portable_build_reason()


def _cpu_autocast_bf16():
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.fixture
def tk_on_cpu(monkeypatch):
    """kernels=tk on CPU tensors: fakes installed, real why_not checks; returns the call counter."""
    calls = collections.Counter()
    monkeypatch.setattr(layernorm._ext, "_module", WithoutAutocast(FakeMixedLayerNormExt(calls)))
    monkeypatch.setattr(mlp_op._ext, "_module", WithoutAutocast(FakeMLPExt(calls)))
    monkeypatch.setattr(attention_op._portable, "_module", WithoutAutocast(FakePortableAttentionExt(calls)))
    monkeypatch.setattr(attention_hopper._ext, "_module", WithoutAutocast(FakeHopperAttentionExt(calls)))
    monkeypatch.setattr(lm_head_op._ext, "_module", WithoutAutocast(FakeLMHeadExt(calls)))
    monkeypatch.setattr(gemm._ext, "_module", WithoutAutocast(FakeGemmExt(calls)))   # the attention's linears
    monkeypatch.setattr(gemm, "_num_sms", lambda device: 132)
    for module, name in [(layernorm, "check_forward"), (layernorm, "check_backward"), (lm_head_op, "check_inputs"),
                         (mlp_op, "check_forward"), (mlp_op, "check_backward"),
                         (attention_op, "check_forward_inputs"), (attention_op, "check_backward_inputs"),
                         (attention_hopper, "check_inputs"), (gemm, "plan")]:
        _counted_cpu_check(monkeypatch, calls, module, name)
    monkeypatch.setattr(checks, "on_kernel_device", lambda t: True)
    monkeypatch.setattr(attention_op, "_capabilities", {0: (9, 0)})
    monkeypatch.setattr(attention_op, "_pinned", "auto")
    monkeypatch.setattr(attention_op, "BACKENDS", {
        "hopper": attention_op.Backend("hopper", _hopper_why_not, attention_hopper.backend_forward, None),
        "portable": attention_op.Backend("portable", _portable_why_not, attention_op._portable_forward,
                                         attention_op._portable_backward)})
    for module in (layernorm, mlp_op, lm_head_op, linear_op):
        monkeypatch.setattr(module, "_autocast_bf16", _cpu_autocast_bf16)
    kernels.configure("tk")
    kernels.reset_used()
    torch._dynamo.reset()
    yield calls
    kernels.configure("auto")
    kernels.reset_used()
    torch._dynamo.reset()


def _model_and_step(setting):
    """A fresh GPT (same weights every time) and step(net, idx, targets) -> loss, in `setting`."""
    torch.manual_seed(0)
    net = GPT(GPTConfig(**CONFIG))
    if setting == "bf16":
        net = net.to(torch.bfloat16)
    autocast = setting == "fp32_autocast"

    def step(fn, idx, targets):
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            _, loss = fn(idx, targets)
        return loss
    return net, step


def _batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, CONFIG["vocab_size"], (B, T), generator=gen),
            torch.randint(0, CONFIG["vocab_size"], (B, T), generator=gen))


def _forbid_fast_path(monkeypatch):
    """Under torch.compile the public ops must take the custom ops, never the eager fast path."""
    for module, name in [(layernorm, "_AddLayerNormEager"), (layernorm, "_LayerNormEager"),
                         (mlp_op, "_MLPEager"), (lm_head_op, "_LMHeadEager"), (attention_op, "_AttentionEager"),
                         (attention_op, "_AttentionQKVEager"), (linear_op, "_LinearEager")]:
        monkeypatch.setattr(module, name, _Forbidden)


# Per optimizer step of the 2-layer model: 2 layernorms per block + ln_f, one attention and one MLP
# per block, forward and backward each (the attention forward on the stand-in Hopper backend);
# the attention's two linears per block, one GEMM forward and two backward (dx, dW) each, and the
# LM head's logits (one chunk; on the tk GEMM by default since session 12): 2·2·3 + 1 GEMMs.
EXPECTED_CALLS = {"ln.forward": 5, "ln.backward": 5, "mlp.forward": 2, "mlp.backward": 2,
                  "hopper.forward": 2, "portable.backward_into": 2, "lm_head.grad": 1, "gemm.run": 13}


def _ext_calls(calls):
    return {name: calls[name] for name in EXPECTED_CALLS}


@pytest.mark.parametrize("setting", SETTINGS)
def test_explain_finds_no_graph_break_on_the_tk_path(tk_on_cpu, setting):
    net, step = _model_and_step(setting)
    idx, targets = _batch()
    explained = torch._dynamo.explain(lambda i, t: step(net, i, t))(idx, targets)
    reasons = [b.reason.splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons
    # the graph holds the tk custom ops, i.e. the real why_not checks said yes while traced
    ops_seen = {str(node.target) for g in explained.graphs for node in g.graph.nodes}
    tk_ops = {"tk.layernorm_fwd.default", "tk.add_layernorm_fwd.default", "tk.attention_qkv_fwd.default",
              "tk.mlp_fwd.default", "tk.lm_head_loss.default", "tk.linear_fwd.default"}
    assert tk_ops <= ops_seen, sorted(ops_seen)
    assert not any("scaled_dot_product" in op or "layer_norm" in op or "log_softmax" in op or "nll_loss" in op
                   for op in ops_seen), sorted(ops_seen)
    assert kernels.used() == {"attention": "tk", "layernorm": "tk", "mlp": "tk", "lm_head": "tk", "linear": "tk"}


def test_explain_finds_no_graph_break_when_auto_falls_back(monkeypatch, capsys):
    """kernels=auto on CPU tensors: every op falls back to torch. The fallback's one line per (op,
    reason) is printed when the call is traced; a traced print was a graph break per op."""
    monkeypatch.setattr(kernels, "_logged", set())
    kernels.configure("auto")
    kernels.reset_used()
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        net = GPT(GPTConfig(**CONFIG))
        idx, targets = _batch()
        explained = torch._dynamo.explain(lambda i, t: net(i, t)[1])(idx, targets)
        reasons = [b.reason.splitlines()[0] for b in explained.break_reasons]
        assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons
        assert kernels.used() == {"attention": "torch", "layernorm": "torch", "mlp": "torch", "lm_head": "torch",
                                  "linear": "torch"}
        lines = [line for line in capsys.readouterr().out.splitlines() if "falls back to torch" in line]
        assert sorted(line.split()[1] for line in lines) == ["attention", "layernorm", "linear", "lm_head", "mlp"], lines
    finally:
        kernels.reset_used()
        torch._dynamo.reset()


@pytest.mark.parametrize("setting", SETTINGS)
def test_fullgraph_compile_matches_eager(tk_on_cpu, monkeypatch, setting):
    """forward + backward, torch.compile(fullgraph=True, backend='aot_eager') against the eager tk
    path (the fast path, same fakes): the same loss and gradients, every extension called once per
    op and direction, and no recompile over three steps (the first compile is the only one)."""
    idx, targets = _batch()
    net, step = _model_and_step(setting)
    loss_eager = step(net, idx, targets)
    loss_eager.backward()
    grads_eager = {n: p.grad.clone() for n, p in net.named_parameters()}
    assert _ext_calls(tk_on_cpu) == EXPECTED_CALLS

    net, step = _model_and_step(setting)
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    _forbid_fast_path(monkeypatch)
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    kernels.reset_used()
    tk_on_cpu.clear()
    loss = step(compiled, idx, targets)
    assert type(loss.grad_fn).__name__ == "CompiledFunctionBackward"   # one graph, through AOT autograd
    loss.backward()
    assert _ext_calls(tk_on_cpu) == EXPECTED_CALLS
    assert kernels.used() == {"attention": "tk", "layernorm": "tk", "mlp": "tk", "lm_head": "tk", "linear": "tk"}

    assert loss.dtype == loss_eager.dtype and torch.isfinite(loss)
    assert abs(loss.item() - loss_eager.item()) <= 1e-6 * abs(loss_eager.item()), (loss.item(), loss_eager.item())
    for name, p in net.named_parameters():
        ge = grads_eager[name]
        assert p.grad is not None and p.grad.dtype == ge.dtype and torch.isfinite(p.grad).all(), name
        err = ((p.grad.double() - ge.double()).norm() / ge.double().norm()).item()
        assert err <= 1e-6, (name, err)

    # two more steps on other batches: the guards hold (error_on_recompile would raise)
    for seed in (2, 3):
        step(compiled, *_batch(seed)).backward()
    assert tk_on_cpu["ln.forward"] == 3 * EXPECTED_CALLS["ln.forward"]

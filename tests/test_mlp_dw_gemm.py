"""The MLP's weight gradients on cuBLAS (session 13, the default; TK_MLP_DW_GEMM=tk or
kernels.mlp_op.set_dw_gemm('tk') puts them back on the tk split-K GEMM): mlp_bindings.cpp's
weight_grad calls torch's mm with an fp32 out_dtype; the other four products stay on tk.

CPU: the setting's parsing and the start-up check. GPU (skip without CUDA): the gradients against a
float64 reference at awkward token counts, with and without biases, eager and under torch.compile;
that dx is bit-identical to the tk path's (only the weight gradients changed) and the weight
gradients agree with the tk path's to fp32 noise; that the switch really switches."""
import pytest
import torch
import torch.nn.functional as F
from conftest import mlp_training_inputs, rel_err

from kernels import mlp_op

C, H = 768, 3072
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---- CPU: the setting ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, on", [("tk", False), ("cublas", True), (" CUBLAS ", True), ("Tk", False)])
def test_parse_dw_gemm_accepts_the_two_names(name, on):
    assert mlp_op.parse_dw_gemm(name) is on


@pytest.mark.parametrize("name", ["", "cublass", "torch", "1"])
def test_parse_dw_gemm_refuses_anything_else_naming_the_choices(name):
    with pytest.raises(ValueError, match=r"TK_MLP_DW_GEMM=.*one of tk, cublas"):
        mlp_op.parse_dw_gemm(name)


def test_preflight_refuses_a_bad_setting_before_any_step(monkeypatch):
    monkeypatch.setenv(mlp_op.DW_GEMM_ENV, "cuBLASLt")
    with pytest.raises(ValueError, match="TK_MLP_DW_GEMM='cuBLASLt'"):
        mlp_op.preflight(768, torch.bfloat16, "cpu")


# ---- GPU: the gradients -------------------------------------------------------------------------

@pytest.fixture
def dw_gemm():
    """Sets the weight-gradient GEMM for one test, then puts cuBLAS back (the default)."""
    yield mlp_op.set_dw_gemm
    mlp_op.set_dw_gemm("cublas")


def make(M, seed, bias=False):
    return mlp_training_inputs(M, seed, bias, C, H)


def reference_grads(x, w_fc, b_fc, w_proj, b_proj, dy):
    """float64 gradients of (x, w_fc, w_proj) for y = gelu_tanh(x·w_fcᵀ + b_fc)·w_projᵀ + b_proj."""
    xs = x.detach().double().requires_grad_()
    wf, wp = (w.detach().double().requires_grad_() for w in (w_fc, w_proj))
    bf, bp = (None if b is None else b.detach().double() for b in (b_fc, b_proj))
    y = F.linear(F.gelu(F.linear(xs, wf, bf), approximate="tanh"), wp, bp)
    y.backward(dy.double())
    return xs.grad, wf.grad, wp.grad


def run(x, w_fc, b_fc, w_proj, b_proj, dy, fn=None):
    x = x.detach().requires_grad_()
    for t in (w_fc, b_fc, w_proj, b_proj):
        if t is not None:
            t.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = (fn or mlp_op.mlp)(x, w_fc, b_fc, w_proj, b_proj)
    y.backward(dy)
    return x.grad, w_fc.grad.clone(), w_proj.grad.clone()


@cuda
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M", [1, 333, 4099])
def test_cublas_weight_gradients_match_float64_and_the_tk_path(M, bias, dw_gemm):
    x, w_fc, b_fc, w_proj, b_proj, dy = make(M, seed=M + bias, bias=bias)
    dw_gemm("tk")
    tk = run(x, w_fc, b_fc, w_proj, b_proj, dy)
    dw_gemm("cublas")
    assert mlp_op._module().get_dw_on_cublas()
    cub = run(x, w_fc, b_fc, w_proj, b_proj, dy)
    ref = reference_grads(x, w_fc, b_fc, w_proj, b_proj, dy)
    assert torch.equal(cub[0], tk[0])                  # dx does not depend on the dW products
    for got, other, want in zip(cub[1:], tk[1:], ref[1:]):
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert rel_err(got, want) < 1e-2
        # two fp32 sums in different orders; with biases both are rounded to bf16 (the cast path),
        # where that noise flips a few roundings
        assert rel_err(got, other) < (4e-3 if bias else 1e-5)
    if not bias:   # fp32 sums, straight from cuBLAS (not bf16 values widened)
        assert not torch.equal(cub[2], cub[2].bfloat16().float())


@cuda
def test_cublas_is_the_default_and_the_environment_variable_selects_tk(monkeypatch, dw_gemm):
    monkeypatch.delenv(mlp_op.DW_GEMM_ENV, raising=False)
    monkeypatch.setattr(mlp_op, "_dw_env_checked", False)
    dw_gemm("cublas")
    assert mlp_op._module().get_dw_on_cublas()
    monkeypatch.setenv(mlp_op.DW_GEMM_ENV, "tk")
    monkeypatch.setattr(mlp_op, "_dw_env_checked", False)
    assert not mlp_op._module().get_dw_on_cublas()
    dw_gemm("cublas")
    assert mlp_op._module().get_dw_on_cublas()         # an explicit choice wins over the environment


@cuda
def test_compiled_mlp_with_cublas_weight_gradients(dw_gemm):
    """torch.compile (inductor) of the public op under autocast, GPT-2's form (no biases)."""
    import kernels
    dw_gemm("cublas")
    kernels.prepare_for_compile()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, a, b_fc, b, b_proj: mlp_op.mlp(x, a, None, b, None))
    x, w_fc, _, w_proj, _, dy = make(4099, seed=11)
    got = run(x, w_fc, None, w_proj, None, dy, fn=compiled)
    eager = run(x, w_fc, None, w_proj, None, dy)
    ref = reference_grads(x, w_fc, None, w_proj, None, dy)
    for g, e, want in zip(got, eager, ref):
        assert torch.isfinite(g).all()
        assert rel_err(g, want) < 1e-2
        assert rel_err(g, e) < 1e-5

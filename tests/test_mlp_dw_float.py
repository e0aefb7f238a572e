"""GPU tests (skip without CUDA) of the MLP's fp32 weight gradients (session 10, lead):
under bf16 autocast with fp32 weights and no biases (GPT-2's training), kernels/mlp_op.py hands
the fp32 weights to its autograd Function, which casts them inside, and the extension's backward
returns dw_fc and dw_proj in fp32 straight from its split-K sums (mlp_bindings.cpp, dw_float):
no finish kernel, no bf16 round trip. TK_MLP_DW_FLOAT=0 restores the casts outside.

Checked here: the gradients against a float64 reference at awkward token counts; that they are
fp32 and not bf16-rounded (the path was taken) and agree with the old path's to bf16 rounding;
accumulation over two backward calls; models with biases keep the old path; the extension
refuses dw_float with bias gradients. Session 11: the same under torch.compile (inductor), where
the custom op gets the fp32 weights beside their bf16 casts."""
import pytest
import torch
import torch.nn.functional as F
from conftest import mlp_training_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

C, H = 768, 3072


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def reference_grads(x, w_fc, w_proj, dy):
    """float64 gradients of w_fc and w_proj for y = gelu_tanh(x·w_fcᵀ)·w_projᵀ."""
    xs = x.detach().double()
    wf, wp = (w.detach().double().requires_grad_() for w in (w_fc, w_proj))
    y = F.gelu(xs @ wf.T, approximate="tanh") @ wp.T
    y.backward(dy.double())
    return wf.grad, wp.grad


def make(M, seed, bias=False):
    return mlp_training_inputs(M, seed, bias, C, H)


def run(x, w_fc, b_fc, w_proj, b_proj, dy):
    from kernels import mlp_op
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = mlp_op.mlp(x, w_fc, b_fc, w_proj, b_proj)
    y.backward(dy)
    return y


@pytest.mark.parametrize("M", [1, 333, 4099])
def test_fp32_weight_gradients_match_float64(M, monkeypatch):
    from kernels import mlp_op
    monkeypatch.setenv(mlp_op.DW_FLOAT_ENV, "1")
    x, w_fc, _, w_proj, _, dy = make(M, seed=M)
    run(x, w_fc, None, w_proj, None, dy)
    ref_fc, ref_proj = reference_grads(x, w_fc, w_proj, dy)
    for got, want in ((w_fc.grad, ref_fc), (w_proj.grad, ref_proj)):
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert rel_err(got, want) < 1e-2
    # fp32 sums, not bf16 values widened (the old path's gradients are all bf16-representable)
    assert not torch.equal(w_proj.grad, w_proj.grad.bfloat16().float())


def test_fp32_path_agrees_with_the_cast_path(monkeypatch):
    from kernels import mlp_op
    grads = {}
    for env in ("1", "0"):
        monkeypatch.setenv(mlp_op.DW_FLOAT_ENV, env)
        x, w_fc, _, w_proj, _, dy = make(2048 + 17, seed=7)
        run(x, w_fc, None, w_proj, None, dy)
        grads[env] = (w_fc.grad, w_proj.grad)
    for new, old in zip(grads["1"], grads["0"]):
        assert torch.equal(old, old.bfloat16().float())      # the old path: bf16 gradients widened
        assert rel_err(new, old) < 4e-3                      # the same sums, before that rounding


def test_gradients_accumulate_over_two_backward_calls(monkeypatch):
    from kernels import mlp_op
    monkeypatch.setenv(mlp_op.DW_FLOAT_ENV, "1")
    x, w_fc, _, w_proj, _, dy = make(1000, seed=3)
    x2, _, _, _, _, dy2 = make(1000, seed=4)
    run(x, w_fc, None, w_proj, None, dy)
    run(x2, w_fc, None, w_proj, None, dy2)
    a_fc, a_proj = reference_grads(x, w_fc, w_proj, dy)
    b_fc, b_proj = reference_grads(x2, w_fc, w_proj, dy2)
    assert rel_err(w_fc.grad, a_fc + b_fc) < 1e-2
    assert rel_err(w_proj.grad, a_proj + b_proj) < 1e-2


def test_models_with_biases_keep_the_cast_path(monkeypatch):
    from kernels import mlp_op
    monkeypatch.setenv(mlp_op.DW_FLOAT_ENV, "1")
    x, w_fc, b_fc, w_proj, b_proj, dy = make(517, seed=5, bias=True)
    run(x, w_fc, b_fc, w_proj, b_proj, dy)
    for t in (w_fc, b_fc, w_proj, b_proj):
        assert t.grad.dtype == torch.float32 and torch.isfinite(t.grad).all()
        assert torch.equal(t.grad, t.grad.bfloat16().float())   # bf16 gradients, cast back by autograd


def test_extension_refuses_dw_float_with_bias_gradients():
    from kernels import mlp_op
    M = 64
    x = torch.randn(M, C, device="cuda").bfloat16()
    w_fc = (torch.randn(H, C, device="cuda") * 0.02).bfloat16()
    w_proj = (torch.randn(C, H, device="cuda") * 0.02).bfloat16()
    _, pre, h = mlp_op._ext_forward(x, w_fc, None, w_proj, None)
    dy = torch.randn(M, C, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="dw_float"):
        mlp_op._ext_backward(dy, x, pre, h, w_fc, w_proj, True, -1, dw_float=True)


@pytest.mark.parametrize("env", ["1", "0"])
def test_compiled_mlp_gives_fp32_gradients(env, monkeypatch):
    """torch.compile (inductor) of the public op under autocast: with TK_MLP_DW_FLOAT=1 the weight
    gradients are the kernels' fp32 sums (not bf16 values widened), within 1e-2 of float64 and
    within fp32 noise of the eager path's; with 0, bf16 gradients widened, as before."""
    import kernels
    from kernels import mlp_op
    monkeypatch.setenv(mlp_op.DW_FLOAT_ENV, env)
    kernels.prepare_for_compile()
    torch._dynamo.reset()                      # the env is read at trace time
    compiled = torch.compile(lambda x, a, b: mlp_op.mlp(x, a, None, b, None))
    x, w_fc, _, w_proj, _, dy = make(4099, seed=11)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = compiled(x, w_fc, w_proj)
    y.backward(dy)
    got = (w_fc.grad.clone(), w_proj.grad.clone())
    w_fc.grad = w_proj.grad = None
    run(x, w_fc, None, w_proj, None, dy)       # the eager fast path, same env
    ref = reference_grads(x, w_fc, w_proj, dy)
    for g, eager, want in zip(got, (w_fc.grad, w_proj.grad), ref):
        assert g.dtype == torch.float32 and torch.isfinite(g).all()
        assert rel_err(g, want) < 1e-2
        # the same kernels, split-K sums in another order: fp32 noise, or with env 0 that noise
        # flipping a few bf16 roundings (the H200: 1.01e-5 there)
        assert rel_err(g, eager) < (1e-5 if env == "1" else 4e-3)
        assert torch.equal(g, g.bfloat16().float()) == (env == "0")
    torch._dynamo.reset()

"""tk attention: the portable kernel against a float64 reference (GPU), and the dispatch rules (CPU).

GPU tests skip without CUDA. Every GPU case draws fresh random q, k, v, dO as strided views of one
(B, T, 3, H, D) tensor (what the model's c_attn produces), scaled so the logits are large (std
about 6, so the softmax is peaked), and poisons the memory the kernel's outputs will land in
before each run (see `poison`), so an element the kernel forgets to write shows up as NaN.
Tolerances are relative Frobenius-norm errors: bf16 outputs land near 4e-3.
"""
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kernels  # noqa: E402
from kernels import attention_op as A  # noqa: E402
from conftest import rel_err  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BACKEND = os.environ.get("TK_ATTENTION_TEST_BACKEND", "portable")


@pytest.fixture(autouse=True)
def _switch():
    old = kernels.choice()
    yield
    kernels.configure(old["attention"], old["attention"], old["layernorm"], old["mlp"])
    A.set_backend("auto")


def qkv_views(B, H, T, D, sigma=2.5, seed=0, requires_grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(B, T, 3, H, D, device="cuda", generator=g)
    qkv[:, :, :2] *= sigma                    # q and k: logits scale * q.k have std sigma^2
    qkv = qkv.to(torch.bfloat16).requires_grad_(requires_grad)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)      # (B, H, T, D) views, strides (T3HD, D, 3HD, 1)
    return qkv, q, k, v


def reference(q, k, v, causal, scale, grad_out=None):
    """float64 attention (and its gradients if grad_out is given) on the same bf16 inputs."""
    q64, k64, v64 = (t.detach().double().requires_grad_(grad_out is not None) for t in (q, k, v))
    s = scale * q64 @ k64.transpose(-1, -2)
    if causal:
        T = q.shape[2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ v64
    grads = None
    if grad_out is not None:
        grads = torch.autograd.grad(o, (q64, k64, v64), grad_out.double())
    return o.detach(), lse.detach(), grads


def poison(B, H, T, D):
    """Fill the caching allocator's free blocks of the sizes the kernel allocates with NaN, so
    the outputs (taken with at::empty inside the bindings) start out as NaN, not as zeros."""
    sizes = [B * H * T * D] + [2 * B * H * T] + [2 * B * H * T * D]  # in bf16 elements: o/dq/dk/dv, lse/rowsum, dq_accum
    blocks = [torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16) for n in sizes for _ in range(3)]
    del blocks


def assert_grads_close(qkv_grad, T, dq_ref, dk_ref, dv_ref):
    """The packed (B, T, 3, H, D) gradient against the float64 one: dv always; with one key
    (T == 1) softmax is 1 and dq = dk = 0 exactly, so only their size can be checked."""
    dq, dk, dv = qkv_grad.permute(2, 0, 3, 1, 4)
    assert rel_err(dv, dv_ref) < 2e-2
    if T == 1:
        assert dq.abs().max() < 1e-2 and dk.abs().max() < 1e-2
    else:
        assert rel_err(dq, dq_ref) < 2e-2 and rel_err(dk, dk_ref) < 2e-2


CASES = [  # (B, H, T, D, causal)
    (1, 1, 1, 64, True), (2, 3, 17, 64, True), (1, 2, 64, 64, True), (2, 1, 255, 64, True),
    (1, 3, 256, 64, True), (1, 2, 1000, 64, True), (2, 2, 1024, 64, True), (1, 1, 4096, 64, True),
    (1, 1, 1, 128, True), (1, 2, 17, 128, True), (2, 1, 255, 128, True), (1, 2, 256, 128, True),
    (1, 1, 1000, 128, True), (1, 2, 1024, 128, True),
    (1, 2, 17, 64, False), (2, 1, 255, 64, False), (1, 1, 1000, 128, False), (1, 2, 64, 128, False),
]


@cuda
@pytest.mark.parametrize("B,H,T,D,causal", CASES)
def test_forward_backward_vs_float64(B, H, T, D, causal):
    A.set_backend(BACKEND)
    try:
        qkv, q, k, v = qkv_views(B, H, T, D, seed=T * D + B, requires_grad=True)
        scale = 1.0 / math.sqrt(D)
        grad_out = torch.randn(B, H, T, D, device="cuda").to(torch.bfloat16)
        o_ref, lse_ref, (dq_ref, dk_ref, dv_ref) = reference(q, k, v, causal, scale, grad_out)

        poison(B, H, T, D)
        o, lse = A.attention_fwd(q, k, v, causal, scale, BACKEND, BACKEND)
        assert o.shape == (B, H, T, D) and o.dtype == torch.bfloat16 and lse.shape == (B, H, T)
        assert rel_err(o, o_ref) < 1e-2
        assert rel_err(lse, lse_ref) < 1e-4

        poison(B, H, T, D)
        o.backward(grad_out)
        assert_grads_close(qkv.grad, T, dq_ref, dk_ref, dv_ref)
    finally:
        A.set_backend("auto")


@cuda
@pytest.mark.parametrize("public", [True, False], ids=["fast_path", "custom_op"])
@pytest.mark.parametrize("backend", [BACKEND, "auto"])
@pytest.mark.parametrize("B,H,T,D,causal", [(1, 1, 1, 64, True), (2, 3, 17, 64, True), (2, 1, 255, 64, True),
                                            (1, 2, 1000, 64, True), (1, 2, 17, 128, True), (2, 1, 255, 128, True),
                                            (1, 2, 300, 64, False)])
def test_packed_qkv_forward_backward_vs_float64(B, H, T, D, causal, backend, public):
    # attention_qkv: the model's call. The backward writes dq, dk, dv into the slices of one
    # (B, T, 3, H, D) gradient, so qkv.grad is that tensor itself: contiguous, poisoned first.
    A.set_backend(backend)
    qkv, q, k, v = qkv_views(B, H, T, D, seed=T * D + B + 7, requires_grad=True)
    scale = 1.0 / math.sqrt(D)
    grad_y = torch.randn(B, T, H, D, device="cuda").to(torch.bfloat16)
    o_ref, _, (dq_ref, dk_ref, dv_ref) = reference(q, k, v, causal, scale, grad_y.transpose(1, 2))
    poison(B, H, T, D)
    if public:
        y = A.attention_qkv(qkv, causal=causal)                                   # (B, T, H, D)
    else:
        fwd, bwd = (A._choose(q, causal, scale, d)[0] for d in ("forward", "backward"))
        o, _ = A.attention_qkv_fwd(qkv, causal, scale, fwd, bwd)
        y = o.transpose(1, 2)
    assert y.shape == (B, T, H, D) and y.is_contiguous()
    assert rel_err(y.transpose(1, 2), o_ref) < 1e-2
    for _ in range(3):   # the gradient buffer is the size of qkv: poison that size too
        torch.full((3 * B * T * H * D,), float("nan"), device="cuda", dtype=torch.bfloat16)
    y.backward(grad_y)
    assert qkv.grad.is_contiguous() and qkv.grad.shape == qkv.shape
    assert_grads_close(qkv.grad, T, dq_ref, dk_ref, dv_ref)


@cuda
def test_packed_qkv_opcheck():
    qkv, q, _, _ = qkv_views(2, 2, 33, 64, requires_grad=True)
    name, _ = A._choose(q, True, 0.125, "forward")
    bwd, _ = A._choose(q, True, 0.125, "backward")
    torch.library.opcheck(A.attention_qkv_fwd, (qkv, True, 0.125, name, bwd))
    o, lse = A.attention_qkv_fwd(qkv.detach(), True, 0.125, name, bwd)
    g = torch.randn_like(o)
    torch.library.opcheck(A.attention_qkv_bwd, (g, qkv.detach(), o, lse, True, 0.125, bwd))


@cuda
@pytest.mark.parametrize("variant", ["0", "1", "2", "3"])
@pytest.mark.parametrize("B,H,T,D,causal", [(2, 3, 1000, 64, True), (1, 2, 255, 128, True), (1, 2, 300, 64, False)])
def test_forward_block_shape_variants(monkeypatch, variant, B, H, T, D, causal):
    # TK_ATTENTION_FWD_VARIANT picks the forward's block shape (read by the launcher per call).
    monkeypatch.setenv("TK_ATTENTION_FWD_VARIANT", variant)
    _, q, k, v = qkv_views(B, H, T, D, seed=int(variant) + T)
    scale = 1.0 / math.sqrt(D)
    o_ref, lse_ref, _ = reference(q, k, v, causal, scale)
    poison(B, H, T, D)
    o, lse = A.attention_fwd(q, k, v, causal, scale, BACKEND, BACKEND)
    assert rel_err(o, o_ref) < 1e-2
    assert rel_err(lse, lse_ref) < 1e-4


@cuda
@pytest.mark.parametrize("B,H,T,D,causal", [(2, 3, 1000, 64, True), (1, 2, 255, 128, True), (2, 1, 300, 64, False),
                                            (1, 1, 200, 128, False)])
def test_backward_block_shape_variant(monkeypatch, B, H, T, D, causal):
    # TK_ATTENTION_BWD_VARIANT=0: 4 warps, 64 keys per block (the default is 8 warps, 128 keys).
    monkeypatch.setenv("TK_ATTENTION_BWD_VARIANT", "0")
    qkv, q, k, v = qkv_views(B, H, T, D, seed=T + 11, requires_grad=True)
    scale = 1.0 / math.sqrt(D)
    grad_out = torch.randn(B, H, T, D, device="cuda").to(torch.bfloat16)
    _, _, (dq_ref, dk_ref, dv_ref) = reference(q, k, v, causal, scale, grad_out)
    o, _ = A.attention_fwd(q, k, v, causal, scale, BACKEND, BACKEND)
    poison(B, H, T, D)
    o.backward(grad_out)
    dq, dk, dv = qkv.grad.permute(2, 0, 3, 1, 4)
    assert rel_err(dq, dq_ref) < 2e-2 and rel_err(dk, dk_ref) < 2e-2 and rel_err(dv, dv_ref) < 2e-2


# Session 7's backward variants (attention_portable.cu): 2 = 1 + K/V fragments in registers,
# 3 (the default) = 2 + the prep kernel (memset fused into the row sums) and the wide dQ
# conversion; D = 128 runs 1's main kernel. Every T of the issue, D 64 and 128, causal and not,
# outputs and dq_accum poisoned, vs float64. (Variants 1 and 3 also run through the tests above:
# 3 as the default, 1 here.)
S7_CASES = [(1, 1, 1, 64, True), (2, 3, 17, 64, True), (1, 2, 64, 64, True), (2, 1, 255, 64, True),
            (1, 3, 256, 64, True), (1, 2, 1000, 64, True), (2, 2, 1024, 64, True), (1, 1, 4096, 64, True),
            (1, 2, 17, 128, True), (1, 1, 1000, 128, True), (2, 1, 300, 64, False), (1, 2, 1024, 64, False),
            (1, 1, 255, 128, False)]


@cuda
@pytest.mark.parametrize("variant", ["1", "2", "3"])
@pytest.mark.parametrize("B,H,T,D,causal", S7_CASES)
def test_session7_backward_variants(monkeypatch, variant, B, H, T, D, causal):
    monkeypatch.setenv("TK_ATTENTION_BWD_VARIANT", variant)
    qkv, q, k, v = qkv_views(B, H, T, D, seed=int(variant) * 5 + T + D + B, requires_grad=True)
    scale = 1.0 / math.sqrt(D)
    grad_out = torch.randn(B, H, T, D, device="cuda").to(torch.bfloat16)
    _, _, (dq_ref, dk_ref, dv_ref) = reference(q, k, v, causal, scale, grad_out)
    o, _ = A.attention_fwd(q, k, v, causal, scale, BACKEND, BACKEND)
    poison(B, H, T, D)   # dq_accum too: variant 3 zeroes it in its own row-sum kernel
    o.backward(grad_out)
    torch.cuda.synchronize()
    assert not qkv.grad.isnan().any()
    assert_grads_close(qkv.grad, T, dq_ref, dk_ref, dv_ref)


@cuda
@pytest.mark.parametrize("fwd,bwd", [("3", "3"), ("1", "2")])
def test_session7_variants_under_cuda_graph(monkeypatch, fwd, bwd):
    # The launcher reads the variant at capture time; replays must keep producing the same result
    # on new inputs written into the captured buffers (variant 3's kernel 1 re-zeroes dq_accum).
    monkeypatch.setenv("TK_ATTENTION_FWD_VARIANT", fwd)
    monkeypatch.setenv("TK_ATTENTION_BWD_VARIANT", bwd)
    B, H, T, D = 2, 3, 333, 64
    scale = 1.0 / math.sqrt(D)
    _, q, k, v = qkv_views(B, H, T, D, seed=21)
    q, k, v = (t.contiguous() for t in (q, k, v))
    g = torch.randn(B, H, T, D, device="cuda").to(torch.bfloat16)
    ext = A._portable.module
    o, lse = ext.forward(q, k, v, True, scale)   # warm up outside the capture
    ext.backward(g, q, k, v, o, lse, True, scale)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, lse_g = ext.forward(q, k, v, True, scale)
        dq_g, dk_g, dv_g = ext.backward(g, q, k, v, o_g, lse_g, True, scale)
    for seed in (1, 2):
        _, q2, k2, v2 = qkv_views(B, H, T, D, seed=100 + seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        graph.replay()
        torch.cuda.synchronize()
        o_ref, _, (dq_ref, dk_ref, dv_ref) = reference(q, k, v, True, scale, g)
        assert rel_err(o_g, o_ref) < 1e-2
        assert rel_err(dq_g, dq_ref) < 2e-2 and rel_err(dk_g, dk_ref) < 2e-2 and rel_err(dv_g, dv_ref) < 2e-2


# Session 7 (P2): forward variants 9 and 10 (attention_portable.cu, attention_forward_split_kernel:
# the diagonal tiles as their own code path, interleaved row tiles; 9 = 128-key cp.async stages,
# 10 = 64-key stages; D = 64, D = 128 runs variant 0). 9 is D = 64's default since session 8. Every T of the
# issue plus T around the 64/128-row seams (65, 127, 129, 191, 250), causal and full, poisoned
# outputs, vs float64; o and lse also vs variant 3's (the same arithmetic in another order of
# tiles: close, not bitwise); and the backward on their o and lse.
S7P2_CASES = [(1, 1, 1, 64, True), (2, 3, 17, 64, True), (1, 2, 64, 64, True), (1, 1, 65, 64, True),
              (1, 2, 127, 64, True), (1, 1, 129, 64, True), (1, 1, 191, 64, True), (1, 1, 250, 64, True),
              (2, 1, 255, 64, True), (1, 3, 256, 64, True), (1, 2, 1000, 64, True), (2, 2, 1024, 64, True),
              (1, 1, 4096, 64, True), (2, 1, 17, 64, False), (1, 1, 64, 64, False), (1, 2, 129, 64, False),
              (1, 1, 191, 64, False), (2, 1, 1000, 64, False), (1, 2, 255, 128, True), (1, 1, 200, 128, False)]


@cuda
@pytest.mark.parametrize("variant", ["9", "10"])
@pytest.mark.parametrize("B,H,T,D,causal", S7P2_CASES)
def test_session7_p2_forward_variants(monkeypatch, variant, B, H, T, D, causal):
    qkv, q, k, v = qkv_views(B, H, T, D, seed=int(variant) * 7 + T + D + B, requires_grad=True)
    scale = 1.0 / math.sqrt(D)
    grad_out = torch.randn(B, H, T, D, device="cuda").to(torch.bfloat16)
    o_ref, lse_ref, (dq_ref, dk_ref, dv_ref) = reference(q, k, v, causal, scale, grad_out)
    monkeypatch.setenv("TK_ATTENTION_FWD_VARIANT", "3")
    o3, lse3 = A.attention_fwd(q.detach(), k.detach(), v.detach(), causal, scale, BACKEND, BACKEND)
    monkeypatch.setenv("TK_ATTENTION_FWD_VARIANT", variant)
    poison(B, H, T, D)
    o, lse = A.attention_fwd(q, k, v, causal, scale, BACKEND, BACKEND)
    torch.cuda.synchronize()
    assert not o.isnan().any() and not lse.isnan().any()
    assert rel_err(o, o_ref) < 1e-2
    assert rel_err(lse, lse_ref) < 1e-4
    assert rel_err(o, o3) < 1e-2 and rel_err(lse, lse3) < 1e-5
    poison(B, H, T, D)
    o.backward(grad_out)
    assert_grads_close(qkv.grad, T, dq_ref, dk_ref, dv_ref)


@cuda
@pytest.mark.parametrize("fwd", ["9", "10"])
def test_session7_p2_forward_variants_under_cuda_graph(monkeypatch, fwd):
    # The launcher reads the variant at capture time; replays on new inputs keep matching float64.
    monkeypatch.setenv("TK_ATTENTION_FWD_VARIANT", fwd)
    B, H, T, D = 2, 3, 333, 64
    scale = 1.0 / math.sqrt(D)
    _, q, k, v = qkv_views(B, H, T, D, seed=23)
    q, k, v = (t.contiguous() for t in (q, k, v))
    ext = A._portable.module
    ext.forward(q, k, v, True, scale)   # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, lse_g = ext.forward(q, k, v, True, scale)
    for seed in (1, 2):
        _, q2, k2, v2 = qkv_views(B, H, T, D, seed=200 + seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        o_g.fill_(float("nan")), lse_g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        o_ref, lse_ref, _ = reference(q, k, v, True, scale)
        assert rel_err(o_g, o_ref) < 1e-2 and rel_err(lse_g, lse_ref) < 1e-4


@cuda
def test_explicit_scale_and_contiguous_inputs():
    B, H, T, D = 2, 2, 300, 64
    _, q, k, v = qkv_views(B, H, T, D, sigma=1.0, seed=7)
    q, k, v = (t.contiguous() for t in (q, k, v))   # plain (B, H, T, D) strides too
    o = A.attention(q, k, v, causal=True, scale=0.3)
    o_ref, _, _ = reference(q, k, v, True, 0.3)
    assert rel_err(o, o_ref) < 1e-2


@cuda
def test_unaligned_strides_are_copied_not_refused():
    # head_dim not contiguous (a transposed view): the Python wrapper makes a contiguous copy.
    B, H, T, D = 1, 2, 65, 64
    _, q, k, v = qkv_views(B, H, T, D, sigma=1.0, seed=3)
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert qt.stride(-1) != 1
    o = A.attention(qt, k, v)
    o_ref, _, _ = reference(q, k, v, True, 1 / 8)
    assert rel_err(o, o_ref) < 1e-2


@cuda
def test_output_layout_makes_the_model_reshape_free():
    _, q, k, v = qkv_views(2, 3, 40, 64, seed=1)
    o = A.attention(q, k, v)
    assert o.transpose(1, 2).is_contiguous()   # (B, T, H, D) memory: reshape(B, T, C) is a view


@cuda
def test_opcheck():
    _, q, k, v = qkv_views(1, 2, 70, 64, seed=4, requires_grad=True)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(A.attention_fwd, (q, k, v, True, 0.125, BACKEND, BACKEND))
    o, lse = A.attention_fwd(q, k, v, True, 0.125, BACKEND, BACKEND)
    g = torch.randn_like(o)
    torch.library.opcheck(A.attention_bwd, (g, q.detach(), k.detach(), v.detach(), o.detach(), lse, True, 0.125, BACKEND))


@cuda
def test_torch_compile_of_a_module_using_it():
    class Attn(torch.nn.Module):
        def __init__(self, C=128, H=2):
            super().__init__()
            self.c_attn, self.H = torch.nn.Linear(C, 3 * C), H

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
            return kernels.attention(q, k, v, causal=True).transpose(1, 2).reshape(B, T, C)

    kernels.configure("tk")
    A.set_backend(BACKEND)
    torch.manual_seed(0)
    m = Attn().cuda().to(torch.bfloat16)
    x = torch.randn(2, 77, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y_eager = m(x)
    y_eager.float().square().sum().backward()
    g_eager = x.grad.clone()
    x.grad = None
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    y.float().square().sum().backward()
    A.set_backend("auto")
    assert rel_err(y, y_eager.double()) < 1e-6
    assert rel_err(x.grad, g_eager.double()) < 1e-6


@cuda
@pytest.mark.parametrize("backend", ["portable", "auto"])   # auto: the Hopper forward on sm_90
def test_model_loss_and_grads_tk_vs_torch(backend):
    import model as M
    cfg = M.GPTConfig(block_size=128, vocab_size=256, n_layer=2, n_head=2, n_embd=128, dropout=0.0, bias=True)
    idx = torch.randint(0, 256, (4, 100), device="cuda")
    results = {}
    A.set_backend(backend)
    for choice in ("torch", "tk"):
        kernels.configure("torch", attention=choice)
        kernels.reset_used()
        torch.manual_seed(0)
        net = M.GPT(cfg).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = net(idx, idx)
        loss.backward()
        assert kernels.used()["attention"] == choice
        results[choice] = (loss.item(), {n: p.grad.double() for n, p in net.named_parameters() if p.grad is not None})
    A.set_backend("auto")
    (loss_t, grads_t), (loss_k, grads_k) = results["torch"], results["tk"]
    assert abs(loss_t - loss_k) < 1e-2 * abs(loss_t)
    for name, g in grads_t.items():
        assert rel_err(grads_k[name], g) < 3e-2, name


# Bad inputs straight into the backend (past the switch's why_not), run in a child process: on
# the H200 two earlier versions of the bindings crashed the process while raising from C++ (see
# kernels/attention_bindings.cpp), and a crash must fail a test, not end the test run.
# CALL = "A._portable_forward" checks through the bindings' check_forward (raised in Python);
# CALL = "ext.forward" raises from C++ (TORCH_CHECK_VALUE), the path that crashed before.
BAD_INPUTS = r"""
import sys, torch
sys.path.insert(0, REPO)
from kernels import attention_op as A
qkv = torch.randn(1, 32, 3, 2, 64, device="cuda").to(torch.bfloat16)
q, k, v = qkv.permute(2, 0, 3, 1, 4)
ext = A._portable.module
fwd = eval(CALL)
bwd = A._portable_backward if CALL.startswith("A.") else ext.backward
lse_half = torch.zeros(1, 2, 32, device="cuda", dtype=torch.half)
cases = [
    ("k must be bfloat16", lambda: fwd(q, k.half(), v, True, 0.125)),
    ("v has shape (1, 2, 16, 64) but q has (1, 2, 32, 64)", lambda: fwd(q, k, v[:, :, :16], True, 0.125)),
    ("q must be a CUDA tensor", lambda: fwd(q.cpu(), k, v, True, 0.125)),
    ("head_dim of q is 32", lambda: fwd(q[..., :32], k[..., :32], v[..., :32], True, 0.125)),
    ("k must be contiguous in its last", lambda: fwd(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v, True, 0.125)),
    ("16-byte boundary", lambda: fwd(q, k, v.as_strided(v.shape, (v.stride(0), v.stride(1), v.stride(2) - 4, 1)), True, 0.125)),
    ("scale must be a finite positive number", lambda: fwd(q, k, v, True, float("nan"))),
    ("lse must be float32", lambda: bwd(q, q, k, v, q, lse_half, True, 0.125)),
]
for expected, call in cases:
    try:
        call()
        print("NO ERROR for:", expected)
    except ValueError as e:
        print(("ok: " if expected in str(e) else "WRONG MESSAGE: ") + str(e).splitlines()[0])
    sys.stdout.flush()
"""


@cuda
@pytest.mark.parametrize("call", ["A._portable_forward", "ext.forward"])
def test_bad_inputs_give_clear_errors(call):
    import subprocess
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", f"REPO = {repo!r}\nCALL = {call!r}\n" + BAD_INPUTS],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith(("ok:", "NO ERROR", "WRONG"))]
    assert out.returncode == 0, f"child process died (rc {out.returncode}) after:\n{out.stdout}\n{out.stderr[-2000:]}"
    assert len(lines) == 8 and all(line.startswith("ok:") for line in lines), out.stdout


@cuda
def test_bad_inputs_through_the_switch():
    _, q, k, v = qkv_views(1, 2, 32, 64, seed=2)
    kernels.configure("tk")
    with pytest.raises(kernels.KernelUnavailable, match="float32"):
        kernels.attention(q.float(), k.float(), v.float())
    with pytest.raises(kernels.KernelUnavailable, match="dropout"):
        kernels.attention(q, k, v, dropout_p=0.1)


# ---- CPU: dispatch rules (run everywhere) ------------------------------------------------------

def cpu_qkv(D=64, dtype=torch.bfloat16):
    q = torch.randn(1, 2, 5, D, dtype=dtype)
    return q, q.clone(), q.clone()


def test_why_not_reasons():
    q, k, v = cpu_qkv()
    assert "needs CUDA" in A.why_not(q, k, v)
    assert "dropout" in A.why_not(q, k, v, dropout_p=0.1)
    if torch.cuda.is_available():
        q, k, v = (t.cuda() for t in cpu_qkv(D=96))
        assert "head_dim 96" in A.why_not(q, k, v)
        q, k, v = (t.cuda() for t in cpu_qkv(dtype=torch.float32))
        assert "float32" in A.why_not(q, k, v)
        q, k, v = (t.cuda() for t in cpu_qkv())
        assert "shapes differ" in A.why_not(q, k[:, :, :3], v)
        assert "scale" in A.why_not(q, k, v, scale=-1.0)


def test_switch_auto_falls_back_and_tk_refuses_on_cpu():
    q, k, v = cpu_qkv()
    kernels.configure("auto")
    kernels.reset_used()
    out = kernels.attention(q, k, v, causal=True)
    assert kernels.used()["attention"] == "torch" and out.shape == q.shape
    kernels.configure("tk")
    with pytest.raises(kernels.KernelUnavailable, match="needs CUDA"):
        kernels.attention(q, k, v, causal=True)


def test_preflight_reasons():
    assert "needs CUDA" in A.preflight(8, 256, 384, 6, torch.bfloat16, "cpu")
    assert "attn_dropout" in A.preflight(8, 256, 384, 6, torch.bfloat16, "cuda", attn_dropout=0.2)
    assert "bfloat16" in A.preflight(8, 256, 384, 6, torch.float16, "cuda")
    assert "head size" in A.preflight(8, 256, 384, 4, torch.bfloat16, "cuda")   # 96


def test_backend_table_order_and_pinning():
    saved = dict(A.BACKENDS)
    try:
        A.register_backend(A.Backend("fast", lambda q, c, s: "not on this GPU", forward=lambda *a: None), prefer=True)
        assert list(A.BACKENDS)[0] == "fast"
        q = torch.empty(1, 1, 1, 64, device="cuda" if torch.cuda.is_available() else "cpu")
        name, reason = A._choose(q, True, 0.125, "forward")
        if torch.cuda.is_available():
            assert name in ("hopper", "portable")   # "fast" declined, the next one runs
        else:
            assert name is None and "fast: not on this GPU" in reason and "portable: no CUDA" in reason
        with pytest.raises(ValueError, match="unknown attention backend"):
            A.set_backend("nope")
        A.set_backend("fast")
        # a pinned forward-only backend borrows the backward of another backend
        assert A._choose(q, True, 0.125, "forward") == (None, "fast: not on this GPU")
        name, reason = A._choose(q, True, 0.125, "backward")
        if torch.cuda.is_available():   # the next backend with a backward that takes q
            assert name in ("hopper", "portable")
        else:
            assert name is None and "portable: no CUDA" in reason
    finally:
        A.set_backend("auto")
        A.BACKENDS.clear()
        A.BACKENDS.update(saved)


def test_packed_qkv_dispatch_and_reference():
    # The packed call follows the attention switch, runs the reference where tk cannot run, and
    # the reference computes attention on the q, k, v slices, returned as (B, T, H, D).
    B, T, H, D = 2, 9, 3, 64
    qkv = torch.randn(B, T, 3, H, D, dtype=torch.float64)
    kernels.configure("torch")
    kernels.reset_used()
    y = kernels.attention_qkv(qkv, causal=True)
    assert y.shape == (B, T, H, D) and kernels.used()["attention"] == "torch"
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(y, (torch.softmax(s, -1) @ v).transpose(1, 2), atol=1e-12)
    assert "needs CUDA" in A.why_not_qkv(qkv.to(torch.bfloat16))
    assert "(batch, seq, 3, heads, head_dim)" in A.why_not_qkv(q)
    if not torch.cuda.is_available():
        kernels.configure("tk")
        with pytest.raises(kernels.KernelUnavailable, match="kernels_attention=tk.*needs CUDA"):
            kernels.attention_qkv(qkv.to(torch.bfloat16))

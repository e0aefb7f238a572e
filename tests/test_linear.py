"""Tests of the linear op (kernels/linear_op.py: the attention's c_attn and c_proj on the tk GEMM).

CPU (run everywhere): the tk Python half with a fake GEMM extension (FakeGemmExt below: the
binding's `run` in plain torch, operands read with the layouts gemm.py passes) against a float64
F.linear: forward and gradients with and without bias, 3-D x, token counts that are not a multiple
of 16 (dW's reduction then runs on zero-padded rows), bf16 and fp32 (autocast-style) parameters;
the eager fast path and the custom-op path bit-identical; with an fp32 weight (training), the
weight cast once and dW stored by the GEMM in fp32 (the casts counted below autograd); FORWARD =
"cublas" (y on torch.mm, dx and dW on the GEMM); the plan each product gets at GPT-2's shapes;
the switch (kernels_linear, `auto`'s fallback line on CPU, `tk`'s error); the why_not reasons;
the model's loss with kernels=torch equal to nn.Linear's.

GPU (skipped without a Hopper GPU): the real kernels against float64 at GPT-2's c_attn and c_proj
shapes and at tails, forward and backward, bias and no bias, outputs poisoned with NaN first;
autocast with fp32 parameters at 32k tokens (dW within 1e-4 of float64); FORWARD = "cublas" (not
yet run on a GPU); opcheck of the custom ops with bf16 and fp32 weights; the model's loss and
gradients on the tk linear vs kernels=torch. No timing here (the lead's bench --e2e does that).
"""
import collections
import contextlib

import pytest
import torch
import torch.nn.functional as F

import kernels
from conftest import rel_err, use_cpu_checks
from kernels import checks, gemm, linear_op
from test_fast_path import OpLog

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
gpu = pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")


# ---- CPU: the Python half with a fake GEMM ------------------------------------------------------

class FakeGemmExt:
    """gemm_bindings.cpp's run(step, a, b, c, a_mn_major, b_mn_major, bias, gelu, splits, variant)
    in plain torch: a is [M][K], or [K][M] storage when a_mn_major; b is [N][K], or [K][N] when
    b_mn_major; c (M, N) is written (splits == 1) or reduce-added into (fp32, splits > 1). The
    product is taken in float64 and rounded once to c's dtype, as a kernel with an fp32
    accumulator would (up to the accumulator's own rounding)."""

    def __init__(self, calls):
        self.calls = calls
        self.seen = []   # (step, variant, a_mn_major, b_mn_major, splits, (M, K, N)) per call
        self.out_dtypes = []   # c's dtype per call

    def run(self, step, a, b, c, a_mn_major, b_mn_major, bias, gelu, splits, variant):
        self.calls["gemm.run"] += 1
        assert a.dtype == b.dtype == torch.bfloat16 and a.is_contiguous() and b.is_contiguous()
        A = a.t() if a_mn_major else a          # (M, K)
        B = b if b_mn_major else b.t()          # (K, N)
        M, K, N = A.shape[0], A.shape[1], B.shape[1]
        assert K % 16 == 0 and N % 16 == 0 and c.shape == (M, N), (A.shape, B.shape, c.shape)
        self.seen.append((step, variant, a_mn_major, b_mn_major, splits, (M, K, N)))
        self.out_dtypes.append(c.dtype)
        acc = A.double() @ B.double()
        if bias is not None:
            acc = acc + bias.double()
        if gelu:
            acc = F.gelu(acc, approximate="tanh")
        if splits > 1:
            c.add_(acc.to(c.dtype))
        else:
            c.copy_(acc.to(c.dtype))


def install_fake_gemm(monkeypatch, calls):
    """The fake extension behind gemm.matmul, gemm's checks with cuda=False and a 132-SM device
    (an H200's count, so the plans are the H200's). Returns the fake."""
    fake = FakeGemmExt(calls)
    monkeypatch.setattr(gemm._ext, "_module", fake)
    use_cpu_checks(monkeypatch, gemm, "plan")
    monkeypatch.setattr(gemm, "_num_sms", lambda device: 132)
    return fake


@pytest.fixture
def fake_gemm(monkeypatch):
    calls = collections.Counter()
    return install_fake_gemm(monkeypatch, calls)


def _inputs(lead, K, N, bias, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, K, generator=g).to(torch.bfloat16).requires_grad_()   # activations: bf16 (or cast)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(N, generator=g)).to(dtype).requires_grad_() if bias else None
    dy = torch.randn(*lead, N, generator=g)
    return x, w, b, dy


def _float64(x, w, b, dy):
    """F.linear in float64 on the bf16-rounded inputs (what the GEMM sees): y, dx, dW, db."""
    leaves = [None if t is None else t.detach().to(torch.bfloat16).double().requires_grad_() for t in (x, w, b)]
    y = F.linear(*leaves)
    y.backward(dy.to(torch.bfloat16).double())
    return [y.detach()] + [None if t is None else t.grad for t in leaves]


def _run(x, w, b, dy, compiling):
    log = OpLog()
    with pytest.MonkeyPatch.context() as patch, log:
        patch.setattr(torch.compiler, "is_compiling", lambda: compiling)
        y = linear_op.linear(x, w, b)
        leaves = [t for t in (x, w, b) if t is not None]
        grads = torch.autograd.grad(y, leaves, dy.to(y.dtype))
    return y.detach(), grads, log.tk_ops(), y.grad_fn


# M = 3*7 = 21 and 1*5 = 5 tokens (not multiples of 16: dW on padded rows), 2*16 = 32 (dy read in place)
@pytest.mark.parametrize("lead", [(3, 7), (1, 5), (2, 16)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
def test_fake_gemm_path_matches_float64(fake_gemm, lead, bias, param_dtype):
    K, N = 64, 96
    x, w, b, dy = _inputs(lead, K, N, bias, param_dtype, seed=sum(lead))
    results = {}
    for compiling in (False, True):
        fake_gemm.calls.clear()
        y, grads, tk_ops, grad_fn = _run(x, w, b, dy, compiling)
        results[compiling] = [y, *grads]
        assert fake_gemm.calls["gemm.run"] == 3   # y, dx, dW
        if compiling:
            assert tk_ops == ["tk.linear_bwd.default", "tk.linear_fwd.default"], tk_ops
        else:
            assert tk_ops == [], tk_ops
    for a, c in zip(results[False], results[True]):     # fast path == custom-op path, bit for bit
        assert a.dtype == c.dtype and a.shape == c.shape and torch.equal(a, c)
    y, *grads = results[False]
    assert y.shape == (*lead, N) and y.dtype == torch.bfloat16
    # fp32 parameters get fp32 gradients (through the cast, as under autocast), bf16 ones bf16
    assert [g.dtype for g in grads] == [t.dtype for t in (x, w, b) if t is not None]
    want = [t for t in _float64(x, w, b, dy) if t is not None]
    for name, got, ref in zip(["y", "dx", "dW", "db"], [y, *grads], want):
        assert got.shape == ref.shape, name
        assert rel_err(got, ref) < 1e-2, name     # bf16 output rounding ~3e-3; a wrong product ~1


def test_products_read_in_place_and_pad_only_tails(fake_gemm):
    """Which layouts the three products hand the kernel: W and dy are read in place (W.t() for y,
    W for dx, dy.t() for dW); with a token tail, dW's reduction gets a zero-padded copy."""
    for M, padded in ((32, 32), (21, 32)):
        fake_gemm.seen.clear()
        x, w, _, dy = _inputs((M,), 64, 96, False, torch.bfloat16)
        y = linear_op.linear(x, w)
        y.backward(dy.bfloat16())
        (fwd, dx, dw) = fake_gemm.seen
        assert fwd[3] is False and fwd[5] == (M, 64, 96)           # B = W.t(): W's rows as stored
        assert dx[3] is True and dx[5] == (M, 96, 64)              # B = W as stored (N-major)
        assert dw[5] == (96, padded, 64) and dw[2] is True         # A = dy.t() (or its padded copy's) in place


def test_fp32_weight_cast_once_and_dw_stored_in_fp32(fake_gemm):
    """Training's case (fp32 weight under autocast, bf16 activations): the eager path casts the
    weight to bf16 once (in the forward; the backward reuses that copy) and the GEMM stores dW
    directly in fp32, so no cast kernel follows it. The custom-op path casts once more in its
    backward (a custom op saves only its inputs) and stores dW in fp32 too."""
    x, w, _, dy = _inputs((2, 16), 64, 96, False, torch.float32)
    for compiling in (False, True):
        fake_gemm.out_dtypes.clear()
        y, (dx, dw), _, _ = _run(x, w, None, dy, compiling)
        assert fake_gemm.out_dtypes == [torch.bfloat16, torch.bfloat16, torch.float32], fake_gemm.out_dtypes
        assert dw.dtype == torch.float32 and dx.dtype == torch.bfloat16
    # the casts between fp32 and bf16, counted below autograd (the fake GEMM's own float64 casts
    # are not counted): eager 1 (the forward's); the custom-op path 0 outside its two ops (a
    # custom op shows as one op: its casts are inside it, and no cast of dW follows it)
    for compiling, casts in ((False, 1), (True, 0)):
        log, dy16 = CastLog(), dy.to(torch.bfloat16)
        with pytest.MonkeyPatch.context() as patch, log:
            patch.setattr(torch.compiler, "is_compiling", lambda: compiling)
            y = linear_op.linear(x, w)
            torch.autograd.grad(y, (x, w), dy16)
        assert log.casts == [(torch.float32, torch.bfloat16, (96, 64))] * casts, (compiling, log.casts)


class CastLog(OpLog):
    """OpLog that also records every dtype conversion between fp32 and bf16: (from, to, shape)."""
    def __init__(self):
        super().__init__()
        self.casts = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        pair = {torch.float32, torch.bfloat16}
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (src is not None and isinstance(out, torch.Tensor) and src.dtype != out.dtype
                and {src.dtype, out.dtype} == pair):
            self.casts.append((src.dtype, out.dtype, tuple(out.shape)))
        return out


@pytest.mark.parametrize("bias", [False, True])
def test_cublas_forward_keeps_the_tk_backward(fake_gemm, monkeypatch, bias):
    """FORWARD = "cublas": y on torch.mm / addmm, dx and dW still on the tk GEMM (dW in fp32);
    both paths bit-identical, every result within bf16 rounding of float64."""
    monkeypatch.setattr(linear_op, "FORWARD", "cublas")
    x, w, b, dy = _inputs((3, 7), 64, 96, bias, torch.float32, seed=5)
    results = {}
    for compiling in (False, True):
        fake_gemm.out_dtypes.clear()
        y, grads, _, _ = _run(x, w, b, dy, compiling)
        assert fake_gemm.out_dtypes == [torch.bfloat16, torch.float32], fake_gemm.out_dtypes   # dx, dW only
        results[compiling] = [y, *grads]
    for a, c in zip(results[False], results[True]):
        assert a.dtype == c.dtype and torch.equal(a, c)
    y, *grads = results[False]
    assert y.dtype == torch.bfloat16 and grads[1].dtype == torch.float32
    want = [t for t in _float64(x, w, b, dy) if t is not None]
    for name, got, ref in zip(["y", "dx", "dW", "db"], [y, *grads], want):
        assert rel_err(got, ref) < 1e-2, name


@pytest.mark.parametrize("M", [16384, 32768])
def test_plans_at_gpt2_shapes(M):
    """The kernels gemm.auto_step picks for the attention's linears at 16k and 32k tokens (GPT-2,
    B=16 / 32, T=1024; the e2e step is B=32): plain epilogue, step 4 v8 for y and dx; for dW (fp32
    out, the weight's dtype in training) step 5 v10 (the planned schedule, session 8) where the
    output has >= SMs/2 128x128 tiles (c_attn's 2304x768), else step 5 v7 (split-K; c_proj's
    768x768). With a bias the forward takes the fused-bias kernel (step 5 v1, K <= 1024)."""
    C = 768
    x, dy_attn, dy_proj = (torch.empty(M, n, dtype=torch.bfloat16) for n in (C, 3 * C, C))
    w_attn, w_proj = torch.empty(3 * C, C, dtype=torch.bfloat16), torch.empty(C, C, dtype=torch.bfloat16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemm, "_num_sms", lambda device: 132)
        def plan(a, b, **kw):
            return gemm.plan(a, b, step=0, cuda=False, **kw)
        for w, dy, dw_variant in ((w_attn, dy_attn, 10), (w_proj, dy_proj, 7)):
            assert plan(x, w.t())[:4] == (4, 8, False, "t")
            assert plan(dy, w)[:4] == (4, 8, False, "c")
            for out_dtype in (torch.bfloat16, torch.float32):
                p = plan(dy.t(), x, out_dtype=out_dtype)
                assert (p.step, p.variant, p.a_t) == (5, dw_variant, True) and p.splits >= 1
        assert plan(x, w_attn.t(), bias=torch.empty(3 * C, dtype=torch.bfloat16))[:2] == (5, 1)


def test_why_not_reasons(monkeypatch):
    monkeypatch.setattr(linear_op, "_build_reason", lambda: None)
    bf = dict(dtype=torch.bfloat16)
    x, w = torch.randn(5, 64, **bf), torch.randn(96, 64, **bf)
    assert "needs CUDA" in linear_op.why_not(x, w)
    monkeypatch.setattr(checks, "on_kernel_device", lambda t: True)
    assert linear_op.why_not(x, w) is None and linear_op.why_not(x, w, torch.randn(96, **bf)) is None
    assert "bfloat16" in linear_op.why_not(x.float(), w)
    assert "weight is torch.float32" in linear_op.why_not(x, w.float())
    assert "multiples of 16" in linear_op.why_not(torch.randn(5, 40, **bf), torch.randn(96, 40, **bf))
    assert "multiples of 16" in linear_op.why_not(x, torch.randn(100, 64, **bf))
    assert "shapes do not match" in linear_op.why_not(x, torch.randn(96, 32, **bf))
    assert "bias has shape" in linear_op.why_not(x, w, torch.randn(95, **bf))
    assert "empty" in linear_op.why_not(x[:0], w)
    assert "floating-point" in linear_op.why_not(x, w.to(torch.int32))
    # under bf16 autocast, fp32 tensors are fine (the op casts them, as F.linear would)
    monkeypatch.setattr(linear_op, "_autocast_bf16", lambda: True)
    assert linear_op.why_not(x.float(), w.float(), torch.randn(96)) is None


def test_preflight_reasons(monkeypatch):
    assert "needs CUDA" in linear_op.preflight(n_embd=768, dtype=torch.bfloat16, device="cpu")
    monkeypatch.setattr(gemm, "why_not", lambda: None)
    assert "bfloat16" in linear_op.preflight(n_embd=768, dtype=torch.float32, device="cuda")
    assert "multiple of 16" in linear_op.preflight(n_embd=40, dtype=torch.bfloat16, device="cuda")
    assert linear_op.preflight(n_embd=768, dtype=torch.bfloat16, device="cuda") is None


# ---- CPU: the switch ------------------------------------------------------------------------------

@pytest.fixture
def switch(monkeypatch):
    monkeypatch.setattr(kernels, "_logged", set())
    kernels.reset_used()
    yield
    kernels.configure("auto")
    kernels.reset_used()


def test_switch_plumbing(switch):
    assert "linear" in kernels.OPS and kernels._tk_impls["linear"][0] is linear_op.linear
    assert kernels.configure("torch", linear="tk")["linear"] == "tk"
    assert kernels.configure("tk", linear="torch") == {op: "tk" if op != "linear" else "torch" for op in kernels.OPS}
    with pytest.raises(ValueError, match="kernels_linear='fast'"):
        kernels.configure("auto", linear="fast")


def test_auto_falls_back_on_cpu_with_one_line(switch, capsys):
    kernels.configure("auto")
    x, w = torch.randn(2, 3, 64), torch.randn(96, 64)
    b = torch.randn(96)
    for _ in range(2):
        y = kernels.linear(x, w, b)
    assert torch.equal(y, F.linear(x, w, b)) and kernels.used()["linear"] == "torch"
    assert capsys.readouterr().out.splitlines() == [
        "kernels: linear falls back to torch (x is on cpu; the tk kernel needs CUDA tensors)"]


def test_tk_choice_raises_on_cpu(switch):
    kernels.configure("torch", linear="tk")
    with pytest.raises(kernels.KernelUnavailable, match="kernels_linear=tk.*needs CUDA.*--kernels_linear=torch"):
        kernels.linear(torch.randn(4, 64), torch.randn(96, 64))
    with pytest.raises(kernels.KernelUnavailable, match="kernels_linear=tk"):
        kernels.preflight(4, 32, 128, 4, torch.bfloat16, "cpu")


def test_train_and_sample_have_the_setting():
    import sample
    import train
    # off unless asked: the session 6 final check timed the GPT-2 step slower with it (NOTES)
    assert train.DEFAULTS["kernels_linear"] == "torch" and sample.DEFAULTS["kernels_linear"] == "torch"


@pytest.mark.parametrize("bias", [True, False])
def test_model_reference_path_is_nn_linear(switch, bias):
    """kernels=torch: the model's attention linears are exactly nn.Linear's (F.linear), so the
    loss and gradients are bit for bit those of calling the modules (what model.py did before)."""
    from model import GPT, GPTConfig
    kernels.configure("torch")
    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=64, dropout=0.0, bias=bias)
    idx = torch.randint(0, 64, (2, 19), generator=torch.Generator().manual_seed(0))
    results = []
    for through_modules in (False, True):
        torch.manual_seed(0)
        net = GPT(cfg)
        with pytest.MonkeyPatch.context() as patch:
            if through_modules:   # route kernels.linear to the nn.Linear module owning the weight
                owners = {m.weight: m for m in net.modules() if isinstance(m, torch.nn.Linear)}
                patch.setattr(kernels, "linear", lambda x, w, b=None: owners[w](x))
            _, loss = net(idx, idx)
            loss.backward()
        results.append((loss.detach(), [p.grad for p in net.parameters()]))
    (l0, g0), (l1, g1) = results
    assert torch.equal(l0, l1) and all(torch.equal(a, c) for a, c in zip(g0, g1))
    assert kernels.used()["linear"] == "torch"


# ---- GPU: the real kernels against float64 --------------------------------------------------------

def poison_allocator(*sizes):
    """Freed blocks of these sizes (bytes) filled with NaN, so an element a kernel forgets to write
    reads NaN (the caching allocator hands the same blocks to the next allocations)."""
    junk = [torch.full((n // 2 + 64,), float("nan"), device="cuda", dtype=torch.bfloat16) for n in sizes for _ in range(2)]
    del junk


@pytest.fixture(scope="module")
def built():
    reason = gemm.why_not()
    assert reason is None, reason   # on a Hopper machine the GEMM extension must build


def _gpu_inputs(lead, K, N, bias, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)
    x = rnd(*lead, K).to(torch.bfloat16)
    w = rnd(N, K, scale=K ** -0.5)
    b = rnd(N, scale=0.5) if bias else None
    dy = rnd(*lead, N).to(torch.bfloat16)
    return x, w, b, dy


# GPT-2's c_attn (768 -> 2304) and c_proj (768 -> 768) at 16k tokens (B=16, T=1024), and tails:
# odd token counts (1, 77, 3*333), sampling's one token, and a width that is not a multiple of 64
GPU_SHAPES = [((16, 1024), 768, 2304), ((16, 1024), 768, 768), ((3, 333), 768, 2304), ((1, 77), 768, 768),
              ((1, 1), 768, 2304), ((5, 19), 1600, 4800), ((2, 1000), 80, 48)]
TOL = 1e-2   # bf16 output rounding puts y, dx, dW at ~3e-3; a wrong tile or a missing bias ~1


@gpu
@pytest.mark.parametrize("lead,K,N", GPU_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_forward_backward_vs_float64(built, lead, K, N, bias):
    x, w, b, dy = _gpu_inputs(lead, K, N, bias, seed=K + N + lead[1])
    want = _float64(x, w, b, dy)
    M = x.numel() // K
    poison_allocator(2 * M * N, 2 * M * K, 4 * N * K, 2 * N * K, 4 * M * K)
    leaves = [None if t is None else t.clone().requires_grad_() for t in (x, w, b)]
    y = linear_op.linear(*leaves)
    assert y.shape == (*lead, N) and y.dtype == torch.bfloat16
    y.backward(dy)
    got = [y.detach()] + [None if t is None else t.grad for t in leaves]
    for name, g, r in zip(["y", "dx", "dW", "db"], got, want):
        if r is None:
            continue
        assert g.shape == r.shape, name
        assert rel_err(g, r) < TOL, (name, rel_err(g, r))   # rel_err fails on NaN (an unwritten element)


@gpu
@pytest.mark.parametrize("lead,K,N,bias", [((4, 129), 768, 2304, True),
                                          ((32, 1024), 768, 2304, False), ((32, 1024), 768, 768, False),
                                          ((3, 333), 768, 768, False)])
def test_gpu_autocast_fp32_parameters(built, lead, K, N, bias):
    """Training's case: fp32 parameters and activations under bf16 autocast, at the e2e step's
    32k tokens (c_attn's dW on step 5 v10, c_proj's on 5 v7, both storing fp32) and tails; y bf16,
    gradients in the parameters' dtype as F.linear under autocast gives them, dW now unrounded."""
    x, w, b, dy = _gpu_inputs(lead, K, N, bias, dtype=torch.float32, seed=7 + N + lead[1])
    x = x.float()
    want = _float64(x, w, b, dy)
    M = x.numel() // K
    poison_allocator(2 * M * N, 2 * M * K, 4 * N * K, 2 * N * K, 4 * M * K)
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert linear_op.why_not(*leaves) is None
        y = linear_op.linear(*leaves)
    y.backward(dy)
    assert y.dtype == torch.bfloat16 and [t.grad.dtype for t in leaves] == [torch.float32] * len(leaves)
    got = [y.detach()] + [t.grad for t in leaves]
    for name, g, r in zip(["y", "dx", "dW", "db"], got, [t for t in want if t is not None]):
        assert rel_err(g, r) < TOL, (name, rel_err(g, r))
    # dW is stored from the fp32 sums, not rounded to bf16: far closer than bf16's ~3e-3
    assert rel_err(got[2], want[2]) < 1e-4, rel_err(got[2], want[2])


@gpu
@pytest.mark.parametrize("lead,K,N,bias", [((32, 1024), 768, 2304, False), ((3, 333), 768, 768, True)])
def test_gpu_cublas_forward(built, monkeypatch, lead, K, N, bias):
    """FORWARD = "cublas" (y on cuBLAS, dx and dW on tk) under autocast with fp32 parameters."""
    monkeypatch.setattr(linear_op, "FORWARD", "cublas")
    x, w, b, dy = _gpu_inputs(lead, K, N, bias, dtype=torch.float32, seed=11 + N)
    want = [t for t in _float64(x, w, b, dy) if t is not None]
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = linear_op.linear(*leaves)
    y.backward(dy)
    got = [y.detach()] + [t.grad for t in leaves]
    assert y.dtype == torch.bfloat16 and got[2].dtype == torch.float32
    for name, g, r in zip(["y", "dx", "dW", "db"], got, want):
        assert rel_err(g, r) < TOL, (name, rel_err(g, r))


@gpu
def test_gpu_dispatch_uses_tk(built):
    kernels.reset_used()
    x, w, b, _ = _gpu_inputs((2, 64), 768, 768, False)
    try:
        kernels.configure("auto")
        y = kernels.linear(x, w, b)
        assert kernels.used()["linear"] == "tk"
        assert rel_err(y, F.linear(x.double(), w.double())) < TOL
    finally:
        kernels.reset_used()


@gpu
def test_gpu_opcheck(built):
    x, w, b, dy = _gpu_inputs((3, 50), 768, 2304, True)
    x = x.reshape(-1, 768)                  # the custom ops take 2-D x; linear() flattens before calling them
    for weight in (w, w.float()):           # bf16, or fp32 (training: cast inside, dW stored in fp32)
        for bias in (b, None):
            torch.library.opcheck(linear_op.linear_fwd, (x, weight, bias))
        torch.library.opcheck(linear_op.linear_bwd, (dy.reshape(-1, 2304), x, weight, True))


@gpu
def test_gpu_model_loss_and_grads_vs_torch(built):
    """A small GPT under bf16 autocast: the tk linear vs kernels=torch for the attention's linears
    only (the other ops on torch in both runs): the same loss and gradients up to bf16 rounding."""
    from model import GPT, GPTConfig
    cfg = GPTConfig(block_size=128, vocab_size=512, n_layer=2, n_head=4, n_embd=256, dropout=0.0, bias=False)
    idx = torch.randint(0, 512, (4, 101), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    out = {}
    try:
        for how in ("torch", "tk"):
            kernels.configure("torch", linear=how)
            kernels.reset_used()
            torch.manual_seed(0)
            net = GPT(cfg).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = net(idx, idx)
            loss.backward()
            assert kernels.used()["linear"] == how
            out[how] = loss.item(), {n: p.grad.double() for n, p in net.named_parameters()}
    finally:
        kernels.configure("auto")
        kernels.reset_used()
    (l_ref, g_ref), (l_tk, g_tk) = out["torch"], out["tk"]
    assert abs(l_tk - l_ref) < 2e-3 * abs(l_ref), (l_tk, l_ref)
    for name, g in g_tk.items():
        assert rel_err(g, g_ref[name]) < 3e-2, name

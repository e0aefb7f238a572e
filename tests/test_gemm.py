"""GPU tests of the GEMM steps (kernels/gemm_<n>_*.cu) against torch.matmul in fp32.

Every step at non-square shapes, M tails and GPT-2's shapes, the three products of a linear
layer (y = x·Wᵀ, dx = dy·W, dW = dyᵀ·x), bf16 and fp32 outputs, poisoned outputs, step 4's
fused epilogue and split-K, and the errors for bad shapes. Skips without CUDA (CI). Timing is
in kernels/gemm_bench.py, not here.
"""
import pytest
import torch
from conftest import rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

if torch.cuda.is_available():
    from kernels import gemm


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


@pytest.fixture(scope="module", autouse=True)
def built():
    reason = gemm.why_not()
    assert reason is None, reason   # on a GPU machine the extension must build


# Step 5 (ping-pong, kernels/gemm_5_pingpong.cuh) runs every test step 4 runs; step 0 (auto:
# 4 or 5 by shape) the forward ones. GEMM_TEST_STEPS=0,5 (say) keeps only those steps' cases of
# the per-step tests (a GPU script with little time; every test without a step runs as always).
import os
_only = {int(s) for s in os.environ.get("GEMM_TEST_STEPS", "").split(",") if s.strip()}


def steps(*wanted):
    return [pytest.param(s, marks=pytest.mark.skipif(bool(_only) and s not in _only, reason="GEMM_TEST_STEPS"))
            for s in wanted]


STEP5 = steps(5)

TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-3}   # rel. norm error; bf16 output rounding is ~3e-3

SMALL = [(128, 64, 256), (1, 16, 16), (77, 48, 272), (1000, 320, 528), (300, 1024, 96), (4096, 4096, 4096)]
GPT2 = [(16384, 768, 3072), (16384, 3072, 768), (16384, 768, 2304), (16384, 768, 768)]


@pytest.mark.parametrize("step", steps(0, 1, 2, 3, 4) + STEP5)
@pytest.mark.parametrize("M,K,N", SMALL + GPT2)
def test_forward_xWt(step, M, K, N):
    x, W = randn(M, K), randn(N, K)
    ref = x.float() @ W.float().t()
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)   # poisoned
        c = gemm.matmul(x, W.t(), step=step, out_dtype=dtype, out=out)
        assert c.data_ptr() == out.data_ptr()
        assert rel_err(c, ref) < TOL[dtype], (step, M, K, N, dtype)


@pytest.mark.parametrize("step", steps(0, 1, 2, 3, 4) + STEP5)
@pytest.mark.parametrize("tokens,n_in,n_out", [(16384, 768, 3072), (16384, 3072, 768), (4096, 768, 2304), (333, 768, 768)])
def test_backward_products(step, tokens, n_in, n_out):
    x, W, dy = randn(tokens, n_in), randn(n_out, n_in), randn(tokens, n_out)
    dx = gemm.matmul(dy, W, step=step)
    assert rel_err(dx, dy.float() @ W.float()) < TOL[torch.bfloat16]
    if tokens % 16 == 0:   # the weight gradient reduces over tokens: K must be a multiple of 16
        for dtype in (torch.bfloat16, torch.float32):
            out = torch.full((n_out, n_in), float("nan"), device="cuda", dtype=dtype)
            dW = gemm.matmul(dy.t(), x, step=step, out_dtype=dtype, out=out)
            assert rel_err(dW, dy.float().t() @ x.float()) < TOL[dtype], (step, dtype)


@pytest.mark.parametrize("step", steps(0, 4) + STEP5)
@pytest.mark.parametrize("splits", [1, 2, 5])
def test_split_k(step, splits):
    M, K, N = 384, 2048, 512
    a, b = randn(M, K), randn(N, K)
    for a_op, b_op in [(a, b.t()), (a, b.t().contiguous()), (a.t().contiguous().t(), b.t().contiguous())]:
        c = gemm.matmul(a_op, b_op, step=step, splits=splits, out_dtype=torch.float32)
        assert rel_err(c, a.float() @ b.float().t()) < 1e-3


CLUSTER = pytest.mark.skipif(os.environ.get("TK_TEST_CLUSTER") == "0", reason="TK_TEST_CLUSTER=0 (its smoke test failed)")


@pytest.mark.parametrize("variant", [1, 2, 3, 4, pytest.param(5, marks=CLUSTER)])   # variant 0: every other test; 5: 2-CTA clusters
def test_step4_variants(variant):
    for M, K, N in [(77, 48, 272), (1000, 320, 528), (16384, 768, 3072)]:
        x, W = randn(M, K), randn(N, K)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        c = gemm.matmul(x, W.t(), variant=variant, out=out)
        assert rel_err(c, x.float() @ W.float().t()) < 1e-2, (variant, M, K, N)
    tokens, n_in, n_out = 4096, 768, 2304
    x, W, dy, bias = randn(tokens, n_in), randn(n_out, n_in), randn(tokens, n_out), randn(n_in)
    assert rel_err(gemm.matmul(dy, W, variant=variant, out_dtype=torch.float32), dy.float() @ W.float()) < 1e-3
    assert rel_err(gemm.matmul(dy, W, variant=variant, bias=bias, gelu=True),
                   torch.nn.functional.gelu(dy.float() @ W.float() + bias.float(), approximate="tanh")) < 1e-2
    for splits in (1, 3):
        dW = gemm.matmul(dy.t(), x, variant=variant, splits=splits)
        assert rel_err(dW, dy.float().t() @ x.float()) < 1e-2, (variant, splits)


@CLUSTER
def test_cluster_count_knob(monkeypatch):
    """TK_GEMM_CLUSTERS (launch_pairs, kernels/gemm_4_warp_specialized.cuh): a forced count below
    the pair units still computes the whole product; a value that is not a positive integer is
    refused with a message naming the variable (it used to become 1 cluster silently)."""
    x, W = randn(1000, 768), randn(528, 768)
    for step, variant in ((4, 5), (5, 4)):
        monkeypatch.setenv("TK_GEMM_CLUSTERS", "3")
        out = torch.full((1000, 528), float("nan"), device="cuda", dtype=torch.bfloat16)
        c = gemm.matmul(x, W.t(), step=step, variant=variant, out=out)
        assert rel_err(c, x.float() @ W.float().t()) < 1e-2, (step, variant)
        for bad in ("abc", "0", "-2", "4x"):
            monkeypatch.setenv("TK_GEMM_CLUSTERS", bad)
            with pytest.raises(RuntimeError, match="TK_GEMM_CLUSTERS must be a positive integer"):
                gemm.matmul(x, W.t(), step=step, variant=variant)


@pytest.mark.parametrize("variant", [1, 2, pytest.param(3, marks=CLUSTER), pytest.param(4, marks=CLUSTER), 5])   # v0: every other step-5 test
def test_step5_variants(variant):
    """Step 5's other consumer tiles (64x256), ring depths and 2-CTA clusters (3), every operand
    layout, tails (an odd number of tile rows leaves a cluster's second CTA past M), bias+GELU,
    bf16 and fp32 outputs, split-K."""
    for M, K, N in [(77, 48, 272), (1000, 320, 528), (16384, 768, 3072), (300, 1024, 96), (4096, 4096, 4096)]:
        x, W = randn(M, K), randn(N, K)
        for dtype in (torch.bfloat16, torch.float32):
            out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
            c = gemm.matmul(x, W.t(), step=5, variant=variant, out=out, out_dtype=dtype)
            assert rel_err(c, x.float() @ W.float().t()) < TOL[dtype], (variant, M, K, N, dtype)
    tokens, n_in, n_out = 4096, 768, 2304
    x, W, dy, bias = randn(tokens, n_in), randn(n_out, n_in), randn(tokens, n_out), randn(n_in)
    assert rel_err(gemm.matmul(dy, W, step=5, variant=variant, out_dtype=torch.float32), dy.float() @ W.float()) < 1e-3
    assert rel_err(gemm.matmul(dy, W, step=5, variant=variant, bias=bias, gelu=True),
                   torch.nn.functional.gelu(dy.float() @ W.float() + bias.float(), approximate="tanh")) < 1e-2
    for splits in (None, 1, 3):
        dW = gemm.matmul(dy.t(), x, step=5, variant=variant, splits=splits)
        assert rel_err(dW, dy.float().t() @ x.float()) < 1e-2, (variant, splits)


def test_auto_step_rule():
    # with a fused bias/GELU (plain=False): ping-pong 64x256 for K <= 1024, else step 4
    assert gemm.auto_step(16384, 3072, 768) == (5, 1) and gemm.auto_step(16384, 768, 3072) == (4, 0)
    assert gemm.auto_step(768, 3072, 16384) == (4, 0)
    # the plain product (session 6): 4v8 where 128x256 tiles fill the SMs twice; else (session 8)
    # 5v10's schedule where 128x128 tiles are at least half the SMs, 5v7's equal splits below that
    for M, N, K in [(8192, 8192, 8192), (16384, 3072, 768), (16384, 768, 3072), (16384, 768, 768)]:
        assert gemm.auto_step(M, N, K, plain=True) == (4, 8), (M, N, K)
    for M, N, K in [(3072, 768, 16384), (768, 3072, 16384), (2304, 768, 16384), (1024, 1152, 4096)]:
        assert gemm.auto_step(M, N, K, plain=True) == (5, 10), (M, N, K)
    for M, N, K in [(768, 768, 16384), (77, 272, 48), (1024, 1024, 4096)]:
        assert gemm.auto_step(M, N, K, plain=True) == (5, 7), (M, N, K)


def test_default_splits_are_used_for_weight_gradient():
    assert gemm.choose_splits(768, 3072, 16384, 132) > 1
    assert gemm.choose_splits(8192, 8192, 8192, 132) == 1


@pytest.mark.parametrize("step", steps(0, 4) + STEP5)
@pytest.mark.parametrize("M", [1, 200, 4096])
def test_fused_bias_gelu(step, M):
    K, N = 768, 3072
    x, W, bias = randn(M, K), randn(N, K) * 0.05, randn(N)
    ref = x.float() @ W.float().t() + bias.float()
    c = gemm.matmul(x, W.t(), step=step, bias=bias, out_dtype=torch.float32)
    assert rel_err(c, ref) < 1e-3
    c = gemm.matmul(x, W.t(), step=step, bias=bias, gelu=True)
    assert rel_err(c, torch.nn.functional.gelu(ref, approximate="tanh")) < 1e-2


def test_bad_inputs_raise_clear_errors():
    x, W = randn(64, 64), randn(64, 64)
    with pytest.raises(ValueError, match="multiples of 16"):
        gemm.matmul(randn(64, 40), randn(40, 64))
    with pytest.raises(ValueError, match="multiples of 16"):
        gemm.matmul(x, randn(64, 24))
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm.matmul(x, randn(48, 64))
    with pytest.raises(ValueError, match="bfloat16"):
        gemm.matmul(x.float(), W.t())
    with pytest.raises(ValueError, match="2-D"):
        gemm.matmul(randn(2, 64, 64), W.t())
    with pytest.raises(ValueError, match="step"):
        gemm.matmul(x, W.t(), step=7)
    with pytest.raises(ValueError, match="bias"):
        gemm.matmul(x, W.t(), bias=randn(32))
    with pytest.raises(ValueError, match="out must be"):
        gemm.matmul(x, W.t(), out=torch.empty(64, 64, device="cuda", dtype=torch.float32))
    with pytest.raises(ValueError, match="CUDA"):
        gemm.matmul(x.cpu(), W.t().cpu())


def test_strided_views_are_handled():
    big = randn(300, 256)
    a = big[3:203, 16:144]          # not contiguous, base not 16-byte aligned
    b = randn(128, 64)
    c = gemm.matmul(a, b, out_dtype=torch.float32)
    assert rel_err(c, a.float() @ b.float()) < 1e-3


# ---- session 5: the plan cache (kernels/gemm.py: checks and layout decisions cached on metadata),
# gemm.kernel_only (kernels/gemm_bench.py's graph/kernel/host modes) ----

def _products(tokens, n_in, n_out):
    """(name, a, b) for y = x·Wᵀ, dx = dy·W (same shapes, other layouts) and dW = dyᵀ·x (split-K)."""
    x, W, dy = randn(tokens, n_in), randn(n_out, n_in), randn(tokens, n_out)
    return [("fwd", x, W.t()), ("dx", dy, W), ("dW", dy.t(), x)]


@pytest.mark.parametrize("step", steps(0, 4) + STEP5)
def test_plan_cache_same_shape_other_tensors(step):
    """A cached plan must not carry one call's operands into the next: two sets of tensors with
    the same shapes and strides, called alternately, each give their own product."""
    sets = [_products(4096, 768, 2304), _products(4096, 768, 2304)]
    for _ in range(2):
        for products in sets:
            for name, a, b in products:
                out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=torch.bfloat16)
                c = gemm.matmul(a, b, step=step, out=out)
                assert rel_err(c, a.float() @ b.float()) < 1e-2, (step, name)
                c = gemm.matmul(a, b, step=step)
                assert rel_err(c, a.float() @ b.float()) < 1e-2, (step, name)


@pytest.mark.parametrize("step", steps(0, 4) + STEP5)
def test_plan_cache_same_shape_other_strides(step):
    """The same M x K shape given row-major, then column-major (the weight gradient's dyᵀ view),
    then as an unaligned view: each is read the way its own strides say."""
    M, K, N = 768, 1024, 512
    row = randn(M, K)
    col = randn(K, M).t()
    big = randn(M + 1, K)
    unaligned = big.view(-1)[1:1 + M * K].view(M, K)                 # contiguous, base 2 bytes off
    assert unaligned.data_ptr() % 16 and row.shape == col.shape == unaligned.shape
    b = randn(K, N)
    for a in (row, col, unaligned, row, col):
        assert rel_err(gemm.matmul(a, b, step=step), a.float() @ b.float()) < 1e-2, (step, a.stride())


def test_plan_cache_on_off_same_results():
    """Cache on and off run the same kernels on the same storage: identical bits without split-K,
    the same accuracy with it (split-K's fp32 reduce-add order is not fixed)."""
    for name, a, b in _products(992, 320, 528) + _products(16384, 768, 768):   # the second takes split-K for dW
        on = gemm.matmul(a, b, step=0)
        gemm.PLAN_CACHE = False
        try:
            off = gemm.matmul(a, b, step=0)
        finally:
            gemm.PLAN_CACHE = True
        if gemm.plan(a, b, step=0).splits == 1:
            assert torch.equal(on, off), name
        assert rel_err(on, a.float() @ b.float()) < 1e-2 and rel_err(off, a.float() @ b.float()) < 1e-2, name


@pytest.mark.parametrize("step", [0, 4, 5])
def test_kernel_only_matches_matmul(step):
    """gemm.kernel_only's launch (what gemm_bench's kernel mode times) runs the same product:
    one launch into its prepared output equals the reference (fp32 partials for split-K)."""
    for name, a, b in _products(16384, 768, 768):
        launch, c = gemm.kernel_only(a, b, step=step)
        if gemm.plan(a, b, step=step).splits == 1:
            c.fill_(float("nan"))                    # poisoned: the kernel must write every value
        else:
            c.zero_()                                # split-K reduce-adds into it
        launch()
        assert rel_err(c, a.float() @ b.float()) < 1e-2, (step, name, c.dtype)


def test_matmul_in_a_cuda_graph_reads_new_values():
    """gemm_bench's graph mode captures matmul (split-K's zeroing and conversion included): a
    replay after new values are copied into the captured inputs gives the new product."""
    for name, a, b in _products(16384, 768, 768):
        sa, sb = a.clone() if a.is_contiguous() else a.t().clone().t(), b.clone() if b.is_contiguous() else b.t().clone().t()
        gemm.matmul(sa, sb, step=0)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            c = gemm.matmul(sa, sb, step=0)
        for _ in range(2):
            sa.copy_(torch.randn_like(sa))
            sb.copy_(torch.randn_like(sb))
            g.replay()
            torch.cuda.synchronize()
            assert rel_err(c, sa.float() @ sb.float()) < 1e-2, name


# ---- session 6: the plain epilogue (variants 6 and 7 of steps 4 and 5, 8 of step 4,
# kernels/gemm_plain_epilogue.cuh): the same pipelines as step 4 v0 / v5 / v0 and step 5 v1 / v0,
# boxes staged by stmatrix (bf16) or 8-byte stores (fp32) with no per-value work; 4v8 stores a
# tile's boxes during the next tile's first k-steps (the shapes below include tiles with fewer
# k-steps than boxes: K = 16, 48, 64) ----

# (step, variant, the variant whose pipeline it shares)
# 5v8 (session 7, kernels/gemm_splitk_epilogue.cuh): 5v7 with the split-K finished in the
# kernel; without split-K the same stores as 5v7 (tests/test_gemm_splitk.py has the rest)
PLAIN = [(4, 6, 0), pytest.param(4, 7, 5, marks=CLUSTER), (4, 8, 0), (5, 6, 1), (5, 7, 0), (5, 8, 0)]


@pytest.mark.parametrize("step,variant,twin", PLAIN)
def test_plain_epilogue_forward(step, variant, twin):
    """x·Wᵀ at tails in M (1, 77, 1000, 4097 rows: the last tile's rows past M are clipped), N not
    a multiple of the tile (272, 528, 96: boxes past N skipped), K = 16 and 1024, GPT-2's shape;
    bf16 and fp32 outputs into poisoned tensors; and bit-identical to its twin variant, which
    runs the same wgmmas and rounds the same way (only the staging differs)."""
    for M, K, N in [(1, 16, 16), (77, 48, 272), (1000, 320, 528), (4097, 1024, 96), (2000, 64, 1040), (16384, 768, 3072)]:
        x, W = randn(M, K), randn(N, K)
        ref = x.float() @ W.float().t()
        for dtype in (torch.bfloat16, torch.float32):
            out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
            c = gemm.matmul(x, W.t(), step=step, variant=variant, out_dtype=dtype, out=out)
            assert c.data_ptr() == out.data_ptr()
            assert rel_err(c, ref) < TOL[dtype], (step, M, K, N, dtype)
            twin_c = gemm.matmul(x, W.t(), step=step, variant=twin, out_dtype=dtype)
            assert torch.equal(c, twin_c), (step, M, K, N, dtype, (c.float() - twin_c.float()).abs().max().item())


@pytest.mark.parametrize("step,variant,twin", PLAIN)
def test_plain_epilogue_backward_products(step, variant, twin):
    """dx = dy·W (B N-major) and dW = dyᵀ·x (A M-major, split-K reduce-adds fp32 boxes: splits
    chosen, 1 and 3), bf16 and fp32 outputs, at GPT-2's dW shape and a tail of tokens."""
    for tokens, n_in, n_out in [(4096, 768, 2304), (16384, 768, 3072), (336, 768, 272)]:
        x, W, dy = randn(tokens, n_in), randn(n_out, n_in), randn(tokens, n_out)
        out = torch.full((tokens, n_in), float("nan"), device="cuda", dtype=torch.bfloat16)
        dx = gemm.matmul(dy, W, step=step, variant=variant, out=out)
        assert rel_err(dx, dy.float() @ W.float()) < 1e-2, (step, tokens)
        # bit-identical to the twin without split-K (with 3+ splits the order of the fp32
        # reduce-adds varies from run to run, so neither kernel repeats itself bit for bit)
        assert torch.equal(gemm.matmul(dy, W, step=step, variant=variant, splits=1),
                           gemm.matmul(dy, W, step=step, variant=twin, splits=1)), (step, variant, tokens)
        ref = dy.float().t() @ x.float()
        for splits in (None, 1, 3):
            for dtype in (torch.bfloat16, torch.float32):
                out = torch.full((n_out, n_in), float("nan"), device="cuda", dtype=dtype)
                dW = gemm.matmul(dy.t(), x, step=step, variant=variant, splits=splits, out_dtype=dtype, out=out)
                assert rel_err(dW, ref) < TOL[dtype], (step, tokens, splits, dtype)


@pytest.mark.parametrize("step,variant,twin", PLAIN)
def test_plain_epilogue_refuses_bias_and_gelu(step, variant, twin):
    x, W = randn(64, 64), randn(64, 64)
    for kw in ({"bias": randn(64)}, {"gelu": True}):
        with pytest.raises(ValueError, match=f"variant {variant} of step {step} is the plain product"):
            gemm.matmul(x, W.t(), step=step, variant=variant, **kw)
    # the C++ launcher refuses it too (a caller that skips the Python checks)
    c = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="are the plain product"):
        gemm._ext.module.run(step, x, W, c, False, False, None, True, 1, variant)


@pytest.mark.parametrize("step,variant,twin", PLAIN)
def test_kernel_only_plain_variant(step, variant, twin):
    """gemm_bench's kernel mode times the plain variants through gemm.kernel_only(step, variant)."""
    for name, a, b in _products(16384, 768, 768):
        launch, c = gemm.kernel_only(a, b, step=step, variant=variant)
        split = gemm.plan(a, b, step=step, variant=variant).splits > 1
        c.zero_() if split else c.fill_(float("nan"))
        launch()
        assert rel_err(c, a.float() @ b.float()) < 1e-2, (step, name)


@pytest.mark.parametrize("M,K,N", [(1, 16, 16), (77, 48, 272), (2000, 64, 1040), (16384, 768, 3072), (8192, 8192, 8192)])
def test_auto_runs_the_plain_variants(M, K, N):
    """matmul(step=0) without bias/GELU (the default since session 6) plans 4v8 or 5v7 as
    auto_step(plain=True) says, and its result equals that variant's bit for bit and the fp32
    reference; with a bias it keeps the fused rule (5v1 / 4v0)."""
    x, W = randn(M, K), randn(N, K)
    p = gemm.plan(x, W.t(), step=0)
    assert (p.step, p.variant) == gemm.auto_step(M, N, K, plain=True, num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    c = gemm.matmul(x, W.t(), step=0, out=out)
    assert rel_err(c, x.float() @ W.float().t()) < 1e-2
    if p.splits == 1 and p.variant not in gemm.SCHEDULED.get(p.step, ()):   # (scheduled pieces sum in any order)
        assert torch.equal(c, gemm.matmul(x, W.t(), step=p.step, variant=p.variant))
    pb = gemm.plan(x, W.t(), step=0, bias=randn(N))
    assert (pb.step, pb.variant) == gemm.auto_step(M, N, K)

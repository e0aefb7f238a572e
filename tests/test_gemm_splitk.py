"""GPU tests of the in-kernel split-K (step 5 variant 8, kernels/gemm_splitk_epilogue.cuh):
the last split of a tile sums the others' partials from a workspace the kernel keeps zeroed and
stores the tile itself, bf16 or fp32.

What can go wrong and which test sees it: a split missing or counted twice (every result against
a float64 reference, tolerances a lost split exceeds by 10x); tails in M, N and K (shapes below);
a counter or a sum left non-zero after a call (test_workspace_is_zero_after_each_call, and
repeated calls with other split counts on the same workspace); CUDA graphs (replays with new
data; a first call inside a capture takes the old path); the workspace checks. Skips without CUDA.
"""
import pytest
import torch
from conftest import rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

if torch.cuda.is_available():
    from kernels import gemm

VARIANTS = (8,)                       # 128x128 tiles, an arrival per consumer warp (session 7's 9, one per
                                      # consumer, measured the same and was removed)
TOL = {torch.bfloat16: 1e-2, torch.float32: 5e-5}   # rel. norm error vs float64: bf16 rounding ~3e-3;
                                                    # fp32 sums of K products ~1e-6 (a lost split: > 0.05)


@pytest.fixture(scope="module", autouse=True)
def built():
    reason = gemm.why_not()
    assert reason is None, reason


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def check(c, ref, dtype, what):
    err = rel_err(c, ref)
    assert err < TOL[dtype], (what, dtype, err)


# (M, K, N) of the weight gradient dW = dyᵀ·x (M = outputs, K = tokens, N = inputs): tails in M
# (77, 1000, 300), N (272, 528, 96: not multiples of the tile) and K (k-tiles not divisible by
# the split count); the splits list holds every count choose_splits picks at the GPT-2 shapes
# (9, 9, 6, 11 for dW 3072x768, 768x3072, 2304x768, 768x768 on either tile) and the extremes.
DW_SHAPES = [(77, 2048, 272), (1000, 4096, 528), (300, 1040, 96), (768, 3072, 768)]
SPLITS = [None, 1, 2, 3, 5, 6, 9, 11, 16]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("M,K,N", DW_SHAPES)
@pytest.mark.parametrize("splits", SPLITS)
def test_weight_gradient(variant, M, K, N, splits):
    dy, x = randn(K, M), randn(K, N)
    ref = dy.double().t() @ x.double()
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)   # poisoned
        c = gemm.matmul(dy.t(), x, step=5, variant=variant, splits=splits, out_dtype=dtype, out=out)
        assert c.data_ptr() == out.data_ptr()
        check(c, ref, dtype, (variant, M, K, N, splits))
        c = gemm.matmul(dy.t(), x, step=5, variant=variant, splits=splits, out_dtype=dtype)   # allocated here
        check(c, ref, dtype, (variant, M, K, N, splits, "no out"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_other_layouts_split(variant):
    """y = x·Wᵀ (both K-major) and dx = dy·W (B N-major) split too, with tails."""
    M, K, N = 333, 2560, 400
    a, w = randn(M, K), randn(N, K)
    ref = a.double() @ w.double().t()
    for b in (w.t(), w.t().contiguous()):
        for splits in (2, 5):
            for dtype in (torch.bfloat16, torch.float32):
                check(gemm.matmul(a, b, step=5, variant=variant, splits=splits, out_dtype=dtype), ref, dtype, (splits, dtype))


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpt2_weight_gradients(variant):
    for n_out, n_in in [(3072, 768), (768, 3072), (2304, 768), (768, 768)]:
        dy, x = randn(16384, n_out), randn(16384, n_in)
        p = gemm.plan(dy.t(), x, step=5, variant=variant)
        assert p.splits == {3072: 9, 2304: 6}.get(n_out, 9 if n_in == 3072 else 11), p   # the counts tested above
        c = gemm.matmul(dy.t(), x, step=5, variant=variant)
        check(c, dy.float().t() @ x.float(), torch.bfloat16, (n_out, n_in, p.splits))


def workspace(variant, M, N):
    tm, tn = gemm.TILES5[variant]
    return gemm.splitk_workspace(torch.device("cuda", torch.cuda.current_device()), M, N, tm, tn, allocate=False)


@pytest.mark.parametrize("variant", VARIANTS)
def test_workspace_is_zero_after_each_call(variant):
    """The kernel's promise: sums and counters are zero when it ends, whatever the split count,
    so the next call (any K, any splits) needs no memset. Calls with different split counts and
    fresh data on one workspace, each checked, and the workspace inspected after each."""
    M, N = 520, 400
    for K, splits in [(2048, 2), (2048, 5), (1024, 16), (3072, 3), (2048, 2)]:
        dy, x = randn(K, M), randn(K, N)
        c = gemm.matmul(dy.t(), x, step=5, variant=variant, splits=splits)
        check(c, dy.double().t() @ x.double(), torch.bfloat16, (K, splits))
        sums, arrivals = workspace(variant, M, N)
        torch.cuda.synchronize()
        assert not sums.any() and not arrivals.any(), (K, splits)


# every plan that sums split K in the kernel: 5v8's equal splits, and the planned schedules of
# tests/test_gemm_schedule.py (5v10, 4v9), which also need their schedule table made before capture
@pytest.mark.parametrize("step,variant", [(5, v) for v in VARIANTS] + [(5, 10), (4, 9)])
def test_cuda_graph_replays(step, variant):
    """Captured after a warm-up (the workspace exists), replayed with new data three times."""
    M, K, N = 768, 4096, 384
    dy, x = randn(K, M), randn(K, N)
    f = lambda: gemm.matmul(dy.t(), x, step=step, variant=variant)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        f()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = f()
    for _ in range(3):
        dy.copy_(randn(K, M))
        x.copy_(randn(K, N))
        g.replay()
        torch.cuda.synchronize()
        check(c, dy.double().t() @ x.double(), torch.bfloat16, "replay")


def test_first_call_inside_a_capture_takes_the_old_path():
    """No workspace yet for this shape and a capture running: the call runs 5v7's split-K
    (memset, reduce-add, conversion) in the graph and allocates nothing to share."""
    M, K, N = 208, 4096, 176                 # a shape no other test uses
    dy, x = randn(K, M), randn(K, N)
    assert workspace(8, M, N) is None
    gemm.matmul(dy.t(), x, step=5, variant=7, splits=4)   # 5v7's kernel set up (shared memory attribute) before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = gemm.matmul(dy.t(), x, step=5, variant=8, splits=4)
    assert workspace(8, M, N) is None
    g.replay()
    torch.cuda.synchronize()
    check(c, dy.double().t() @ x.double(), torch.bfloat16, "captured first call")
    c2 = gemm.matmul(dy.t(), x, step=5, variant=8, splits=4)            # eager: now it is made
    check(c2, dy.double().t() @ x.double(), torch.bfloat16, "eager after")
    assert workspace(8, M, N) is not None


def test_kernel_only_launch_is_a_whole_product():
    dy, x = randn(4096, 640), randn(4096, 256)
    launch, c = gemm.kernel_only(dy.t(), x, step=5, variant=8)
    assert gemm.plan(dy.t(), x, step=5, variant=8).splits > 1
    for _ in range(2):
        c.fill_(float("nan"))
        launch()
        check(c, dy.double().t() @ x.double(), torch.bfloat16, "kernel_only")


def test_against_the_old_split_k():
    """5v8 and 5v7 (same tiles and pipeline, the old memset/reduce-add/conversion) agree to fp32
    rounding in fp32 output (the order of the splits' sums differs)."""
    dy, x = randn(8192, 768), randn(8192, 768)
    new = gemm.matmul(dy.t(), x, step=5, variant=8, splits=6, out_dtype=torch.float32)
    old = gemm.matmul(dy.t(), x, step=5, variant=7, splits=6, out_dtype=torch.float32)
    assert rel_err(new, old) < 1e-6


def test_workspace_checks():
    ext = gemm._ext.module
    M, K, N = 256, 2048, 256
    dy, x = randn(K, M), randn(K, N)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    a_s = dy                                 # dy.t() as [K][M] storage
    sums = torch.zeros(M * N, device="cuda")
    arrivals = torch.zeros(4 * 4, device="cuda", dtype=torch.int32)   # 2 x 2 tiles of 128x128
    base = (5, a_s, x, c, True, True, None, False, 4, 8)
    with pytest.raises(RuntimeError, match="needs a zeroed workspace"):
        ext.run(*base)                                                  # none given
    with pytest.raises(RuntimeError, match="needs a zeroed workspace"):
        ext.run(*base, sums[:-1], arrivals)                             # one float short
    with pytest.raises(RuntimeError, match="needs a zeroed workspace"):
        ext.run(*base, sums, arrivals[:-1])
    with pytest.raises(TypeError, match="splitk_sums must be float32"):
        ext.run(*base, sums.double(), arrivals)
    with pytest.raises(TypeError, match="splitk_arrivals must be int32"):
        ext.run(*base, sums, arrivals.long())
    with pytest.raises(ValueError, match="both or neither"):
        ext.run(*base, sums, None)
    with pytest.raises(ValueError, match="must be on a's device"):
        ext.run(*base, sums.cpu(), arrivals)
    ext.run(*base, sums, arrivals)                                      # exactly enough: runs
    torch.cuda.synchronize()
    check(c, dy.double().t() @ x.double(), torch.bfloat16, "exact workspace")
    assert not sums.any() and not arrivals.any()

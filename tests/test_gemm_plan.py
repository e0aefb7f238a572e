"""CPU tests (CI) of kernels/gemm.py's plan cache: matmul's checks and layout decisions are cached
on the operands' metadata (session 5, to cut host time per call). A cached plan must never let a
call skip a check it would fail, and two calls that differ in anything the plan reads (strides,
alignment of `out`, argument types) must not share an entry. The plan holds no tensor and no
pointer, so it cannot hand one call's data to another. GPU results with the cache on and off are
in tests/test_gemm.py (test_plan_cache_*)."""
import pytest
import torch

from kernels import gemm


def bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def fresh_cache():
    gemm._plans.clear()
    gemm.PLAN_CACHE = True
    yield
    gemm._plans.clear()
    gemm.PLAN_CACHE = True


def plan(a, b, **kw):
    kw.setdefault("splits", 1)          # choose_splits would ask a GPU for its SM count
    return gemm.plan(a, b, cuda=False, **kw)


def test_plan_holds_no_tensor_and_is_reused_for_same_metadata():
    x1, x2, W = bf16(64, 32), bf16(64, 32), bf16(48, 32)
    p1 = plan(x1, W.t())
    assert not any(isinstance(f, torch.Tensor) for f in p1)
    assert len(gemm._plans) == 1
    p2 = plan(x2, W.t())                # another tensor, same metadata: the same entry
    assert p2 is p1 and len(gemm._plans) == 1


def test_same_shape_other_strides_gets_its_own_plan():
    M, K, N = 64, 32, 48
    row_a, col_a = bf16(M, K), bf16(K, M).t()          # both M x K; the second column-major
    W = bf16(N, K)
    assert row_a.shape == col_a.shape and row_a.stride() != col_a.stride()
    p_row = plan(row_a, W.t(), step=4)
    p_col = plan(col_a, bf16(K, N), step=4)
    assert not p_row.a_t and p_col.a_t                 # the M-major a is read in place as [K][M]
    assert plan(row_a, W.t(), step=4) is p_row        # and neither entry answers for the other
    assert plan(row_a, W.t().contiguous(), step=4).b_mode == "c" and p_row.b_mode == "t"
    assert len(gemm._plans) == 3
    # the pairing step 4 lacks (A M-major, B K-major) still turns B into [K][N] on a cache hit
    assert plan(col_a, W.t(), step=4).b_mode == "c"
    assert plan(col_a, W.t(), step=4).b_mode == "c"


def test_a_failing_call_is_never_cached_and_always_raises():
    x, W = bf16(64, 32), bf16(48, 32)
    plan(x, W.t())
    for _ in range(2):                                  # twice: a failure must not leave an entry behind
        with pytest.raises(ValueError, match="splits"):
            gemm.plan(x, W.t(), splits=True, cuda=False)   # True == 1 and hash(True) == hash(1)
        with pytest.raises(ValueError, match="bfloat16"):
            gemm.plan(x.float(), W.t(), splits=1, cuda=False)
        with pytest.raises(ValueError, match="inner dimensions"):
            gemm.plan(x, bf16(40, 48), splits=1, cuda=False)
    assert len(gemm._plans) == 1


def test_misaligned_out_after_aligned_out_of_same_shape_raises():
    x, W = bf16(64, 32), bf16(48, 32)
    good = torch.empty(64, 48, dtype=torch.bfloat16)
    bad = torch.empty(64 * 48 + 1, dtype=torch.bfloat16)[1:].view(64, 48)   # contiguous, 2 bytes off
    assert good.shape == bad.shape and good.stride() == bad.stride() and bad.data_ptr() % 16
    plan(x, W.t(), out=good)
    with pytest.raises(ValueError, match="out must be"):
        plan(x, W.t(), out=bad)


def test_bias_of_other_length_after_a_good_one_raises():
    x, W = bf16(64, 32), bf16(48, 32)
    plan(x, W.t(), bias=bf16(48))
    with pytest.raises(ValueError, match="bias"):
        plan(x, W.t(), bias=bf16(40))
    with pytest.raises(ValueError, match="bias"):
        plan(x, W.t(), bias=bf16(96)[::2])             # right length, not contiguous


def test_cache_off_gives_the_same_plans():
    cases = [(bf16(64, 32), bf16(48, 32).t(), {}), (bf16(32, 64).t(), bf16(32, 48), {"step": 4}),
             (bf16(77, 48), bf16(48, 272), {"step": 2}), (bf16(64, 48), bf16(32, 48).t(), {"step": 5, "variant": 1})]
    cached = [plan(a, b, **kw) for a, b, kw in cases]
    gemm.PLAN_CACHE = False
    gemm._plans.clear()
    assert [plan(a, b, **kw) for a, b, kw in cases] == cached
    assert not gemm._plans
    assert cached[2].pad_k == 16 and cached[2].b_mode == "tc"


def test_non_tensor_arguments_take_the_checked_path():
    W = bf16(48, 32)
    with pytest.raises(TypeError, match="a must be a tensor"):
        gemm.plan([[1.0]], W.t(), splits=1, cuda=False)
    with pytest.raises(ValueError, match="splits"):
        gemm.plan(bf16(64, 32), W.t(), splits=[1], cuda=False)          # unhashable: no key, checked


def test_plain_variant_refuses_bias_and_gelu_on_cpu():
    """Variants 6-9 of step 4 and 6-8, 10 of step 5 (the plain epilogue; 5v8 with the in-kernel
    split-K; 4v9, 5v10 on a planned schedule) have no bias/GELU: the Python checks say so."""
    x, W = bf16(64, 32), bf16(48, 32)
    for step, variants in ((4, (6, 7, 8, 9)), (5, (6, 7, 8, 10))):
        for variant in variants:
            assert plan(x, W.t(), step=step, variant=variant).variant == variant
            for kw in ({"bias": bf16(48)}, {"gelu": True}):
                with pytest.raises(ValueError, match=f"variant {variant} of step {step} is the plain product"):
                    plan(x, W.t(), step=step, variant=variant, **kw)
    with pytest.raises(ValueError, match="variant must be one of"):
        plan(x, W.t(), step=4, variant=10)
    with pytest.raises(ValueError, match="variant must be one of"):
        plan(x, W.t(), step=5, variant=9)                               # (session 7's 5v9 was removed)
    with pytest.raises(ValueError, match="variant must be one of"):
        plan(x, W.t(), step=5, variant=11)                              # (session 8's 5v11 was removed)


def test_auto_plans_the_plain_variants_without_bias():
    """step=0 (the default): without bias/GELU the plain epilogue (4v8, or for products with few
    128x256 tiles, the weight gradients, 5v10's schedule or 5v7's equal splits); with bias or GELU
    the fused rule (5v1 / 4v0)."""
    cases = [((16384, 768), (3072, 768), (4, 8)), ((8192, 8192), (8192, 8192), (4, 8)),
             ((768, 16384), (16384, 3072), (5, 10)), ((768, 16384), (16384, 768), (5, 7)), ((77, 48), (272, 48), (5, 7))]
    for (m, k), (n_or_k, k_or_n), want in cases:
        a = bf16(m, k)
        b = bf16(n_or_k, k_or_n).t() if n_or_k != k else bf16(n_or_k, k_or_n)   # W.t() or [K][N]
        p = plan(a, b, step=0, splits=None)         # (cuda=False: split counts for 132 SMs)
        assert (p.step, p.variant) == want, (m, k, want, p)
        pb = plan(a, b, step=0, bias=bf16(b.shape[1]))
        assert (pb.step, pb.variant) == gemm.auto_step(m, b.shape[1], k), pb


def test_auto_with_a_split_count_keeps_equal_splits():
    """step=0 picks 5v10 (its own schedule) for dW 768x16384x3072; a split count passed with it
    asks for equal splits, so the plan is 5v7 with that count, as before session 8."""
    dy, x = bf16(16384, 768), bf16(16384, 3072)
    assert plan(dy.t(), x, step=0, splits=None)[:2] == (5, 10)
    for splits in (1, 3):
        p = plan(dy.t(), x, step=0, splits=splits)
        assert (p.step, p.variant, p.splits) == (5, 7, splits), p


def test_splitk_workspace_sizes_and_reuse():
    """Step 5 variant 8's workspace (kernels/gemm.py splitk_workspace): tiles x BM x BN fp32 sums
    and tiles x 4 int32 counters, zero, one per (device, tile, tile grid) and reused; shapes that
    round up to the same tile grid share it. Built on the CPU here (the sizes are the point)."""
    gemm._splitk_ws.clear()
    try:
        sums, arrivals = gemm.splitk_workspace("cpu", 768, 3072, 128, 128)
        assert sums.dtype == torch.float32 and arrivals.dtype == torch.int32
        assert sums.numel() == 6 * 24 * 128 * 128 and arrivals.numel() == 6 * 24 * 4
        assert not sums.any() and not arrivals.any()
        again = gemm.splitk_workspace("cpu", 700, 3072 - 16, 128, 128)        # same 6 x 24 tile grid
        assert again[0] is sums and again[1] is arrivals
        wide = gemm.splitk_workspace("cpu", 768, 3072, 64, 256)               # the other tile: its own
        assert wide[0] is not sums and wide[0].numel() == 12 * 12 * 64 * 256 and wide[1].numel() == 12 * 12 * 4
        assert gemm.splitk_workspace("cpu", 77, 272, 128, 128, allocate=False) is None
        assert len(gemm._splitk_ws) == 2
    finally:
        gemm._splitk_ws.clear()


def test_fused_splitk_variants_plan_a_split():
    """5v8 chooses its split-K factor like 5v7 (choose_splits on the same 128x128 tile), and the
    weight gradient's plan reads dy.t() and x in place."""
    dy, x = bf16(16384, 768), bf16(16384, 3072)
    p = gemm.plan(dy.t(), x, step=5, variant=8, cuda=False)
    q = gemm.plan(dy.t(), x, step=5, variant=7, cuda=False)
    assert p.splits == q.splits > 1 and p.a_t and p.b_mode == "c"

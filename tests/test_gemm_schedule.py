"""Step 5 variant 10 and step 4 variant 9 (session 8): the in-kernel split-K of step 5 variant 8
on a schedule planned on the host (kernels/gemm.py stream_schedule: whole tiles plus a few
k-pieces of unequal length per CTA; kernels/gemm_splitk_epilogue.cuh, scheduled_splitk_epilogue).
5v10: a piece arrives in its own epilogue; 4v9: step 4's cooperative 128x256 tile, each consumer
warp's slab a piece, arriving at once. (Session 8's 5v11, a piece arriving one tile of its
consumer later, was removed after the session.)

CPU tests (run in CI): the schedule itself. Every tile's pieces cover its K range exactly once,
every CTA gets its fair share of k-tiles, pieces run before whole tiles, heads start at k = 0,
and the table the kernel reads ends each CTA's list with an empty entry.
GPU tests (skip without CUDA): every result against a float64 reference into NaN-poisoned
outputs (bf16 and fp32) at tails in M, N and K and at GPT-2's weight-gradient shapes, both
schedule cases (more tiles than CTAs: whole tiles + pieces; fewer: heads + shared tails), the
other operand layouts, the workspace zero after every call (shared with variant 8), a first
call inside a capture (takes 5v7), kernel_only, the binding's schedule checks. Their CUDA-graph
replays are test_gemm_splitk.py's test_cuda_graph_replays, which runs every in-kernel split-K plan.
"""
import pytest
import torch
from conftest import rel_err

from kernels import gemm

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
VARIANTS = [(5, 10), (4, 9)]   # (step, variant)
TILES = [(128, 128), (128, 256)]
TOL = {torch.bfloat16: 1e-2, torch.float32: 5e-5}   # rel. norm error vs float64 (a lost piece: > 0.02)

# (M, N, K, CTAs): the GPT-2 weight gradients on 132 SMs, tails, tiny products, a K that is not a
# multiple of 64, more tiles than CTAs with none left over
SHAPES = [(3072, 768, 16384, 132), (768, 3072, 16384, 132), (2304, 768, 16384, 132), (768, 768, 16384, 132),
          (1000, 528, 4096, 132), (77, 272, 2048, 132), (300, 96, 1040, 132), (16, 16, 16, 132),
          (4097, 1024, 64, 132), (1024, 1024, 8192, 64), (640, 384, 3000, 7)]


def pieces_by_tile(schedule):
    out = {}
    for units in schedule:
        for tm, tn, k0, k1 in units:
            out.setdefault((tm, tn), []).append((k0, k1))
    return out


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("M,N,K,sms", SHAPES)
def test_schedule_covers_every_tile_once(M, N, K, sms, tile):
    s = gemm.stream_schedule(M, N, K, sms, *tile)
    assert 1 <= len(s) <= sms
    tiles_m, tiles_n, k_tiles = -(-M // tile[0]), -(-N // tile[1]), -(-K // 64)
    by_tile = pieces_by_tile(s)
    assert set(by_tile) == {(i, j) for i in range(tiles_m) for j in range(tiles_n)}
    for tile, pieces in by_tile.items():
        pieces.sort()
        assert pieces[0][0] == 0 and pieces[-1][1] == k_tiles, (tile, pieces)
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), (tile, pieces)   # no gap, no overlap
        assert all(k0 < k1 for k0, k1 in pieces), (tile, pieces)                          # no empty unit


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("M,N,K,sms", SHAPES)
def test_schedule_is_balanced_and_ordered(M, N, K, sms, tile):
    s = gemm.stream_schedule(M, N, K, sms, *tile)
    k_tiles = -(-K // 64)
    loads = [sum(k1 - k0 for _, _, k0, k1 in units) for units in s]
    fair = sum(loads) / len(s)
    assert max(loads) <= fair + 4 and min(loads) >= fair - 4, (min(loads), max(loads), fair)
    for units in s:
        whole = [u[2] == 0 and u[3] == k_tiles for u in units]
        assert whole == sorted(whole), units            # pieces first, then whole tiles
    if len(s) == sms and -(-M // tile[0]) * -(-N // tile[1]) < sms:   # heads: start at 0, the fair share long
        heads = [units[0] for units in s if units and units[0][2] == 0]
        assert heads and all(abs((u[3] - u[2]) - fair) <= 1 for u in heads), heads


def test_gpt2_schedules_have_few_pieces():
    """The point of the schedule (pieces per CTA) at the shapes it was made for."""
    for tile, most in [((128, 128), {3072: 2, 2304: 5}), ((128, 256), {3072: 2, 2304: 2})]:
        for M, N in [(3072, 768), (768, 3072), (2304, 768), (768, 768)]:
            s = gemm.stream_schedule(M, N, 16384, 132, *tile)
            assert len(s) == 132 and max(len(units) for units in s) <= most.get(M, 2), (M, N, tile)


def test_schedule_table_layout():
    s = ((( 0, 0, 0, 4), (1, 0, 0, 8)), ((0, 0, 4, 8),))
    t = gemm.schedule_table(s)
    assert t.dtype == torch.int32 and t.shape == (2, 2, 4)
    assert t[0, 0].tolist() == [0, 0, 0, 4] and t[1, 0].tolist() == [1, 0, 0, 8]
    assert t[0, 1].tolist() == [0, 0, 4, 8] and t[1, 1].tolist() == [0, 0, 0, 0]   # CTA 1's list ends


@pytest.mark.parametrize("step,variant", VARIANTS)
def test_plan_refuses_splits(step, variant):
    x, W = torch.randn(256, 512).bfloat16(), torch.randn(128, 512).bfloat16()
    assert gemm.plan(x, W.t(), step=step, variant=variant, cuda=False).splits == 1
    with pytest.raises(ValueError, match="plans its own split of K"):
        gemm.plan(x, W.t(), step=step, variant=variant, splits=4, cuda=False)
    with pytest.raises(ValueError, match="plain product"):
        gemm.plan(x, W.t(), step=step, variant=variant, gelu=True, cuda=False)


# ---------------------------------------------------------------- GPU
def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def check(c, ref, dtype, what):
    err = rel_err(c, ref)
    assert err < TOL[dtype], (what, dtype, err)


def workspace(M, N, tile_m=128, tile_n=128):
    return gemm.splitk_workspace(torch.device("cuda", torch.cuda.current_device()), M, N, tile_m, tile_n, allocate=False)


# (M, K, N) of dW = dyᵀ·x: tails in M, N and K; fewer tiles than SMs (heads + tails) and more
# (whole tiles + pieces: 2560 x 1024 = 160 tiles); a K that leaves a partial last k-tile
DW_SHAPES = [(77, 2048, 272), (1000, 4096, 528), (300, 1040, 96), (768, 3072, 768), (2560, 2048, 1024),
             (1536, 3008, 1424)]


@gpu
@pytest.mark.parametrize("step,variant", VARIANTS)
@pytest.mark.parametrize("M,K,N", DW_SHAPES)
def test_weight_gradient(step, variant, M, K, N):
    dy, x = randn(K, M), randn(K, N)
    ref = dy.double().t() @ x.double()
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)   # poisoned
        c = gemm.matmul(dy.t(), x, step=step, variant=variant, out_dtype=dtype, out=out)
        assert c.data_ptr() == out.data_ptr()
        check(c, ref, dtype, (variant, M, K, N))
        check(gemm.matmul(dy.t(), x, step=step, variant=variant, out_dtype=dtype), ref, dtype, (variant, M, K, N, "no out"))


@gpu
@pytest.mark.parametrize("step,variant", VARIANTS)
def test_gpt2_weight_gradients(step, variant):
    for n_out, n_in in [(3072, 768), (768, 3072), (2304, 768), (768, 768)]:
        dy, x = randn(16384, n_out), randn(16384, n_in)
        c = gemm.matmul(dy.t(), x, step=step, variant=variant)
        check(c, dy.float().t() @ x.float(), torch.bfloat16, (variant, n_out, n_in))


@gpu
@pytest.mark.parametrize("step,variant", VARIANTS)
def test_other_layouts(step, variant):
    """y = x·Wᵀ (both K-major) and dx = dy·W (B N-major), with tails."""
    M, K, N = 333, 2560, 400
    a, w = randn(M, K), randn(N, K)
    ref = a.double() @ w.double().t()
    for b in (w.t(), w.t().contiguous()):
        for dtype in (torch.bfloat16, torch.float32):
            check(gemm.matmul(a, b, step=step, variant=variant, out_dtype=dtype), ref, dtype, (variant, dtype))


@gpu
def test_workspace_is_zero_after_each_call():
    """Different K (so different schedules) and variant 8's equal splits on ONE workspace (M, N and
    the tile are its key: step 5's 128x128, step 4's 128x256), each result checked and the
    workspace inspected after each call."""
    M, N = 520, 400
    for K, step, variant, splits in [(2048, 5, 10, None), (4096, 5, 10, None), (2048, 5, 8, 5), (1024, 5, 10, None),
                                     (64, 5, 10, None), (3072, 5, 8, 3), (2048, 5, 10, None),
                                     (2048, 4, 9, None), (4096, 4, 9, None), (64, 4, 9, None), (1040, 4, 9, None)]:
        dy, x = randn(K, M), randn(K, N)
        c = gemm.matmul(dy.t(), x, step=step, variant=variant, splits=splits)
        check(c, dy.double().t() @ x.double(), torch.bfloat16, (K, step, variant))
        sums, arrivals = workspace(M, N, *((128, 256) if step == 4 else (128, 128)))
        torch.cuda.synchronize()
        assert not sums.any() and not arrivals.any(), (K, step, variant)


@gpu
def test_first_call_inside_a_capture_takes_the_old_path():
    # a shape whose 128x128 tile grid (12 x 3) no other test uses: the workspace is keyed by the
    # grid, and test_gemm_splitk.py's own capture test (run after this file) needs ITS grid unmade
    M, K, N = 1424, 4096, 336
    dy, x = randn(K, M), randn(K, N)
    dev = torch.device("cuda", torch.cuda.current_device())
    assert workspace(M, N) is None and gemm.schedule_tensor(dev, M, N, K, 128, 128, allocate=False) is None
    gemm.matmul(dy.t(), x, step=5, variant=7, splits=4)   # 5v7's kernel set up before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = gemm.matmul(dy.t(), x, step=5, variant=10)
    assert workspace(M, N) is None and gemm.schedule_tensor(dev, M, N, K, 128, 128, allocate=False) is None
    g.replay()
    torch.cuda.synchronize()
    check(c, dy.double().t() @ x.double(), torch.bfloat16, "captured first call")
    check(gemm.matmul(dy.t(), x, step=5, variant=10), dy.double().t() @ x.double(), torch.bfloat16, "eager after")
    assert workspace(M, N) is not None


@gpu
@pytest.mark.parametrize("step,variant", VARIANTS)
def test_kernel_only_launch_is_a_whole_product(step, variant):
    dy, x = randn(4096, 640), randn(4096, 256)
    launch, c = gemm.kernel_only(dy.t(), x, step=step, variant=variant)
    for _ in range(2):
        c.fill_(float("nan"))
        launch()
        check(c, dy.double().t() @ x.double(), torch.bfloat16, "kernel_only")


@gpu
@pytest.mark.parametrize("step,variant", VARIANTS)
def test_against_the_old_split_k(step, variant):
    """The scheduled variants and 5v7 (equal splits) agree to fp32 rounding in fp32 output. Their
    pieces end at other k, so the sums are grouped differently: ~1.4e-6 measured (call 2), where
    a lost or doubled piece would be > 0.1."""
    dy, x = randn(8192, 768), randn(8192, 768)
    new = gemm.matmul(dy.t(), x, step=step, variant=variant, out_dtype=torch.float32)
    old = gemm.matmul(dy.t(), x, step=5, variant=7, splits=6, out_dtype=torch.float32)
    assert rel_err(new, old) < 1e-5


@gpu
def test_schedule_checks():
    ext = gemm._ext.module
    M, K, N = 256, 2048, 256
    dy, x = randn(K, M), randn(K, N)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    sums = torch.zeros(M * N, device="cuda")
    arrivals = torch.zeros(4 * 4, device="cuda", dtype=torch.int32)
    table = gemm.schedule_table(gemm.stream_schedule(M, N, K, 132)).cuda()
    base = (5, dy, x, c, True, True, None, False, 1, 10)
    with pytest.raises(RuntimeError, match="variant 10 needs a schedule"):
        ext.run(*base, sums, arrivals)
    with pytest.raises(RuntimeError, match="variant 10 needs a zeroed workspace"):
        ext.run(*base, sums[:-1], arrivals, table)
    with pytest.raises(TypeError, match="schedule must be int32"):
        ext.run(*base, sums, arrivals, table.long())
    with pytest.raises(ValueError, match="schedule must be a contiguous"):
        ext.run(*base, sums, arrivals, table.view(-1))
    with pytest.raises(ValueError, match="schedule must be on a's device"):
        ext.run(*base, sums, arrivals, table.cpu())
    with pytest.raises(RuntimeError, match="pass splits = 1"):
        ext.run(5, dy, x, c, True, True, None, False, 3, 10, sums, arrivals, table)
    ext.run(*base, sums, arrivals, table)                               # exactly enough: runs
    torch.cuda.synchronize()
    check(c, dy.double().t() @ x.double(), torch.bfloat16, "exact workspace")
    assert not sums.any() and not arrivals.any()
    # step 4 variant 9: 2 tiles of 128x256, 8 counters each
    table4 = gemm.schedule_table(gemm.stream_schedule(M, N, K, 132, 128, 256)).cuda()
    base4 = (4, dy, x, c, True, True, None, False, 1, 9)
    with pytest.raises(RuntimeError, match="variant 9 needs a zeroed workspace"):
        ext.run(*base4, sums, arrivals[:-1], table4)
    with pytest.raises(RuntimeError, match="variant 9 needs a schedule"):
        ext.run(*base4, sums, arrivals)
    c.fill_(float("nan"))
    ext.run(*base4, sums, arrivals, table4)
    torch.cuda.synchronize()
    check(c, dy.double().t() @ x.double(), torch.bfloat16, "step 4 exact workspace")
    assert not sums.any() and not arrivals.any()

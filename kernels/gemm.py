"""GEMM on tk: C = A·B for the three products of a linear layer, in four lesson steps.

    from kernels.gemm import matmul
    y  = matmul(x, W.t())          # y = x·Wᵀ   (nn.Linear forward)
    dx = matmul(dy, W)             # dx = dy·W
    dW = matmul(dy.t(), x)         # dW = dyᵀ·x (reduction over tokens: split-K)

Arguments are bf16 CUDA matrices, A: M x K and B: K x N, given as torch gives them (plain or
transposed views); the layout each operand really has in memory is read from its strides and
passed to the kernel, which reads it in place (step 4) — no transposed copies. Output is bf16
(like torch.matmul) or fp32 (out_dtype=torch.float32), accumulated in fp32 either way.
Any M (the tail is handled inside the kernels); N and K must be multiples of 16.

Steps (kernels/gemm_<n>_*.cu; what each changes and buys is in its header and kernels/NOTES.md):
  1 warp mma.sync from global memory    3 wgmma fed by TMA
  2 shared tiles + cp.async pipeline     4 warp-specialized, persistent, TMA-store epilogue
Steps 1-3 take only the x·Wᵀ layout: other products are given to them as transposed copies.
Step 4 adds the fused epilogue (bias, GELU) and split-K for products with few output tiles.
Step 5 (kernels/gemm_5_pingpong.cu) gives each consumer warpgroup its own tile and alternates
their main loops so one's epilogue overlaps the other's math: it wins where K is short (GPT-2's
K = 768 products) and loses where K is long, so `auto_step` picks per shape, and matmul(step=0)
uses it.

Variants 6 and 7 of steps 4 and 5 and variant 8 of step 4 (session 6) run the plain product
C = A·B only (no bias, no GELU) with an epilogue compiled for exactly that
(kernels/gemm_plain_epilogue.cuh): the same pipelines as step 4 v0 / v5 / v0 and step 5 v1 / v0,
bit-identical results, far fewer epilogue instructions per tile (step 4 v8 also overlaps a
tile's stores with the next tile's first k-steps). matmul(step=0) without bias/GELU runs 4v8,
or for products with few output tiles 5v10 or 5v7 (auto_step(plain=True), below); with
bias/GELU, the rule above.
Variant 8 of step 5 (session 7; kernels/gemm_splitk_epilogue.cuh) is 5v7 with the
split-K finished in the kernel: the last split
of a tile sums the others' partials from a workspace the kernel keeps zeroed and stores the tile
in the output dtype, so a weight gradient is one kernel (no memset of an fp32 buffer, no
conversion kernel); see splitk_workspace for the workspace's lifetime (one per device and shape;
not two same-shape products on two streams at once). Correct and sanitizer-clean on the H200, but
1-5% slower than 5v7 with its memset and conversion (session 7, call 4): opt-in, not the default.
Variant 10 of step 5 and variant 9 of step 4 (session 8) run 8's protocol on a schedule
planned here (stream_schedule): every CTA gets the same number of k-tiles as whole tiles plus one
or two k-pieces (or, with fewer tiles than SMs, one tile's head or a share of the tails), so a CTA
sends one or two fp32 partials instead of ~10 and nothing is left for a memset or a conversion
kernel; 4v9 does it on step 4's 128x256 tile. See stream_schedule and
kernels/gemm_splitk_epilogue.cuh. On the H200 (session 8, calls 2-3, CUDA graphs): 5v10 at
0.95-1.03 / 1.07 / 1.03x cuBLAS at dW 3072x768 / 768x3072 / 2304x768 where 5v7 ran 0.87-0.91 /
0.94 / 0.97x, so it is matmul(step=0)'s choice there; at dW 768x768 (36 tiles) 0.96x against
5v7's 1.04x, so 5v7 stays there. 4v9: slower than 5v10, opt-in (5v11, a piece arriving one tile
later as in 8, was slower too and was removed after the session; code at commit 553a564).

Two environment variables, for experiments with the 2-CTA cluster variants (step 4 v5, step 5
v3/v4; read at each launch by launch_pairs in kernels/gemm_4_warp_specialized.cuh):
TK_GEMM_CLUSTERS=n launches n clusters instead of as many as fit (a positive integer; unset or
empty: as many as fit; anything else: RuntimeError), TK_GEMM_VERBOSE=1 prints each cluster
launch to stderr.
"""
import functools
from typing import NamedTuple

import torch

from .build import LazyExtension
from .checks import fail, require_tensor, shape_str

_ext = LazyExtension("tk_gemm", ["gemm_bindings.cpp", "gemm_1_warp_mma.cu", "gemm_2_cp_async.cu",
                                  "gemm_3_wgmma_tma.cu", "gemm_4_warp_specialized.cu", "gemm_5_pingpong.cu"],
                     hopper=True)

STEPS = (0, 1, 2, 3, 4, 5)                 # 0: auto_step picks 4 or 5 by shape
TILE_M, TILE_N, TILE_K = 128, 256, 64      # step 4's CTA tile (kernels/gemm_4_warp_specialized.cu)
VARIANTS = {0: "4 stages x K64, free stage s-1 after issuing s", 1: "4 stages x K64, drain and free each stage",
            2: "8 stages x K32, free stage s-1 after issuing s", 3: "8 stages x K32, drain and free each stage",
            4: "3 stages x K64, 4 output staging boxes per warp",
            5: "4 stages x K64, 2-CTA clusters sharing B by TMA multicast",
            6: "4 stages x K64, plain epilogue (no bias/GELU; stmatrix staging, no per-value branches)",
            7: "4 stages x K64, 2-CTA clusters sharing B by TMA multicast, plain epilogue (no bias/GELU)",
            8: "4 stages x K64, plain epilogue deferred: a tile's bf16 stores overlap the next tile's first k-steps",
            9: "4 stages x K64, plain epilogue, a planned schedule: whole tiles + k-pieces summed in the kernel"}
# Step 5's variants (kernels/gemm_5_pingpong.cu): one consumer's tile and the ring depth.
VARIANTS5 = {0: "128x128 per consumer, 6 stages", 1: "64x256 per consumer, 4 stages", 2: "128x128 per consumer, 4 stages",
             3: "128x128 per consumer, 6 stages, 2-CTA clusters sharing B by TMA multicast",
             4: "64x256 per consumer, 4 stages, 2-CTA clusters sharing B by TMA multicast",
             5: "64x256 per consumer, 5 stages, 1 output staging box per warp",
             6: "64x256 per consumer, 4 stages, plain epilogue (no bias/GELU; stmatrix staging)",
             7: "128x128 per consumer, 6 stages, plain epilogue (no bias/GELU; stmatrix staging)",
             8: "128x128 per consumer, 6 stages, plain epilogue, split-K finished in the kernel (no memset, no conversion)",
             10: "128x128 per consumer, 6 stages, plain epilogue, a planned schedule: whole tiles + k-pieces summed in the kernel"}
TILES5 = {0: (128, 128), 1: (64, 256), 2: (128, 128), 3: (128, 128), 4: (64, 256), 5: (64, 256), 6: (64, 256), 7: (128, 128),
          8: (128, 128), 10: (128, 128)}
PLAIN_VARIANTS = {4: (6, 7, 8, 9), 5: (6, 7, 8, 10)}   # kernels/gemm_plain_epilogue.cuh (session 6): the plain product only
# kernels/gemm_splitk_epilogue.cuh (session 7): split-K whose last split stores the tile (bf16 or
# fp32) from a workspace the kernel keeps zeroed (splitk_workspace below)
FUSED_SPLITK = {5: (8,)}   # (session 7's 5v9, one arrival per consumer, timed as 5v8 and was removed)
# ... and (session 8) the same protocol on a schedule planned here (stream_schedule below): whole
# tiles plus a few k-pieces per CTA instead of `splits` equal pieces of every tile
SCHEDULED = {4: (9,), 5: (10,)}


def auto_step(M, N, K, plain=False, num_sms=132):
    """(step, variant) that wins at this shape on the H200.
    plain=True (no bias, no GELU: the plain epilogue, kernels/gemm_plain_epilogue.cuh; session 6,
    call 2): step 4 v8 (cooperative 128x256, stores deferred into the next tile's k-steps:
    1.02-1.11x cuBLAS at 8192³ and every GPT-2 forward shape) unless the product has too few
    128x256 tiles to fill the SMs twice (the weight gradients: split-K). Among those, products with
    at least half as many 128x128 tiles as SMs run step 5 v10 (ping-pong 128x128 on the planned
    schedule, stream_schedule: whole tiles or heads + a few k-pieces summed in the kernel; session 8,
    call 2: 1.03 / 1.08 / 1.03x cuBLAS at dW 3072x768, 768x3072, 2304x768 where v7 ran 0.91 / 0.94 /
    0.97x), and the rest step 5 v7 (equal split-K + memset + conversion: 1.04x at dW 768x768, where
    v10's tails, shared by 96 of 132 CTAs at scattered k, read their operands from HBM several
    times: 0.96x). Step 5 v8 (equal splits finished in the kernel, session 7) ran 1-17% slower than
    v7: opt-in (kernels/NOTES.md).
    plain=False (a fused bias/GELU; kernels/NOTES.md, session 3, call 2): step 5's ping-pong on
    64x256 consumer tiles when a tile's K loop is short (K <= 1024: its epilogue overlap pays,
    0.78-0.80x cuBLAS against step 4's 0.70-0.75x), step 4 otherwise."""
    if plain:
        if -(-M // TILE_M) * -(-N // TILE_N) >= 2 * num_sms:
            return (4, 8)
        return (5, 10) if 2 * -(-M // 128) * -(-N // 128) >= num_sms else (5, 7)
    return (5, 1) if K <= 1024 else (4, 0)


def why_not():
    """None if the GEMM extension is (or can be) loaded here, else the reason."""
    return _ext.why_not()


def _row_major(t):
    """Dense rows: t[i][j] at i*cols + j (a plain contiguous matrix)."""
    return t.stride(1) == 1 and t.stride(0) == t.size(1)


def _col_major(t):
    """Dense columns: t[i][j] at j*rows + i (the transpose view of a contiguous matrix)."""
    return t.stride(0) == 1 and t.stride(1) == t.size(0)


_sms = {}


def _num_sms(device):
    if device not in _sms:
        _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sms[device]


def _aligned(t):
    return t.data_ptr() % 16 == 0


@functools.lru_cache(maxsize=256)
def choose_splits(M, N, K, num_sms, epilogue=False, tile_n=TILE_N, tile_m=TILE_M):
    """Split-K factor for step 4. Few output tiles (the weight gradient: 768 x 3072 is 72 tiles
    for 132 SMs) leave SMs idle, so the K range is cut into `splits` pieces whose fp32 partials
    are reduce-added by TMA. Model: time ~ waves x (k-tiles per unit + the epilogue, worth about
    3 k-tiles when it reduce-adds fp32); pick the cheapest."""
    tiles = -(-M // tile_m) * -(-N // tile_n)
    k_tiles = -(-K // TILE_K)
    if epilogue or tiles >= 2 * num_sms or k_tiles < 16:
        return 1
    best, best_cost = 1, None
    for s in range(1, min(16, k_tiles // 8) + 1):
        waves = -(-tiles * s // num_sms)
        cost = waves * (k_tiles / s + (3 if s > 1 else 1))
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


OP = "kernels.gemm.matmul"
BF16 = (torch.bfloat16,)


def check_inputs(a, b, *, out_dtype=torch.bfloat16, bias=None, gelu=False, step=4, splits=None, out=None,
                 variant=0, cuda=True):
    """Raise TypeError/ValueError naming the argument unless matmul takes these arguments: the
    conditions of gemm_bindings.cpp, checked in Python (kernels/checks.py says why), and
    matmul's own. cuda=False skips the device checks (CPU tests)."""
    for name, t in (("a", a), ("b", b)):
        require_tensor(OP, name, t, cuda=False)
        if t.dim() != 2:
            fail(OP, f"{name} must be a 2-D matrix (got {t.dim()}-D); flatten leading dims first")
        require_tensor(OP, name, t, dtypes=BF16, cuda=cuda, same_device_as=None if name == "a" else ("a", a))
    if a.shape[1] != b.shape[0]:
        fail(OP, f"inner dimensions differ: a is {shape_str(a.shape)}, b is {shape_str(b.shape)}")
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    if N % 16 or K % 16:
        fail(OP, f"N and K must be multiples of 16 (got M={M}, K={K}, N={N}); pad the weight to a multiple of 16")
    if not 1 <= M < 2**31 or N >= 2**31 or K >= 2**31:
        fail(OP, f"M must be at least 1 and M, N, K below 2^31 (got M={M}, K={K}, N={N})")
    if step not in STEPS:
        fail(OP, f"step must be one of {STEPS} (got {step})")
    variants = VARIANTS5 if step == 5 else VARIANTS
    if variant not in variants or (step == 0 and variant != 0):
        fail(OP, f"variant must be one of {sorted(variants) if step else [0]} for step {step} (got {variant})")
    if out_dtype not in (torch.bfloat16, torch.float32):
        fail(OP, f"out_dtype must be torch.bfloat16 or torch.float32 (got {out_dtype})")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        fail(OP, f"splits must be None (choose) or an integer >= 1 (got {splits!r})")
    epilogue = bias is not None or gelu
    if epilogue and variant in PLAIN_VARIANTS.get(step, ()):
        fail(OP, f"variant {variant} of step {step} is the plain product (no bias, no GELU); use variant 0 (step 4) "
                 "or 1 (step 5) to fuse them")
    if epilogue and 0 < step < 4:
        fail(OP, "bias and gelu are fused only in steps 4 and 5 (and 0, which picks one of them)")
    if epilogue and splits is not None and splits > 1:
        fail(OP, "split-K cannot fuse bias/gelu (they would be applied once per split); pass splits=1 or None")
    if variant in SCHEDULED.get(step, ()) and splits is not None and splits != 1:
        fail(OP, f"variant {variant} of step {step} plans its own split of K (stream_schedule); pass splits=None")
    if bias is not None:
        require_tensor(OP, "bias", bias, dtypes=BF16, cuda=cuda, same_device_as=("a", a))
        if bias.dim() != 1 or bias.numel() != N or not bias.is_contiguous():
            fail(OP, f"bias must be a contiguous bfloat16 vector of length N={N} (got shape {shape_str(bias.shape)}, "
                     f"strides {tuple(bias.stride())})")
    if out is not None:
        ok = isinstance(out, torch.Tensor) and out.shape == (M, N) and out.dtype == out_dtype and out.is_contiguous()
        ok = ok and (not cuda or out.device == a.device) and out.data_ptr() % 16 == 0
        if not ok:
            fail(OP, f"out must be a contiguous, 16-byte aligned {out_dtype} tensor of shape ({M}, {N}) on {a.device}")


def check(a, b):
    """None if matmul can take these operands, else what is wrong and what to do."""
    try:
        check_inputs(a, b)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


class Plan(NamedTuple):
    """What matmul decides from the operands' metadata alone (no tensor, no pointer in it, so a
    cached plan cannot point at another call's data): the step and variant to run, how each
    operand is handed to the kernel, the split-K factor and step 2's K padding."""
    step: int
    variant: int
    a_t: bool      # pass a.t() as [K][M] storage (a is a dense column-major view); else a.contiguous() as [M][K]
    b_mode: str    # "t": b.t() as [N][K] (b = W.t()); "c": b.contiguous() as [K][N]; "tc": a [N][K] copy (steps 1-3)
    splits: int
    pad_k: int     # step 2 moves K in 32-wide tiles: zeros appended to K


PLAN_CACHE = True      # kernels/gemm_bench.py turns it off to measure what it saves
_plans = {}            # metadata key -> Plan, for inputs that already passed check_inputs


def _plan_key(a, b, out_dtype, bias, gelu, step, splits, out, variant, cuda):
    """Everything check_inputs and the plan read, as a hashable tuple (types too: splits=True
    must not hit splits=1's entry), or None when that cannot be built (not tensors, unhashable
    arguments): those calls take the checked path and its error message."""
    try:
        meta = lambda t: None if t is None else (t.shape, t.stride(), t.dtype, t.device)
        key = (meta(a), meta(b), out_dtype, meta(bias), type(gelu), gelu, type(step), step, type(splits), splits,
               type(variant), variant, meta(out), None if out is None else out.data_ptr() % 16, cuda)
        hash(key)
        return key
    except (AttributeError, TypeError, RuntimeError):
        return None


def plan(a, b, *, out_dtype=torch.bfloat16, bias=None, gelu=False, step=4, splits=None, out=None, variant=0, cuda=True):
    """The Plan matmul runs for these arguments, after check_inputs. Cached (PLAN_CACHE) on the
    metadata key: a call with the same shapes, strides, dtypes, devices and options as one that
    passed the checks skips them (they are ~20 Python attribute reads and comparisons per call,
    which matter when the kernel takes 30 µs). The kernel's own C++ checks still run every call.
    cuda=False skips the device checks (CPU tests; kept apart in the cache)."""
    key = _plan_key(a, b, out_dtype, bias, gelu, step, splits, out, variant, cuda) if PLAN_CACHE else None
    if key is not None:
        hit = _plans.get(key)
        if hit is not None:
            return hit
    check_inputs(a, b, out_dtype=out_dtype, bias=bias, gelu=gelu, step=step, splits=splits, out=out,
                 variant=variant, cuda=cuda)
    epilogue = bias is not None or gelu
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    if step == 0:
        step, variant = auto_step(M, N, K, plain=not epilogue, num_sms=_num_sms(a.device) if cuda else 132)
        if variant in SCHEDULED.get(step, ()) and splits is not None:
            variant = 7                         # a split count asked for: equal splits (5v7), as asked
    # How each operand sits in memory. A: [M][K] (K-major) or [K][M] (M-major, a = t.t());
    # B: [N][K] (K-major, b = W.t()) or [K][N] (N-major). Anything else becomes a copy.
    a_t = step >= 4 and M % 16 == 0 and _col_major(a) and not _row_major(a)
    if _col_major(b) and not _row_major(b):     # b = W.t(): W [N][K] contiguous
        b_mode = "t"
    else:
        b_mode = "c" if step >= 4 else "tc"
    if step >= 4 and a_t and b_mode == "t":     # the one pairing step 4 does not instantiate
        b_mode = "c"
    if variant in SCHEDULED.get(step, ()):
        splits = 1                              # the schedule splits K (stream_schedule)
    if step >= 4 and splits is None:
        tm, tn = (TILE_M, TILE_N) if step == 4 else TILES5[variant]
        splits = choose_splits(M, N, K, _num_sms(a.device) if cuda else 132, epilogue, tn, tm)
    p = Plan(step, variant, a_t, b_mode, splits or 1, 32 - K % 32 if step == 2 and K % 32 else 0)
    if p.splits > 1 and epilogue:   # choose_splits returns 1 with an epilogue; kept as a guard
        raise ValueError("kernels.gemm.matmul: split-K cannot fuse bias/gelu (they would be applied once per split)")
    if key is not None:
        if len(_plans) >= 1024:
            _plans.clear()
        _plans[key] = p
    return p


# ---- the workspace of the in-kernel split-K (step 5 variants 8 and 10; step 4 variant 9) ----
# fp32 running sums (tiles x BM x BN, in accumulator order) and int32 arrival counters (one per
# 16 KB piece, a consumer warp's share of a tile: 4 a tile of 128x128, 8 of 128x256), zero when allocated; each call's last split of a tile reads
# its sums, writes zeros back and resets its counters, so they are zero again when the kernel
# ends: nothing is cleared per call (kernels/gemm_splitk_epilogue.cuh).
# Lifetime: one pair per (device, tile, tile grid), kept for the life of the process (never freed:
# a CUDA graph that captured a call holds the pointers). So
#   - calls on ONE stream (eager or in graphs, replayed in any order) share it safely: each call
#     finds it zero, whatever ran before;
#   - two products of the same shape running AT THE SAME TIME on two streams would share it and
#     corrupt each other's sums: not supported (the training loop runs its GEMMs on one stream);
#   - the first call of a shape must not be inside a CUDA graph capture (its allocation's zeroing
#     would be captured, not run); such a call takes the old split-K path (memset + reduce-add +
#     conversion; variant 7, the same tile) instead. torch's usual warm-up before capture
#     (which gemm_bench's capture() does) makes the workspace first.
_splitk_ws = {}


def splitk_workspace(device, M, N, tile_m, tile_n, allocate=True):
    """(sums, arrivals) for an M x N product on tiles of tile_m x tile_n, made (zeroed) on first use;
    None if it does not exist yet and allocate=False."""
    tm, tn = -(-M // tile_m), -(-N // tile_n)
    key = (device, tile_m, tile_n, tm, tn)
    ws = _splitk_ws.get(key)
    if ws is None and allocate:
        ws = (torch.zeros(tm * tn * tile_m * tile_n, device=device, dtype=torch.float32),
              torch.zeros(tm * tn * tile_m * tile_n // 4096, device=device, dtype=torch.int32))   # 16 KB pieces
        _splitk_ws[key] = ws
    return ws


def _fused_workspace(p, a, M, N):
    """The workspace for plan p, or None: p does not split in the kernel, or this is a graph
    capture and the workspace does not exist yet (the caller then takes the old split-K path)."""
    if p.splits == 1 or p.variant not in FUSED_SPLITK.get(p.step, ()):
        return None
    tile_m, tile_n = TILES5[p.variant]
    ws = splitk_workspace(a.device, M, N, tile_m, tile_n, allocate=False)
    if ws is None and not torch.cuda.is_current_stream_capturing():
        ws = splitk_workspace(a.device, M, N, tile_m, tile_n)
    return ws


# ---- the work schedule of step 5 variant 10 and step 4 variant 9 (kernels/gemm_splitk_epilogue.cuh,
# scheduled_splitk_epilogue) ----
GROUP_M = 16    # kernels/gemm_4_warp_specialized.cuh unit_work's raster: tile rows walked together
MIN_SHARE = 8   # k-tiles a CTA gets at least (a piece's arrival and sum cost about 3 k-tiles)


def raster_tile(t, tiles_m, tiles_n, group=GROUP_M):
    """(tile row, tile column) of the t-th tile in unit_work's order (`group` rows at a time,
    column by column within a group), so that tiles near in t share A rows or B columns."""
    per_group = group * tiles_n
    first_m = (t // per_group) * group
    rows = min(tiles_m - first_m, group)
    in_group = t % per_group
    return first_m + in_group % rows, in_group // rows


@functools.lru_cache(maxsize=64)
def stream_schedule(M, N, K, num_sms, tile_m=128, tile_n=128):
    """Per CTA, the units it runs in order: tuples (tile row, tile column, k_begin, k_end) in
    k-tiles of 64. Every CTA gets the same number of k-tiles (to one), in as few pieces as that
    allows, and the units that start together start at k = 0 together (they read the same A
    and B columns at the same time, which L2 then serves once):
      - tiles >= CTAs: each CTA runs floor(tiles / CTAs) WHOLE tiles; the R tiles left over are cut
        into one contiguous share of their R x k_tiles k-tiles per CTA (at most two pieces each),
        and a CTA runs its pieces FIRST (their summing then overlaps a whole tile's main loop);
      - tiles < CTAs: tile t's HEAD (k-tiles 0..h-1, h = tiles x k_tiles // CTAs, the fair share)
        runs alone on CTA CTAs - tiles + t; the first CTAs - tiles CTAs share all the tails.
    A tile is summed in the kernel when it is cut (the pieces' k-tiles add up to k_tiles). Small
    products use fewer CTAs, so that each gets MIN_SHARE k-tiles or more."""
    tiles_m, tiles_n = -(-M // tile_m), -(-N // tile_n)
    tiles, k_tiles = tiles_m * tiles_n, -(-K // 64)
    P = max(1, min(int(num_sms), tiles * k_tiles // MIN_SHARE))   # small products: fewer CTAs, not tiny pieces
    lists = [[] for _ in range(P)]

    def share(tile_ids, k_from, ctas, group=GROUP_M):
        """Cut k-tiles k_from.. of every tile in tile_ids (in that order, end to end) into equal
        contiguous shares, one per CTA in ctas."""
        span = k_tiles - k_from
        total, n = len(tile_ids) * span, len(ctas)
        for j, c in enumerate(ctas):
            pos, hi = j * total // n, (j + 1) * total // n
            while pos < hi:
                i, off = divmod(pos, span)
                end = min(hi, (i + 1) * span)
                lists[c].append((*raster_tile(tile_ids[i], tiles_m, tiles_n, group), k_from + off, k_from + off + end - pos))
                pos = end

    if tiles >= P:
        whole, left = divmod(tiles, P)
        # The tiles left over are cut, all their pieces run at once, and each reads its tile's A
        # rows and B columns over all of K: taken as a near-square block of tiles (a raster
        # `group` rows high: 3 x 4 tiles at dW 3072x768, 28 MB of operands instead of the 52 MB of
        # a 12 x 1 column) they read the fewest bytes.
        group = max(1, min(tiles_m, round(left ** 0.5)))
        share(list(range(left)), 0, list(range(P)), group)   # the pieces first
        for w in range(whole):
            for c in range(P):
                lists[c].append((*raster_tile(left + w * P + c, tiles_m, tiles_n, group), 0, k_tiles))
    else:
        h = tiles * k_tiles // P
        if h == 0:                                            # tiny: everything shared
            share(list(range(tiles)), 0, list(range(P)))
        else:
            share(list(range(tiles)), h, list(range(P - tiles)))
            for t in range(tiles):
                lists[P - tiles + t].append((*raster_tile(t, tiles_m, tiles_n), 0, h))
    return tuple(tuple(units) for units in lists)


def schedule_table(schedule):
    """The schedule as the kernel reads it: int32 [units per CTA][CTAs][4], unit u = (u // CTAs)-th
    of CTA u % CTAs; a CTA's list ends at its first empty entry (0, 0, 0, 0)."""
    P, U = len(schedule), max(len(units) for units in schedule)
    table = torch.zeros((U, P, 4), dtype=torch.int32)
    for c, units in enumerate(schedule):
        for i, unit in enumerate(units):
            table[i, c] = torch.tensor(unit, dtype=torch.int32)
    return table


_schedules = {}


def schedule_tensor(device, M, N, K, tile_m, tile_n, allocate=True):
    """stream_schedule's table on the device, made on first use and kept (like the workspace: a CUDA
    graph that captured a call holds its pointer); None if absent and allocate=False."""
    key = (device, M, N, K, tile_m, tile_n)
    t = _schedules.get(key)
    if t is None and allocate:
        t = schedule_table(stream_schedule(M, N, K, _num_sms(device), tile_m, tile_n)).to(device)
        _schedules[key] = t
    return t


def _scheduled_args(p, a, M, N, K):
    """(sums, arrivals, schedule) for plan p, or None: p is not scheduled, or this is a graph capture
    and they do not exist yet (the caller then takes the old split-K path, 5v7)."""
    if p.variant not in SCHEDULED.get(p.step, ()):
        return None
    tile_m, tile_n = (TILE_M, TILE_N) if p.step == 4 else TILES5[p.variant]
    ws = splitk_workspace(a.device, M, N, tile_m, tile_n, allocate=False)
    sched = schedule_tensor(a.device, M, N, K, tile_m, tile_n, allocate=False)
    if (ws is None or sched is None) and torch.cuda.is_current_stream_capturing():
        return None
    ws = ws or splitk_workspace(a.device, M, N, tile_m, tile_n)
    sched = sched if sched is not None else schedule_tensor(a.device, M, N, K, tile_m, tile_n)
    return (*ws, sched)


def _old_splitk_plan(p, a, M, N, K):
    """5v7 with choose_splits: what a scheduled or in-kernel split-K plan runs instead when its
    first call is inside a graph capture."""
    return p._replace(variant=7, splits=choose_splits(M, N, K, _num_sms(a.device), False, 128, 128))


def _operands(p, a, b):
    """a and b as the kernel reads them under plan p: dense storage, 16-byte aligned bases (TMA
    wants them; a view into the middle of a tensor may not be), step 2's K padding."""
    a_store = a.t() if p.a_t else a.contiguous()
    b_store = b.t() if p.b_mode == "t" else b.contiguous() if p.b_mode == "c" else b.t().contiguous()
    a_store = a_store if _aligned(a_store) else a_store.clone()
    b_store = b_store if _aligned(b_store) else b_store.clone()
    if p.pad_k:
        a_store = torch.nn.functional.pad(a_store, (0, p.pad_k))
        b_store = torch.nn.functional.pad(b_store, (0, p.pad_k))
    return a_store, b_store


def matmul(a, b, *, out_dtype=torch.bfloat16, bias=None, gelu=False, step=4, splits=None, out=None, variant=0):
    """C = A·B (then + bias, then GELU(tanh)) with GEMM step `step`; see the module docstring.
    `out`: an optional contiguous M x N tensor of out_dtype to write into (returned).
    `splits`: the split-K factor (None: choose_splits). `variant`: step 4's pipeline
    configuration (VARIANTS) or step 5's tile (VARIANTS5); 0 is each step's default.
    step=0 picks step 4 or 5 by shape (auto_step)."""
    p = plan(a, b, out_dtype=out_dtype, bias=bias, gelu=gelu, step=step, splits=splits, out=out, variant=variant)
    M, N = a.shape[0], b.shape[1]
    a_store, b_store = _operands(p, a, b)
    if p.variant in SCHEDULED.get(p.step, ()):
        sched = _scheduled_args(p, a, M, N, a.shape[1])
        if sched is not None:                   # whole tiles + pieces summed in the kernel: c is written once
            c = out if out is not None else torch.empty((M, N), device=a.device, dtype=out_dtype)
            _ext.module.run(p.step, a_store, b_store, c, p.a_t, p.b_mode == "c", None, False, 1, p.variant, *sched)
            return c
        p = _old_splitk_plan(p, a, M, N, a.shape[1])   # first call inside a capture
    ws = _fused_workspace(p, a, M, N)
    if ws is not None:                          # split-K finished in the kernel: c is written once
        c = out if out is not None else torch.empty((M, N), device=a.device, dtype=out_dtype)
        _ext.module.run(p.step, a_store, b_store, c, p.a_t, p.b_mode == "c", None, False, p.splits, p.variant, *ws)
        return c
    if p.splits > 1 and p.variant in FUSED_SPLITK.get(p.step, ()):   # first call inside a capture
        p = p._replace(variant=7)
    if p.splits > 1:                            # fp32 partials are reduce-added into zeros
        c = out.zero_() if out is not None and out_dtype == torch.float32 else \
            torch.zeros((M, N), device=a.device, dtype=torch.float32)
    else:
        c = out if out is not None else torch.empty((M, N), device=a.device, dtype=out_dtype)
    _ext.module.run(p.step, a_store, b_store, c, p.a_t, p.b_mode == "c", bias, gelu, p.splits, p.variant)
    if c.dtype != out_dtype or (out is not None and c is not out):
        c = out.copy_(c) if out is not None else c.to(out_dtype)
    return c


def kernel_only(a, b, *, step=0, variant=0):
    """For kernels/gemm_bench.py: (launch, c) where launch() runs only the kernel matmul(a, b,
    step=step, variant=variant) would run, on operands and an output prepared once here, so
    timing it leaves out the host path (checks, plan, allocation) and, for split-K, the zeroing
    and the fp32 -> bf16 conversion. With split-K, c (fp32, zeroed once) then holds the sum of
    all launches: launch() is for timing, not for results (with the in-kernel split-K of step 5
    variant 8 each launch is a whole product into a bf16 c: there is nothing left out). launch holds the prepared operands
    and c: keep it alive as long as any CUDA graph that captured it (kernels/gemm_bench.py)."""
    p = plan(a, b, step=step, variant=variant)
    a_store, b_store = _operands(p, a, b)
    run = _ext.module.run
    sched = _scheduled_args(p, a, a.shape[0], b.shape[1], a.shape[1])
    if sched is not None:                       # scheduled: every launch is a whole product too
        c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=torch.bfloat16)
        return (lambda: run(p.step, a_store, b_store, c, p.a_t, p.b_mode == "c", None, False, 1, p.variant, *sched)), c
    ws = _fused_workspace(p, a, a.shape[0], b.shape[1])
    if ws is not None:                          # in-kernel split-K: every launch is a whole product
        c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=torch.bfloat16)
        return (lambda: run(p.step, a_store, b_store, c, p.a_t, p.b_mode == "c", None, False, p.splits, p.variant, *ws)), c
    c = torch.zeros((a.shape[0], b.shape[1]), device=a.device, dtype=torch.float32 if p.splits > 1 else torch.bfloat16)
    return (lambda: run(p.step, a_store, b_store, c, p.a_t, p.b_mode == "c", None, False, p.splits, p.variant)), c


# ---- bench.py registry (engineer B's driver): the per-shape best step (auto_step: step 5 on
# 64x256 tiles for K <= 1024, step 4 otherwise) vs torch.matmul at the headline shapes ----
def _register_bench():
    import sys
    bench = sys.modules.get("__main__")
    if not (hasattr(bench, "register") and hasattr(bench, "Case")):
        bench = sys.modules.get("bench")
    if not (hasattr(bench, "register") and hasattr(bench, "Case")):
        return

    @bench.register("gemm")
    def gemm_cases(quick):
        """C = A·B, bf16 in/out, fp32 accumulate: y = x·Wᵀ ('fwd', M x K x N) and the weight
        gradient dyᵀ·x ('dW', K = tokens) of GPT-2's four linear layers at 16k tokens."""
        shapes = [("fwd", 8192, 8192, 8192)]
        for k_in, n_out in [(768, 3072), (3072, 768), (768, 2304), (768, 768)]:
            shapes += [("fwd", 16384, k_in, n_out), ("dW", n_out, 16384, k_in)]
        for kind, M, K, N in (shapes[:3] if quick else shapes):
            def make(kind=kind, M=M, K=K, N=N):
                r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)
                return (r(M, K), r(N, K).t()) if kind == "fwd" else (r(K, M).t(), r(K, N))
            yield bench.Case("gemm", f"{kind} {M}x{K}x{N}", "TFLOP/s", 2.0 * M * N * K, make,
                             lambda f, inp: f(*inp), impls={"tk": functools.partial(matmul, step=0), "eager": torch.matmul},
                             compile=False, note="M x K x N; dW: A = dy^T, B = x")


_register_bench()

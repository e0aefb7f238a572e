"""The LayerNorm kernels' plan variants (kernels/layernorm.cu, "variants"; set_variant): every
variant must give the same answers as the default, so any of them can become the default.

GPU (skipped without CUDA): each flag alone and all together, forward and backward against the
float64 reference (test_layernorm.check: every dtype combination, awkward row counts, poisoned
outputs, with and without residual and bias, bf16 parameters); the backward bitwise reproducible
under each; the chosen plan really launched (kernel names); the programmatic-dependent-launch
column sum inside a CUDA graph; TK_LAYERNORM_VARIANT at start-up; bad flags refused.
CPU: the flag lists of layernorm.cu, layernorm.py and the bench script agree.
No timing here: kernels/layernorm_bench.py."""
import functools
import os
import re
import subprocess
import sys

import pytest
import torch

import test_layernorm as base  # noqa: E402  (tests/ is on sys.path: conftest.py lives there)

REPO = base.REPO
needs_cuda = base.needs_cuda
BF16, F32 = base.BF16, base.F32

# each flag alone; session 6's flags on the default plan (the candidates: each instance), with the
# reversed backward (the first row steps are the last rows) and on the persistent forward grid; all.
SEAM = ["fwd_early_pdl", "bwd_l2_first", "bwd_l2_first2"]
# session 6's default plan (spelt out: "default,fwd_early_pdl,bwd_l2_first2,bwd_reverse" here meant it
# until session 8's default took the lean kernels): the plain kernels the lean ones are compared with
LEAN_OFF = "fwd_full,bwd_tree,pdl,fwd_early_pdl,bwd_l2_first2,bwd_reverse"
# session 8's lean kernels (rows of one warp): alone (persistent forward grid, no pdl), and each on
# session 6's plan beside the other pass's plain kernel; both on it is the default plan since
# session 8 ("default": once here; "default,fwd_lean" and the like were copies of it)
LEAN = ["fwd_lean", "bwd_lean", LEAN_OFF + ",fwd_lean", LEAN_OFF + ",bwd_lean", "default"]
# session 8's default plan, spelt out (the lean kernels' tests compare it with LEAN_OFF; "default" may
# take more flags: session 9's bwd_wide changes GPT-2's fp32-h rows at 768, where these tests expect the
# plain kernels)
LEAN_ON = LEAN_OFF + ",fwd_lean,bwd_lean"
# session 9's bwd_wide (the lean backward for rows of two warps: fp32 h of 576..768 columns, GPT-2's
# residual stream) on session 8's plan, i.e. session 9's default plan spelt out, and alone (persistent
# forward grid, no pdl). (Session 9's fwd_wide, a one-warp lean forward there, lost and was removed.)
WIDE_ON = LEAN_ON + ",bwd_wide"
WIDE = [WIDE_ON, "bwd_wide"]
VARIANTS = ["fwd_full", "bwd_reverse", "bwd_tree", "pdl", *SEAM, "default,fwd_early_pdl,bwd_l2_first",
            LEAN_OFF, "bwd_tree,pdl,fwd_early_pdl,bwd_l2_first", *LEAN, *WIDE,
            "fwd_full,bwd_reverse,bwd_tree,pdl," + ",".join(SEAM) + ",fwd_lean,bwd_lean,bwd_wide"]
# (rows, cols): 1 and 7 rows (fewer rows than a block takes), a tail of a few rows past a
# block step, widths with 1 to 4 chunks a thread and 1 to 8 warps a row (1600: idle lanes),
# and more rows than one wave of blocks.
SHAPES = [(1, 64), (7, 768), (333, 4096), (1000, 768), (4099, 384), (5, 1600), (16387, 768)]


@pytest.fixture(scope="module")
def ln():
    from kernels import layernorm
    reason = layernorm._ext.why_not()
    assert reason is None, reason
    yield layernorm
    layernorm.set_variant("default")


@pytest.fixture
def variant(ln, request):
    active = ln.set_variant(request.param)
    asked = set(request.param.split(","))
    if "default" in asked:
        asked = (asked - {"default"}) | default_plan_flags()
    assert set(active.split(",")) == asked, (active, request.param)
    yield request.param
    ln.set_variant("default")


@needs_cuda
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
@pytest.mark.parametrize("combo", base.COMBO_NAMES)
def test_variant_matches_float64_reference(variant, combo):
    for rows, cols in SHAPES:
        base.check(rows, cols, combo, seed=rows + cols)
    base.check(513, 768, combo, bias=False, seed=3)
    base.check(77, 1024, combo, residual=False, seed=4)


@needs_cuda
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
def test_variant_bf16_parameters(variant):
    base.check(513, 768, "bf16", param_dtype=BF16)
    base.check(1031, 384, "fp32_bf16r_autocast", param_dtype=BF16)


@needs_cuda
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
def test_variant_backward_is_bitwise_reproducible_and_equals_default_outputs(ln, variant):
    x, r, w, b, dy, dh = base.make(4099, 768, base.KERNEL_COMBOS["fp32_bf16r_autocast"], 12)
    y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5, True)
    first = ln.layernorm_bwd_mixed(dy, dh, h, mean, rstd, w)
    second = ln.layernorm_bwd_mixed(dy, dh, h, mean, rstd, w)
    for a, c in zip(first, second):
        assert torch.equal(a, c), f"{variant}: backward is not bitwise reproducible"
    ln.set_variant("none")
    y0, h0, mean0, rstd0 = ln.add_layernorm_fwd(x, r, w, b, 1e-5, True)
    # the per-row arithmetic is the same in every plan: y and h bitwise; mean/rstd within rounding
    assert torch.equal(h, h0)
    assert (y.float() - y0.float()).abs().max().item() <= 2 ** -6 * y0.float().abs().max().item()
    torch.testing.assert_close(mean, mean0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd, rstd0, rtol=1e-5, atol=0)


def launched(fn):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]


def instances(names, kernel):
    """{(template arguments, ...)} of `kernel`'s instances among the launched kernels' names."""
    return {tuple(a.strip() for a in args.split(","))
            for n in names for args in re.findall(r"\b" + kernel + r"<([^<>]*)>", n)}


def fwd_bwd(ext, x, r, w, b, dy, dh, mixed=False, **drop):   # mixed: fp32 h, bf16 residual and y (autocast)
    """One forward and one backward through the extension (the launch tests' step)."""
    y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5, mixed, **drop)
    ext.backward(dy, dh, h, mean, rstd, w, mixed, **drop)


@needs_cuda
def test_the_variant_is_what_launches(ln):
    """Every plan launches the same three kernels (the flags change the grid, the block sum, the row
    order and the launch, not the instance), except session 6's flags, which pick the instance of
    the last template argument (the forward's EARLY_PDL, the backward's FIRST_STEPS): bf16 C=768 is one warp a row, 3 chunks a thread, no
    dropout; the flags in force are reported, in the FLAGS table's order. The instances are read
    from the kernels' names, template argument by template argument (session 4's DROP bool broke a
    regex that wanted the CHUNKS digit last)."""
    x, r, w, b, dy, dh = base.make(2048, 768, base.KERNEL_COMBOS["bf16"], 1)

    def call():
        y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5)
        ln.layernorm_bwd(dy, dh, h, mean, rstd, w)

    def instances(names, kernel):   # the launched instances' template arguments, as tuples
        return {tuple(a.strip() for a in args.split(","))
                for n in names for args in re.findall(r"\b" + kernel + r"<([^<>]*)>", n)}

    bf16 = "__nv_bfloat16"
    fwd_plain, fwd_early = ({(bf16, bf16, bf16, "3", "false", e)} for e in ("false", "true"))   # <TH, TR, TY,
    bwd_plain, bwd_first, bwd_first2 = ({(bf16, bf16, bf16, "3", "false", n)} for n in "012")  # CHUNKS, DROP, *>
    # session 8: a default plan with fwd_lean runs forward_lean_kernel<TH, TR, TY, TP, CHUNKS, EARLY_PDL>
    # (fp32 parameters here: TP float) instead; bwd_lean has no bf16-h + fp32-parameter instance, so
    # the backward stays backward_kernel
    dflt = default_plan_flags()
    fwd_default = fwd_early if "fwd_early_pdl" in dflt else fwd_plain
    fwd_lean_default = set()
    if "fwd_lean" in dflt:
        fwd_lean_default = {(bf16, bf16, bf16, "float", "3", "true" if "fwd_early_pdl" in dflt else "false")}
        fwd_default = set()

    try:
        assert ln.set_variant("none") == "none" and ln.variant() == "none" and ln.set_variant("") == "none"
        for spec, active, fwd, bwd in (("none", "none", fwd_plain, bwd_plain),
                                       ("pdl, bwd_tree", "bwd_tree,pdl", fwd_plain, bwd_plain),
                                       ("pdl,bwd_reverse,fwd_full", "fwd_full,bwd_reverse,pdl", fwd_plain, bwd_plain),
                                       ("fwd_early_pdl,pdl", "pdl,fwd_early_pdl", fwd_early, bwd_plain),
                                       ("bwd_l2_first,pdl", "pdl,bwd_l2_first", fwd_plain, bwd_first),
                                       ("fwd_full,bwd_tree,pdl,bwd_l2_first,bwd_l2_first2",
                                        "fwd_full,bwd_tree,pdl,bwd_l2_first,bwd_l2_first2", fwd_plain, bwd_first2),
                                       ("fwd_full,pdl,bwd_l2_first,fwd_early_pdl", "fwd_full,pdl,fwd_early_pdl,bwd_l2_first",
                                        fwd_early, bwd_first),
                                       ("default", ",".join(f for f in ln.VARIANT_FLAGS if f in dflt), fwd_default,
                                        bwd_first2 if "bwd_l2_first2" in dflt
                                        else bwd_first if "bwd_l2_first" in dflt else bwd_plain)):
            assert ln.set_variant(spec) == active == ln.variant()
            names = launched(call)
            assert instances(names, "forward_kernel") == fwd, (spec, names)
            assert instances(names, "backward_kernel") == bwd, (spec, names)
            assert instances(names, "forward_lean_kernel") == (fwd_lean_default if spec == "default" else set()), (spec, names)
            assert not instances(names, "backward_lean_kernel"), (spec, names)
            assert sum("column_sum_kernel" in n for n in names) == 1, names
    finally:
        ln.set_variant("default")


# Shapes where a row is one warp (G = 1): bf16 h up to 1024 columns (1 to 4 chunks a lane, 1600 is
# not one), fp32 h up to 512; rows 1, 7 and tails past a block's 8 rows.
LEAN_SHAPES = [(1, 64), (7, 768), (1000, 768), (4099, 384), (333, 1024), (77, 320), (16387, 768)]


@needs_cuda
@pytest.mark.parametrize("combo", base.COMBO_NAMES)
@pytest.mark.parametrize("param_dtype", [F32, BF16], ids=["fp32_params", "bf16_params"])
def test_lean_kernels_equal_the_plain_kernels_bitwise(ln, combo, param_dtype):
    """forward_lean_kernel and backward_lean_kernel do forward_kernel's and backward_kernel's arithmetic
    in the same order (layernorm.cu, "lean"): y, h, mean, rstd bitwise the same as the plain kernels',
    with and without bias and residual, also for a plan without pdl and with the forward's persistent
    grid. The backward: bitwise for bf16 h; for fp32 h ptxas fuses one multiply-add differently (the
    lean kernel keeps g = dy * w from its first pass, backward_kernel recomputes it inside an FMA:
    H200, session 8's call 2), so dx, dw, db there agree to 1e-5 of their largest element, and a
    bf16 residual's gradient dr (dx rounded: exactly that in each kernel) and bf16 parameters' dw, db
    to one bf16 rounding step (call 3: where dx sits at a rounding boundary, its last-bit difference
    moves dr by one step; the final check of session 8 found the bf16 dw, db sent to dr's check)."""
    ext = ln._ext.module
    x_dtype, r_dtype, autocast = base.KERNEL_COMBOS[combo]   # autocast: y (and dy) in bf16
    try:
        for n, (rows, cols) in enumerate(LEAN_SHAPES):
            for bias, residual in ((True, True), (False, True), (True, False)):
                x, r, w, b, dy, dh = base.make(rows, cols, base.KERNEL_COMBOS[combo], n, bias, residual, param_dtype)
                outs = {}
                for plan in (LEAN_OFF, LEAN_ON, "fwd_lean,bwd_lean,bwd_tree", "bwd_tree"):
                    ln.set_variant(plan)
                    base.poison_allocator(x, x)   # an element a kernel forgets to write reads NaN
                    y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5, autocast)
                    base.poison_allocator(x, x)
                    grads = ext.backward(dy, dh, h if r is not None else x, mean, rstd, w,
                                         residual and r_dtype != x_dtype)
                    outs[plan] = (y, h, mean, rstd, *grads)
                where = (combo, param_dtype, rows, cols, bias, residual)
                for lean, plain in ((LEAN_ON, LEAN_OFF), ("fwd_lean,bwd_lean,bwd_tree", "bwd_tree")):
                    assert len(outs[lean]) == len(outs[plain]), where
                    for i, (a, c) in enumerate(zip(outs[lean], outs[plain])):   # y, h, mean, rstd, dx, dw, db(, dr)
                        assert (a is None) == (c is None), (where, i)
                        if a is None:
                            continue
                        if i < 4 or x_dtype == BF16:
                            assert torch.equal(a, c), (where, lean, "output", i)
                        elif a.dtype == BF16:   # one bf16 step apart at most: dr (dx rounded) beside fp32 h,
                            # or dw, db of bf16 parameters (their fp32 sums rounded; final check, session 8)
                            if i == 7:
                                assert torch.equal(a, outs[lean][4].to(BF16)), (where, lean, "dr is not dx rounded")
                            err = (a.float() - c.float()).abs()
                            bound = 2 ** -7 * c.float().abs() + 1e-5 * c.float().abs().max()
                            assert (err <= bound).all(), (where, lean, "output", i, err.max().item())
                        else:
                            assert torch.isfinite(a).all(), (where, lean, "output", i)
                            err = (a.float() - c.float()).abs().max().item()
                            assert err <= 1e-5 * c.float().abs().max().item(), (where, lean, "output", i, err)
    finally:
        ln.set_variant("default")


@needs_cuda
def test_lean_flags_launch_the_lean_kernels_where_a_row_is_one_warp(ln):
    """fwd_lean / bwd_lean launch forward_lean_kernel<TH, TR, TY, TP, CHUNKS, EARLY_PDL> and
    backward_lean_kernel<TH, TR, TY, TP, CHUNKS, G = 1> for rows of one warp without dropout; wider rows
    (G > 1: fp32 h at 768 columns), dropout and bf16 h beside fp32 parameters (backward) run the
    plain kernels."""
    ext = ln._ext.module
    bf16 = "__nv_bfloat16"
    seed = torch.tensor([99], dtype=torch.int64, device="cuda")
    step = functools.partial(fwd_bwd, ext)

    try:
        ln.set_variant(LEAN_ON)
        x, r, w, b, dy, dh = base.make(2048, 768, base.KERNEL_COMBOS["bf16"], 1, param_dtype=BF16)
        names = launched(lambda: step(x, r, w, b, dy, dh))
        assert instances(names, "forward_lean_kernel") == {(bf16, bf16, bf16, bf16, "3", "true")}, names
        assert instances(names, "backward_lean_kernel") == {(bf16, bf16, bf16, bf16, "3", "1")}, names   # G = 1
        assert not instances(names, "forward_kernel") and not instances(names, "backward_kernel"), names
        names = launched(lambda: step(x, r, w, b, dy, dh, dropout_seed=seed, dropout_p=0.1))
        assert not instances(names, "forward_lean_kernel") and not instances(names, "backward_lean_kernel"), names
        x, r, w, b, dy, dh = base.make(2048, 768, base.KERNEL_COMBOS["bf16"], 2, param_dtype=F32)
        names = launched(lambda: step(x, r, w, b, dy, dh))
        assert instances(names, "forward_lean_kernel") == {(bf16, bf16, bf16, "float", "3", "true")}, names
        assert instances(names, "backward_kernel") and not instances(names, "backward_lean_kernel"), names
        x, r, w, b, dy, dh = base.make(2048, 768, base.KERNEL_COMBOS["fp32_bf16r_autocast"], 3)   # G = 2
        names = launched(lambda: step(x, r, w, b, dy, dh, mixed=True))
        assert not instances(names, "forward_lean_kernel") and not instances(names, "backward_lean_kernel"), names
        x, r, w, b, dy, dh = base.make(2048, 384, base.KERNEL_COMBOS["fp32_bf16r_autocast"], 4)   # G = 1
        names = launched(lambda: step(x, r, w, b, dy, dh, mixed=True))
        assert instances(names, "forward_lean_kernel") == {("float", bf16, bf16, "float", "3", "true")}, names
        assert instances(names, "backward_lean_kernel") == {("float", bf16, bf16, "float", "3", "1")}, names
    finally:
        ln.set_variant("default")


# Widths where bwd_wide's kernel runs: fp32 h of 576..768 columns (two warps a row, 3 chunks a thread;
# 4.5 to 6 chunks a warp's lane: threads without a last chunk) and bf16 h of 1088..1536; 832 and 1600
# are past them (the plain kernels run).
WIDE_WIDTHS_FP32 = [576, 640, 704, 768]
WIDE_WIDTHS_BF16 = [1088, 1280, 1536]


@needs_cuda
@pytest.mark.parametrize("plan", WIDE)
@pytest.mark.parametrize("combo", base.COMBO_NAMES)
def test_wide_backward_matches_float64_reference_at_its_widths(ln, plan, combo):
    """The float64 reference (test_layernorm.check: poisoned outputs, every gradient) at every width
    bwd_wide's kernel takes, rows 1, 7 (fewer than a block's 8 or 4 row slots), a tail past a block step and
    more rows than one wave; without bias and without residual too; bf16 parameters."""
    ln.set_variant(plan)
    try:
        widths = WIDE_WIDTHS_BF16 if base.KERNEL_COMBOS[combo][0] == BF16 else WIDE_WIDTHS_FP32
        for n, cols in enumerate(widths):
            for rows in (1, 7, 1001, 16387):
                base.check(rows, cols, combo, seed=rows + cols)
            base.check(333, cols, combo, bias=False, seed=n)
            base.check(77, cols, combo, residual=False, seed=n + 10)
            base.check(513, cols, combo, param_dtype=BF16, seed=n + 20)
        base.check(99, 832, combo, seed=5)   # past those widths: the plain kernels
    finally:
        ln.set_variant("default")


@needs_cuda
@pytest.mark.parametrize("combo", base.COMBO_NAMES)
@pytest.mark.parametrize("param_dtype", [F32, BF16], ids=["fp32_params", "bf16_params"])
def test_wide_backward_agrees_with_the_plain_backward(ln, combo, param_dtype):
    """bwd_wide is backward_kernel's arithmetic in backward_kernel's order (the two warps' sums added as
    group_sum adds them), given the same h, mean and rstd: dx bitwise for bf16 h; for fp32 h within 1e-5
    of its largest element (session 8: ptxas fuses one multiply-add differently in the lean kernels),
    a bf16 residual's gradient exactly dx rounded and within one bf16 step of the plain kernel's; dw, db
    within 1e-5 of their largest (one bf16 step for bf16 parameters)."""
    ext = ln._ext.module
    x_dtype, r_dtype, autocast = base.KERNEL_COMBOS[combo]
    widths = WIDE_WIDTHS_BF16 if x_dtype == BF16 else WIDE_WIDTHS_FP32
    if x_dtype == BF16 and param_dtype == F32:
        pytest.skip("no lean backward for bf16 h beside fp32 parameters (layernorm.cu, lean_backward_warps)")
    try:
        for n, cols in enumerate(widths):
            for rows, bias, residual in ((4099, True, True), (7, False, True), (1001, True, False)):
                x, r, w, b, dy, dh = base.make(rows, cols, base.KERNEL_COMBOS[combo], n + rows, bias, residual, param_dtype)
                ln.set_variant(LEAN_OFF)   # the backward's inputs: the plain forward's h, mean, rstd
                base.poison_allocator(x, x)
                _, h0, mean0, rstd0 = ext.forward(x, r, w, b, 1e-5, autocast)
                h_in = h0 if r is not None else x
                grads = {}
                for plan in (LEAN_OFF, WIDE_ON):
                    ln.set_variant(plan)
                    base.poison_allocator(x, x)
                    grads[plan] = ext.backward(dy, dh, h_in, mean0, rstd0, w, residual and r_dtype != x_dtype)
                where = (combo, param_dtype, rows, cols, bias, residual)
                plain, wide = grads[LEAN_OFF], grads[WIDE_ON]
                assert len(plain) == len(wide), where
                for i, (a, c) in enumerate(zip(wide, plain)):   # dx, dw, db(, dr)
                    assert (a is None) == (c is None), (where, i)
                    if a is None:
                        continue
                    assert torch.isfinite(a).all(), (where, "output", i)
                    if i == 0 and x_dtype == BF16:
                        assert torch.equal(a, c), (where, "dx")
                        continue
                    if i == 3:
                        assert torch.equal(a, wide[0].to(BF16)), (where, "dr is not dx rounded")
                    err = (a.float() - c.float()).abs()
                    bound = (2 ** -7 * c.float().abs() if a.dtype == BF16 else 0) + 1e-5 * c.float().abs().max()
                    assert (err <= bound).all(), (where, "output", i, err.max().item())
    finally:
        ln.set_variant("default")


@needs_cuda
def test_wide_flag_launches_the_two_warp_lean_backward(ln):
    """bwd_wide runs backward_lean_kernel<TH, TR, TY, TP, 3, 2> (rows of two warps) for fp32 h of
    576..768 columns and for bf16 h of 1088..1536 with bf16 parameters (the forward stays
    forward_kernel there); the plain backward runs with dropout, at 832 columns, and for bf16 h beside
    fp32 parameters."""
    ext = ln._ext.module
    bf16 = "__nv_bfloat16"
    seed = torch.tensor([5], dtype=torch.int64, device="cuda")
    step = functools.partial(fwd_bwd, ext)

    try:
        ln.set_variant(WIDE_ON)
        x, r, w, b, dy, dh = base.make(2048, 768, base.KERNEL_COMBOS["fp32_bf16r_autocast"], 1)   # GPT-2's call
        names = launched(lambda: step(x, r, w, b, dy, dh, mixed=True))
        assert instances(names, "forward_kernel") and not instances(names, "forward_lean_kernel"), names
        assert instances(names, "backward_lean_kernel") == {("float", bf16, bf16, "float", "3", "2")}, names
        assert not instances(names, "backward_kernel"), names
        ln.set_variant(LEAN_OFF)   # the same call without the lean flags: the plain kernels (two warps a row)
        names = launched(lambda: step(x, r, w, b, dy, dh, mixed=True))
        assert not instances(names, "forward_lean_kernel") and not instances(names, "backward_lean_kernel"), names
        assert instances(names, "forward_kernel") and instances(names, "backward_kernel"), names
        ln.set_variant(WIDE_ON)
        x, r, w, b, dy, dh = base.make(2048, 640, base.KERNEL_COMBOS["fp32"], 2, param_dtype=BF16)
        names = launched(lambda: step(x, r, w, b, dy, dh))
        assert instances(names, "forward_kernel") and not instances(names, "forward_lean_kernel"), names
        assert instances(names, "backward_lean_kernel") == {("float", "float", "float", bf16, "3", "2")}, names
        names = launched(lambda: step(x, x, w, b, dy, dh, dropout_seed=seed, dropout_p=0.1))
        assert not instances(names, "forward_lean_kernel") and not instances(names, "backward_lean_kernel"), names
        x, r, w, b, dy, dh = base.make(2048, 832, base.KERNEL_COMBOS["fp32_bf16r_autocast"], 3)   # 4 chunks a thread
        names = launched(lambda: step(x, r, w, b, dy, dh, mixed=True))
        assert not instances(names, "forward_lean_kernel") and not instances(names, "backward_lean_kernel"), names
        x, r, w, b, dy, dh = base.make(2048, 1280, base.KERNEL_COMBOS["bf16"], 4, param_dtype=BF16)
        names = launched(lambda: step(x, r, w, b, dy, dh))
        assert instances(names, "forward_kernel") and not instances(names, "forward_lean_kernel"), names
        assert instances(names, "backward_lean_kernel") == {(bf16, bf16, bf16, bf16, "3", "2")}, names
        x, r, w, b, dy, dh = base.make(2048, 1280, base.KERNEL_COMBOS["bf16"], 5, param_dtype=F32)
        names = launched(lambda: step(x, r, w, b, dy, dh))
        assert instances(names, "backward_kernel") and not instances(names, "backward_lean_kernel"), names
    finally:
        ln.set_variant("default")


@needs_cuda
def test_session6_flags_leave_the_dropout_kernels_alone(ln):
    """fwd_early_pdl and bwd_l2_first(2) have no dropout instances (layernorm.cu, with_forward_kernel):
    with dropout on, the plain DROP instances run and give the default plan's outputs, bitwise."""
    ext = ln._ext.module
    x, r, w, b, dy, dh = base.make(1031, 768, base.KERNEL_COMBOS["bf16"], 5, param_dtype=BF16)
    seed = torch.tensor([1234], dtype=torch.int64, device="cuda")

    def step():
        y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5, dropout_seed=seed, dropout_p=0.1)
        return (y, h, mean, rstd) + tuple(ext.backward(dy, dh, h, mean, rstd, w, dropout_seed=seed, dropout_p=0.1))

    try:
        ln.set_variant("default")
        expected = step()
        ln.set_variant("default," + ",".join(SEAM))
        got = step()
        assert len(got) == len(expected) == 8   # y, h, mean, rstd, dh_out, dw, db, dr
        for i, (a, c) in enumerate(zip(got, expected)):
            assert torch.equal(a, c), i
        names = launched(step)
        for kernel, last_two in (("forward_kernel", ("true", "false")), ("backward_kernel", ("true", "0"))):   # DROP,
            args = [tuple(a.strip() for a in found.split(",")) for n in names                              # no flag
                    for found in re.findall(r"\b" + kernel + r"<([^<>]*)>", n)]
            assert len(args) == 1 and args[0][-2:] == last_two, (kernel, names)
    finally:
        ln.set_variant("default")


@needs_cuda
@pytest.mark.parametrize("plan", ["pdl", "pdl,fwd_early_pdl", "pdl,fwd_early_pdl,bwd_l2_first2", LEAN_OFF, "default",
                                  WIDE_ON])
def test_pdl_launches_inside_a_cuda_graph(ln, plan):
    """bench.py and train.py's cuda_graphs replay forward and backward from a graph: with pdl each
    kernel is captured as a programmatic dependent of the one before (forward -> backward ->
    column sum) and must still see its inputs complete (outputs bitwise equal to plain launches),
    also when the forward lets the backward launch as each of its blocks starts (fwd_early_pdl) and
    the backward prefetches rows before its wait (bwd_l2_first2), and for the default plan."""
    x, r, w, b, dy, dh = base.make(8191, 768, base.KERNEL_COMBOS["fp32_bf16r_autocast"], 7)

    def step():
        y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5, True)
        return (y, h, mean, rstd) + tuple(ln.layernorm_bwd_mixed(dy, dh, h, mean, rstd, w))

    try:
        # the reference: the same plan without pdl ("pdl" alone is "none" plus pdl), plain launches
        # (a plan with other flags is no reference: bwd_tree and bwd_reverse change the reduction
        # order; the H200's final call of session 3 compared against one and failed on dx's rounding)
        flags = set(plan.split(","))
        if "default" in flags:
            flags = (flags - {"default"}) | default_plan_flags()
        ln.set_variant(",".join(sorted(flags - {"pdl"})) or "none")
        expected = step()
        ln.set_variant(plan)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = step()
        for _ in range(3):
            for t in got:
                t.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for name, a, c in zip(["y", "h", "mean", "rstd", "dx", "dr", "dw", "db"], got, expected):
                assert torch.equal(a, c), (plan, name)
    finally:
        ln.set_variant("default")


def default_plan_flags():
    src = open(os.path.join(REPO, "kernels", "layernorm.cu")).read()
    spec = re.search(r'constexpr const char\* DEFAULT_PLAN = "([^"]*)";', src).group(1)
    return {f for f in spec.split(",") if f}


@needs_cuda
def test_default_none_and_flags_combine(ln):
    try:
        default = ln.set_variant("default")
        assert set(default.split(",")) - {"none"} == default_plan_flags()
        both = ln.set_variant("default,pdl")
        assert set(both.split(",")) == default_plan_flags() | {"pdl"}
        assert ln.set_variant("none") == "none"
    finally:
        ln.set_variant("default")


@needs_cuda
def test_bad_variant_flags_are_refused(ln):
    before = ln.set_variant("bwd_reverse")
    try:
        with pytest.raises(ValueError, match="unknown layernorm variant flag 'wide'.*bwd_tree"):
            ln.set_variant("bwd_tree,wide")
        assert ln.variant() == before   # unchanged
        with pytest.raises(TypeError, match="string"):
            ln.set_variant(3)
    finally:
        ln.set_variant("default")


@needs_cuda
def test_environment_variable_sets_the_start_up_variant():
    code = ("from kernels import layernorm as ln; assert ln._ext.why_not() is None; "
            "import torch; x = torch.randn(4, 256, device='cuda'); w = torch.ones(256, device='cuda'); "
            "ln.add_layernorm_fwd(x, x, w, None, 1e-5); print('VARIANT', ln.variant())")
    env = dict(os.environ, TK_LAYERNORM_VARIANT="bwd_reverse,pdl")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "VARIANT bwd_reverse,pdl" in out.stdout, out.stdout


# ---- CPU ---------------------------------------------------------------------------------------

def test_cpu_flag_lists_agree():
    """layernorm.cu's FLAGS table, layernorm.py's VARIANT_FLAGS, this file's VARIANTS and the bench
    script's lists name the same flags."""
    from kernels import layernorm, layernorm_bench
    src = open(os.path.join(REPO, "kernels", "layernorm.cu")).read()
    table = re.search(r"constexpr Flag FLAGS\[\] = \{(.*?)\};", src, re.S).group(1)
    cu_flags = re.findall(r'\{"(\w+)", &Variant::\w+\}', table)
    assert tuple(cu_flags) == layernorm.VARIANT_FLAGS
    assert set(VARIANTS[-1].split(",")) == set(cu_flags)
    for spec in (layernorm_bench.FWD_VARIANTS + layernorm_bench.BWD_VARIANTS + layernorm_bench.FINAL_BWD
                 + layernorm_bench.FINAL_PLANS + layernorm_bench.S5_PLANS + layernorm_bench.S5_KERNEL_FWD
                 + layernorm_bench.S5_KERNEL_BWD + layernorm_bench.INTERLEAVED_PLANS):
        assert spec == "none" or set(spec.split(",")) <= set(cu_flags) | {"default"}, spec
    assert default_plan_flags() <= set(cu_flags)
    assert layernorm_bench.INTERLEAVED_PLANS[0] == "default"   # the plan every candidate is read against
    assert all(v.startswith("fwd") for v in layernorm_bench.FWD_VARIANTS[1:])
    assert all(not v.startswith("fwd") for v in layernorm_bench.BWD_VARIANTS)


def test_cpu_bench_counts_the_bytes_each_kernel_must_move():
    from kernels.layernorm_bench import kernel_bytes
    n = 16384 * 768
    assert kernel_bytes(16384, 768, BF16, BF16, BF16) == (8 * n, 8 * n)          # bench.py's 8 passes of bf16
    assert kernel_bytes(16384, 768, F32, BF16, BF16) == (12 * n, 16 * n)         # NOTES: 12 + 16 bytes
    assert kernel_bytes(16384, 768, F32, F32, F32) == (16 * n, 16 * n)

"""Tests of the tk fused residual + LayerNorm (kernels/layernorm.cu, layernorm.py).

GPU (skipped without CUDA): forward and backward against a float64 reference for every dtype
combination the kernels are built for (fp32 h with a fp32 or bf16 residual and y, and all-bf16;
see KERNEL_COMBOS), rows 1 / 7 / 16384 and other awkward counts, every supported width, with and
without bias and residual; each output and gradient checked in its own dtype; poisoned outputs;
the bf16 y of fp32 h equal to the exact y up to one bf16 rounding; the mixed call launching only
the layernorm kernels (no cast kernels); opcheck; torch.compile; bad inputs.
CPU: nvcc compiles layernorm.cu for sm_90a and sm_80 with every instance; the Python half with a
fake extension (dtypes, flags, swap of the inputs, fakes, a real torch.compile); the checks.
No timing here (bench.py and tests/gpu_layernorm_check.sh do that)."""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import kernels  # noqa: E402
from conftest import rel_err, use_cpu_checks  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

F32, BF16 = torch.float32, torch.bfloat16
ALL_WIDTHS = list(range(64, 4097, 64))                       # every supported hidden size
MODEL_WIDTHS = [384, 768, 1024, 1280, 1600, 2048, 4096]      # the ones models use
TOL = {BF16: 1e-2, F32: 2e-5}                                # relative norm error allowed

# (x dtype, residual dtype, bf16 autocast) for each kernel instance (TH, TR, TY) in layernorm.cu.
KERNEL_COMBOS = {
    "fp32": (F32, F32, False),                    # float, float, float
    "bf16": (BF16, BF16, False),                  # bf16, bf16, bf16
    "fp32_bf16r": (F32, BF16, False),             # float, bf16, float
    "fp32_autocast": (F32, F32, True),            # float, float, bf16
    "fp32_bf16r_autocast": (F32, BF16, True),     # float, bf16, bf16: the model under bf16 autocast
}
COMBO_NAMES = list(KERNEL_COMBOS)


def out_dtypes(x_dtype, r_dtype, autocast):
    """(h, y) dtypes the public op promises: h = promotion of x + r; y bf16 under autocast."""
    h = x_dtype if r_dtype is None else torch.promote_types(x_dtype, r_dtype)
    return h, (BF16 if autocast else h)


@pytest.fixture(scope="module")
def ln():
    from kernels import layernorm
    reason = layernorm._ext.why_not()                         # builds once for the module
    assert reason is None, reason
    return layernorm


def poison_allocator(*tensors_like):
    """Fill freed memory of the outputs' sizes with NaN, so an element the kernel forgets to write
    shows up as NaN (the caching allocator hands the same blocks to the next allocation)."""
    junk = [torch.full_like(t, float("nan")) for t in tensors_like for _ in range(2)]
    del junk


def make(rows, cols, combo, seed, bias=True, residual=True, param_dtype=F32):
    """Fresh inputs in their dtypes: x, r as the combo says, dy in y's dtype, dh in h's."""
    x_dtype, r_dtype, autocast = combo
    h_dtype, y_dtype = out_dtypes(x_dtype, r_dtype if residual else None, autocast)
    g = torch.Generator(device="cuda").manual_seed(seed)
    def rnd(*shape, dt, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g, device="cuda", dtype=F32) * scale + shift).to(dt)
    x = rnd(rows, cols, dt=x_dtype, scale=2.0, shift=0.5)     # non-zero mean, non-unit variance
    r = rnd(rows, cols, dt=r_dtype) if residual else None
    w = rnd(cols, dt=param_dtype, scale=0.5, shift=1.0)
    b = rnd(cols, dt=param_dtype, scale=0.5) if bias else None
    dy = rnd(rows, cols, dt=y_dtype)
    dh = rnd(rows, cols, dt=h_dtype) if residual else None
    return x, r, w, b, dy, dh


def reference64(x, r, w, b, dy, dh, eps=1e-5):
    """Float64 forward and backward of h = x + r, y = LN(h), given upstream grads dy (and dh)."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, r, w, b)]
    x64, r64, w64, b64 = leaves
    h = x64 + r64 if r64 is not None else x64
    y = F.layer_norm(h, (h.shape[-1],), w64, b64, eps)
    outs, grads = [y], [dy.double()]
    if r64 is not None:
        outs.append(h)
        grads.append(dh.double())
    got = torch.autograd.grad(outs, [t for t in leaves if t is not None], grads)
    return y.detach(), h.detach(), got


def run_tk(x, r, w, b, dy, dh, autocast, eps=1e-5):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, r, w, b)]
    xt, rt, wt, bt = leaves
    poison_allocator(x, x, x)
    with torch.autocast("cuda", dtype=BF16, enabled=autocast):
        y, h = kernels.add_layernorm(xt, rt, wt, bt, eps)
    outs, grads = [y], [dy]
    if rt is not None:
        outs.append(h)
        grads.append(dh)
    got = torch.autograd.grad(outs, [t for t in leaves if t is not None], grads)
    return y, h, got


def assert_one_bf16_rounding(y, ry):
    """bf16 y of fp32 h = the exact y rounded once to bf16: within half a bf16 ulp (2^-8 relative)
    of it, plus the kernel's fp32 error (absolute, y is O(1))."""
    assert y.dtype == BF16
    over = (y.double() - ry).abs() - (ry.abs() * 2.0 ** -8 + 1e-4)
    assert over.max().item() <= 0, f"bf16 y off the exact y by more than one rounding: worst excess {over.max().item():.3g}"


def check(rows, cols, combo, bias=True, residual=True, seed=0, param_dtype=F32):
    combo = KERNEL_COMBOS[combo] if isinstance(combo, str) else combo
    x_dtype, r_dtype, autocast = combo
    h_dtype, y_dtype = out_dtypes(x_dtype, r_dtype if residual else None, autocast)
    kernels.configure("auto", layernorm="tk")
    try:
        x, r, w, b, dy, dh = make(rows, cols, combo, seed, bias, residual, param_dtype)
        y, h, grads = run_tk(x, r, w, b, dy, dh, autocast)
        ry, rh, rgrads = reference64(x, r, w, b, dy, dh)
    finally:
        kernels.configure("auto")
    where = f"rows={rows} cols={cols} x={x_dtype} r={r_dtype if residual else None} autocast={autocast}"
    assert (y.dtype, h.dtype, y.shape) == (y_dtype, h_dtype, x.shape), where
    names = ["dx"] + (["dr"] if residual else []) + ["dw"] + (["db"] if bias else [])
    inputs = dict(zip(names, [t for t in (x, r, w, b) if t is not None]))
    errs = {"y": (y, rel_err(y, ry)), "h": (h, rel_err(h, rh))}
    for name, gt, gr in zip(names, grads, rgrads):
        assert gt.dtype == inputs[name].dtype, (where, name, gt.dtype)   # each gradient in its input's dtype
        errs[name] = (gt, rel_err(gt, gr))
    # bf16's tolerance for a bf16 output, and for everything when h itself is bf16 (then every
    # result comes from bf16-rounded h); fp32's otherwise (a bf16 dy is exact input, not error).
    def tol(t):
        return TOL[BF16] if BF16 in (t.dtype, h_dtype) else TOL[F32]
    bad = {k: e for k, (t, e) in errs.items() if not e < tol(t)}
    assert not bad, f"{where}: relative errors over tolerance {bad} (all: { {k: e for k, (_, e) in errs.items()} })"
    if residual and r_dtype != x_dtype:
        # The bf16 branch's gradient, written by the kernel next to the fp32 one: exactly it, rounded.
        dx, dr = (grads[0], grads[1]) if x_dtype == F32 else (grads[1], grads[0])
        assert torch.equal(dr, dx.to(BF16)), where
    if y_dtype == BF16 and h_dtype == F32:
        assert_one_bf16_rounding(y, ry)


# ---- GPU: correctness sweeps ---------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("combo", COMBO_NAMES)
@pytest.mark.parametrize("rows", [1, 7])
def test_every_width_small_rows(ln, rows, combo):
    for cols in ALL_WIDTHS:
        check(rows, cols, combo, seed=cols + rows)


@needs_cuda
@pytest.mark.parametrize("combo", COMBO_NAMES)
@pytest.mark.parametrize("cols", MODEL_WIDTHS)
def test_model_widths_many_rows(ln, cols, combo):
    check(16384, cols, combo, seed=cols)


@needs_cuda
@pytest.mark.parametrize("combo", COMBO_NAMES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "noresidual"])
@pytest.mark.parametrize("rows, cols", [(7, 384), (1000, 768), (333, 4096), (5, 1600)])
def test_bias_and_residual_combinations(ln, rows, cols, combo, bias, residual):
    check(rows, cols, combo, bias=bias, residual=residual, seed=rows * cols)


@needs_cuda
@pytest.mark.parametrize("combo", ["bf16", "fp32_bf16r_autocast"])
def test_bf16_parameters(ln, combo):
    check(513, 768, combo, param_dtype=BF16)


@needs_cuda
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
@pytest.mark.parametrize("rows, cols", [(1, 64), (333, 768), (4099, 1600), (9, 4096)])
def test_bf16_x_with_fp32_residual_swaps_into_the_kernel(ln, rows, cols, autocast):
    """x + residual = residual + x: the public op passes the fp32 one as the kernel's x; each
    gradient still comes back to its own tensor, in its own dtype."""
    check(rows, cols, (BF16, F32, autocast), seed=rows + cols)


@needs_cuda
def test_three_dim_input_and_mixed_dtypes_like_autocast(ln):
    """The model passes (B, T, C) tensors: its fp32 stream h and a bf16 branch output. Without
    autocast y is fp32 like the reference's; under autocast it is bf16 and the reference's fp32 y
    rounded once (the bf16 matmul reading it rounds the reference's the same way)."""
    g = torch.Generator(device="cuda").manual_seed(5)
    h0 = torch.randn(3, 37, 384, device="cuda", generator=g).requires_grad_()
    branch = torch.randn(3, 37, 384, device="cuda", generator=g).to(BF16).requires_grad_()
    w = torch.randn(384, device="cuda", generator=g).requires_grad_()
    for autocast in (False, True):
        kernels.configure("auto", layernorm="tk")
        try:
            with torch.autocast("cuda", dtype=BF16, enabled=autocast):
                y, h = kernels.add_layernorm(h0, branch, w, None)
                ry, rh = kernels.reference.add_layernorm(h0, branch, w, None)
        finally:
            kernels.configure("auto")
        assert ry.dtype == F32 and h.dtype == rh.dtype == F32 and rel_err(h, rh) < 1e-6
        if autocast:
            assert y.dtype == BF16
            assert_one_bf16_rounding(y, ry.detach().double())
        else:
            assert y.dtype == F32 and rel_err(y, ry) < 1e-5
        h0.grad = branch.grad = w.grad = None
        (y.float().square().sum() + h.sum()).backward()
        assert branch.grad.dtype == BF16 and h0.grad.dtype == F32 and w.grad.dtype == F32
        assert torch.equal(branch.grad, h0.grad.to(BF16))


@needs_cuda
def test_mixed_call_launches_only_layernorm_kernels(ln):
    """The point of the mixed dtypes: the model's call (fp32 stream, bf16 branch, bf16 autocast)
    forward and backward runs the layernorm kernels and nothing else: no cast kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    x, r, w, b, dy, dh = make(4096, 768, KERNEL_COMBOS["fp32_bf16r_autocast"], seed=3)
    leaves = [t.requires_grad_() for t in (x, r, w, b)]

    def step():
        with torch.autocast("cuda", dtype=BF16):
            y, h = kernels.add_layernorm(x, r, w, b)
        assert y.dtype == BF16 and h.dtype == F32
        torch.autograd.grad((y, h), leaves, (dy, dh))

    kernels.configure("auto", layernorm="tk")
    try:
        step()                                   # warm: build, occupancy queries
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:   # as kernels/e2e_bench.py
            step()
            torch.cuda.synchronize()
    finally:
        kernels.configure("auto")
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert names, "the profiler saw no CUDA activity"
    # torch's casts and copies are elementwise kernels (…bfloat16_copy_kernel_cuda…, direct_copy…)
    casts = [n for n in names if re.search(r"copy|elementwise|memcpy|memset", n, re.IGNORECASE)]
    assert casts == [], f"cast/copy work around the layernorm kernels: {casts} (all: {names})"
    for kernel in (r"forward(_lean)?_kernel", r"backward(_lean)?_kernel", r"column_sum_kernel"):   # (lean: rows of
        assert sum(bool(re.search(kernel, n)) for n in names) == 1, (kernel, names)                 # one warp)


@needs_cuda
def test_unused_h_and_empty_rows(ln):
    x, r, w, b, dy, _ = make(64, 768, KERNEL_COMBOS["bf16"], 3)
    xt, rt = x.clone().requires_grad_(), r.clone().requires_grad_()
    y, _, _, _ = ln.add_layernorm_fwd(xt, rt, w, b, 1e-5)      # h unused: its grad is zero
    (gx,) = torch.autograd.grad(y, [xt], dy)
    ry, _, (rgx, *_) = reference64(x, r, w, b, dy, torch.zeros_like(dy))
    assert rel_err(gx, rgx) < 1e-2
    e = torch.empty(0, 768, device="cuda", dtype=BF16)
    y, h, mean, rstd = ln.add_layernorm_fwd(e, e, w, b, 1e-5)
    assert y.shape == (0, 768) and mean.shape == (0,)
    dx, dw, db = ln.layernorm_bwd(e, None, e, mean, rstd, w)
    assert dx.shape == (0, 768) and (dw == 0).all() and (db == 0).all()
    # the mixed ops with no rows, and y unused (its zero gradient made in y's dtype)
    e32 = torch.empty(0, 768, device="cuda")
    y, h, mean, rstd = ln.add_layernorm_fwd(e32, e, w, b, 1e-5, True)
    assert y.dtype == BF16 and h.dtype == F32
    dx, dr, dw, db = ln.layernorm_bwd_mixed(e, None, h, mean, rstd, w)
    assert dr.dtype == BF16 and dr.shape == (0, 768) and (dw == 0).all()
    x, r, w, b, _, dh = make(64, 768, KERNEL_COMBOS["fp32_bf16r_autocast"], 4)
    xt, rt = x.clone().requires_grad_(), r.clone().requires_grad_()
    _, h, _, _ = ln.add_layernorm_fwd(xt, rt, w, b, 1e-5, True)   # y unused
    gx, gr = torch.autograd.grad(h, [xt, rt], dh)
    assert torch.equal(gx, dh) and torch.equal(gr, dh.to(BF16))


@needs_cuda
def test_statistics_and_determinism(ln):
    x, r, w, b, dy, dh = make(4099, 1280, KERNEL_COMBOS["fp32"], 11)
    y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5)
    h64 = x.double() + r.double()
    torch.testing.assert_close(mean.double(), h64.mean(-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(rstd.double(), (h64.var(-1, unbiased=False) + 1e-5).rsqrt(), rtol=1e-5, atol=0)
    first = ln.layernorm_bwd(dy, dh, h, mean, rstd, w)
    second = ln.layernorm_bwd(dy, dh, h, mean, rstd, w)
    for a, c in zip(first, second):
        assert torch.equal(a, c), "backward is not bitwise reproducible"
    x, r, w, b, dy, dh = make(4099, 1280, KERNEL_COMBOS["fp32_bf16r_autocast"], 12)
    y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5, True)
    for a, c in zip(ln.layernorm_bwd_mixed(dy, dh, h, mean, rstd, w), ln.layernorm_bwd_mixed(dy, dh, h, mean, rstd, w)):
        assert torch.equal(a, c), "mixed backward is not bitwise reproducible"


@needs_cuda
def test_used_reports_tk(ln):
    kernels.configure("auto", layernorm="tk")
    kernels.reset_used()
    try:
        x, r, w, b, _, _ = make(8, 768, KERNEL_COMBOS["bf16"], 1)
        kernels.add_layernorm(x, r, w, b)
        assert kernels.used()["layernorm"] == "tk"
    finally:
        kernels.configure("auto")
        kernels.reset_used()


@needs_cuda
def test_why_not_takes_every_fp32_bf16_pair(ln):
    w = torch.ones(256, device="cuda")
    for x_dt in (F32, BF16):
        for r_dt in (F32, BF16, None):
            x = torch.randn(4, 256, device="cuda").to(x_dt)
            r = None if r_dt is None else torch.randn(4, 256, device="cuda").to(r_dt)
            assert ln.why_not(x, r, w, None) is None, (x_dt, r_dt)
    x = torch.randn(4, 256, device="cuda")
    assert "float16" in ln.why_not(x, x.half(), w, None)


# ---- GPU: torch.library and torch.compile ----------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("combo", COMBO_NAMES)
def test_opcheck(ln, combo):
    x_dtype, r_dtype, autocast = KERNEL_COMBOS[combo]
    x, r, w, b, dy, dh = make(33, 384, KERNEL_COMBOS[combo], 2)
    xs, rs, ws, bs = (t.clone().requires_grad_() for t in (x, r, w, b))
    torch.library.opcheck(torch.ops.tk.add_layernorm_fwd.default, (xs, rs, ws, bs, 1e-5, autocast))
    torch.library.opcheck(torch.ops.tk.add_layernorm_fwd.default, (xs, rs, ws, None, 1e-5, autocast))
    torch.library.opcheck(torch.ops.tk.layernorm_fwd.default, (xs, ws, bs, 1e-5, autocast))
    y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5, autocast)
    bwd = torch.ops.tk.layernorm_bwd_mixed.default if r_dtype != x_dtype else torch.ops.tk.layernorm_bwd.default
    torch.library.opcheck(bwd, (dy, dh, h, mean, rstd, w))
    torch.library.opcheck(bwd, (dy, None, h, mean, rstd, w))


class TwoNorms(torch.nn.Module):
    """A tiny pre-LN stack in the model's style: (h, branch) pairs through add_layernorm."""

    def __init__(self, c):
        super().__init__()
        self.w1, self.w2 = torch.nn.Parameter(torch.randn(c) * 0.1 + 1), torch.nn.Parameter(torch.randn(c) * 0.1 + 1)
        self.b1 = torch.nn.Parameter(torch.randn(c) * 0.1)
        self.lin = torch.nn.Linear(c, c)

    def forward(self, h, branch):
        y, h = kernels.add_layernorm(h, branch, self.w1, self.b1)
        a = self.lin(y)
        y, h = kernels.add_layernorm(h, a, self.w2, None)
        return (y.float() * h).sum()


@needs_cuda
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
def test_torch_compile_matches_eager(ln, autocast):
    torch.manual_seed(0)
    m = TwoNorms(768).cuda()
    h = torch.randn(4, 65, 768, device="cuda")
    branch = torch.randn(4, 65, 768, device="cuda").to(BF16 if autocast else F32)
    kernels.configure("auto", layernorm="tk")
    kernels.reset_used()
    try:
        with torch.autocast("cuda", dtype=BF16, enabled=autocast):
            loss_e = m(h, branch)
        grads_e = torch.autograd.grad(loss_e, list(m.parameters()))
        # inductor as before for fp32; aot_eager under autocast (the same fake-tensor trace through
        # register_fake, without a second inductor compile's ~30 s)
        compiled = torch.compile(m, fullgraph=False, backend="aot_eager" if autocast else "inductor")
        with torch.autocast("cuda", dtype=BF16, enabled=autocast):
            loss_c = compiled(h, branch)
        grads_c = torch.autograd.grad(loss_c, list(m.parameters()))
        assert kernels.used()["layernorm"] == "tk"
    finally:
        kernels.configure("auto")
        kernels.reset_used()
    assert rel_err(loss_c.reshape(1), loss_e.reshape(1)) < 1e-5
    for gc, ge in zip(grads_c, grads_e):
        assert gc.dtype == ge.dtype and rel_err(gc, ge) < 1e-4


# ---- GPU: bad inputs: Python errors naming the argument ---------------------------------------------

BAD_INPUTS = r"""
import sys, torch
from kernels import layernorm
ext = layernorm._ext.module
g = torch.Generator(device="cuda").manual_seed(9)
def t(*shape, dt=torch.bfloat16):
    return torch.randn(*shape, device="cuda", generator=g).to(dt)
x, r, w, b, dy, dh = t(16, 768), t(16, 768), t(768, dt=torch.float32), t(768, dt=torch.float32), t(16, 768), t(16, 768)
misaligned = torch.empty(16 * 768 + 4, device="cuda", dtype=torch.bfloat16)[4:].view(16, 768)   # 8 bytes in
y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5)
cases = [
    ("forward", (x.cpu(), r, w, b, 1e-5), ValueError, "x must be a CUDA tensor"),
    ("forward", (x.half(), r.half(), w, b, 1e-5), TypeError, "x must be bfloat16 or float32"),
    ("forward", (x, r.float(), w, b, 1e-5), TypeError, "residual is Float but x is BFloat16"),
    ("forward", (x, r[:8], w, b, 1e-5), ValueError, "residual has shape"),
    ("forward", (x.t(), r.t(), w, b, 1e-5), ValueError, "x must be contiguous"),
    ("forward", (x[:, :100].contiguous(), None, w[:100], None, 1e-5), ValueError, "multiple of 64"),
    ("forward", (x, r, w[:384], b, 1e-5), ValueError, "weight must have shape (768,)"),
    ("forward", (x, r, w, b.cpu(), 1e-5), ValueError, "bias is on cpu"),
    ("forward", (x, r, w, b.bfloat16(), 1e-5), TypeError, "bias is BFloat16 but weight is Float"),
    ("forward", (x, r, w, b, -1.0), ValueError, "eps must be finite"),
    ("forward", (misaligned, None, w, b, 1e-5), ValueError, "16-byte aligned"),
    ("backward", (dy[:4], dh, h, mean, rstd, w), ValueError, "dy has shape"),
    ("backward", (dy, dh, h, mean.double(), rstd, w), TypeError, "mean must be float32"),
    ("backward", (dy, dh, h, mean, rstd[:3], w), ValueError, "rstd must be contiguous with one value per row"),
    ("backward", (dy.float(), dh, h, mean, rstd, w), TypeError, "dy is Float but h is BFloat16; it must have h's dtype"),
    ("backward", (dy, dh.float(), h, mean, rstd, w), TypeError, "dh is Float but h is BFloat16"),
    ("backward", (dy, dh, h, mean, rstd, w, True), ValueError, "residual_grad_bf16 is for a BFloat16 residual beside Float"),
]
# First the checks alone (check_forward/check_backward return the message, no C++ throw), then
# the real calls, which raise it: if a raise ever crashed again, the log would tell the two apart.
for i, (fn, args, exc, fragment) in enumerate(cases):
    problem = getattr(ext, "check_" + fn)(*args)
    assert fragment in problem, (i, fragment, problem)
    print(f"check {i}: {problem}", flush=True)
assert ext.check_forward(x, r, w, b, 1e-5) == "" and ext.check_backward(dy, dh, h, mean, rstd, w) == ""
# the mixed combinations pass: fp32 x (and h) with a bf16 residual; fp32 h with a bf16 dy
h32 = h.float()
assert ext.check_forward(x.float(), r, w, b, 1e-5) == "" and ext.check_backward(dy, dh.float(), h32, mean, rstd, w, True) == ""
for i, (fn, args, exc, fragment) in enumerate(cases):
    print(f"case {i}: {fn} expecting {exc.__name__} '{fragment}'", flush=True)
    try:
        getattr(ext, fn)(*args)
    except exc as e:
        assert fragment in str(e), (fragment, str(e))
    else:
        raise AssertionError(f"case {i}: no error raised")
y, _, _, _ = ext.forward(torch.empty(0, 768, device="cuda", dtype=torch.bfloat16), None, w, None, 1e-5)
assert y.shape == (0, 768)
# the keyword options (off by default): bf16 y for fp32 x; a 4th output, the bf16 residual gradient
y, h, mean, rstd = ext.forward(x.float(), r, w, b, 1e-5, y_bf16=True)
assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
out = ext.backward(dy, dh.float(), h, mean, rstd, w, residual_grad_bf16=True)
assert len(out) == 4 and out[0].dtype == torch.float32 and torch.equal(out[3], out[0].bfloat16())
assert len(ext.backward(dy, dh.float(), h, mean, rstd, w)) == 3
print("all bad inputs refused", flush=True)
"""


@needs_cuda
def test_bad_inputs_name_the_argument(ln):
    # In a child process: if a check ever crashed the process instead of raising, the log
    # would name the case and the rest of the session would still run. This test died with SIGSEGV
    # on the H200 (torch 2.11) while the bindings streamed c10 objects into TORCH_CHECK messages;
    # kernels/bindings_checks.h is the fix.
    import subprocess
    res = subprocess.run([sys.executable, "-X", "faulthandler", "-c", BAD_INPUTS], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and "all bad inputs refused" in res.stdout, (
        f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


@needs_cuda
def test_tk_switch_on_unsupported_shape_is_a_clear_error(ln):
    kernels.configure("auto", layernorm="tk")
    try:
        x = torch.randn(4, 100, device="cuda")
        with pytest.raises(kernels.KernelUnavailable, match="hidden size 100 is not a multiple of 64"):
            kernels.add_layernorm(x, x, torch.ones(100, device="cuda"), None)
        x = torch.randn(4, 128, device="cuda", dtype=torch.float16)
        with pytest.raises(kernels.KernelUnavailable, match="float16"):
            kernels.add_layernorm(x, x, torch.ones(128, device="cuda"), None)
    finally:
        kernels.configure("auto")


# ---- CPU: the Python half with a fake extension (no GPU, no build) ----------------------------
# The bindings' contract for mixed dtypes, in plain torch: h in x's dtype, y in bf16 with y_bf16,
# the residual's gradient again in bf16 with residual_grad_bf16. The tests check what the Python
# half does with it: which tensor goes in the kernel's x slot, which flags it passes, the dtypes
# of every output and gradient on both paths (eager fast path and the custom ops / fakes that
# torch.compile uses), and the values against a float64 reference.

class MixedFakeExt:
    """layernorm_bindings.cpp's forward/backward in plain torch, recording the calls."""

    def __init__(self):
        self.calls = []

    def forward(self, x, residual, weight, bias, eps, y_bf16=False):
        self.calls.append(("forward", x.dtype, None if residual is None else residual.dtype, y_bf16))
        assert residual is None or residual.dtype in (x.dtype, torch.bfloat16)
        h = x if residual is None else (x.double() + residual.double()).to(x.dtype)
        hd = h.double()
        mean, var = hd.mean(-1), hd.var(-1, unbiased=False)
        rstd = (var + eps).rsqrt()
        y = (hd - mean[..., None]) * rstd[..., None] * weight.double()
        if bias is not None:
            y = y + bias.double()
        y = y.to(torch.bfloat16 if y_bf16 else x.dtype)
        return [y, None if residual is None else h, mean.float(), rstd.float()]

    def backward(self, dy, dh, h, mean, rstd, weight, residual_grad_bf16=False):
        self.calls.append(("backward", dy.dtype, h.dtype, residual_grad_bf16))
        assert dy.dtype in (h.dtype, torch.bfloat16) and (dh is None or dh.dtype == h.dtype)
        cols = h.shape[-1]
        hd, dyd = h.double().reshape(-1, cols), dy.double().reshape(-1, cols)
        mean, rstd = mean.double().reshape(-1, 1), rstd.double().reshape(-1, 1)
        xhat = (hd - mean) * rstd
        g = dyd * weight.double()
        dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        if dh is not None:
            dx = dx + dh.double().reshape(-1, cols)
        dx = dx.reshape(h.shape).to(h.dtype)
        out = [dx, (dyd * xhat).sum(0).to(weight.dtype), dyd.sum(0).to(weight.dtype)]
        return out + ([dx.to(torch.bfloat16)] if residual_grad_bf16 else [])


@pytest.fixture
def fake_ext(monkeypatch):
    from kernels import layernorm
    fake = MixedFakeExt()
    monkeypatch.setattr(layernorm._ext, "_module", fake)
    use_cpu_checks(monkeypatch, layernorm, "check_forward", "check_backward")
    return fake


# Public-op inputs -> (h dtype, y dtype): h is torch's promotion of x + residual, y is bf16 under
# bf16 autocast, else h's dtype.
F32, BF16 = torch.float32, torch.bfloat16
PUBLIC_COMBOS = [  # (x, residual or None, autocast bf16)
    (F32, F32, False), (BF16, BF16, False), (F32, BF16, False), (BF16, F32, False),
    (F32, F32, True), (BF16, BF16, True), (F32, BF16, True), (BF16, F32, True),
    (F32, None, False), (F32, None, True), (BF16, None, False), (BF16, None, True),
]


def combo_id(c):
    x, r, ac = c
    name = lambda d: "none" if d is None else ("fp32" if d == F32 else "bf16")
    return f"x_{name(x)}-r_{name(r)}" + ("-autocast" if ac else "")


def expected_dtypes(x_dtype, r_dtype, autocast):
    h = x_dtype if r_dtype is None else torch.promote_types(x_dtype, r_dtype)
    return h, (BF16 if autocast else h)


def cpu_inputs(x_dtype, r_dtype, cols=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    def rnd(*shape, dt=F32, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g) * scale + shift).to(dt).requires_grad_()
    x = rnd(3, 5, cols, dt=x_dtype, scale=2.0, shift=0.5)
    r = None if r_dtype is None else rnd(3, 5, cols, dt=r_dtype)
    return x, r, rnd(cols, scale=0.5, shift=1.0), rnd(cols, scale=0.5)


@pytest.mark.parametrize("compiling", [False, True], ids=["fast_path", "custom_ops"])
@pytest.mark.parametrize("combo", PUBLIC_COMBOS, ids=combo_id)
def test_cpu_dtypes_flags_and_values_with_a_fake_extension(fake_ext, monkeypatch, combo, compiling):
    from kernels import layernorm
    x_dtype, r_dtype, autocast = combo
    monkeypatch.setattr(layernorm, "_autocast_bf16", lambda: autocast)   # CPU torch has no CUDA autocast
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    x, r, w, b = cpu_inputs(x_dtype, r_dtype)
    h_dtype, y_dtype = expected_dtypes(x_dtype, r_dtype, autocast)
    y, h = layernorm.add_layernorm(x, r, w, b, 1e-5)
    assert (y.dtype, h.dtype) == (y_dtype, h_dtype)
    if r is None:
        assert h is x
    g = torch.Generator().manual_seed(7)
    dy = torch.randn(y.shape, generator=g).to(y_dtype)
    dh = torch.randn(h.shape, generator=g).to(h_dtype)
    leaves = [t for t in (x, r, w, b) if t is not None]
    outs, grads_out = ((y, h), (dy, dh)) if r is not None else ((y,), (dy,))
    grads = torch.autograd.grad(outs, leaves, grads_out)
    assert [t.dtype for t in grads] == [t.dtype for t in leaves]   # each gradient in its input's dtype

    # What reached the extension: the wider input in the kernel's x slot, the flags as promised.
    fwd, bwd = fake_ext.calls
    kernel_r = None if r is None else (BF16 if x_dtype != r_dtype else r_dtype)
    assert fwd == ("forward", h_dtype, kernel_r, autocast)
    mixed = r is not None and x_dtype != r_dtype
    assert bwd == ("backward", y_dtype, h_dtype, mixed)

    # Values: float64 reference on the same (rounded) inputs. Tolerance by the output's dtype, and
    # bf16's for everything when h itself is bf16 (dw, db in fp32 are then sums of bf16-rounded h).
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    xr, rr = next(it), (next(it) if r is not None else None)
    wr, br = next(it), next(it)
    hr = xr if rr is None else xr + rr
    yr = F.layer_norm(hr, (hr.shape[-1],), wr, br, 1e-5)
    ref_outs = (yr, hr) if r is not None else (yr,)
    ref_grads = torch.autograd.grad(ref_outs, ref_leaves, [t.double() for t in grads_out])
    tol = {F32: 1e-5, BF16: 1e-2}
    for got, want in zip(list(outs) + list(grads), list(ref_outs) + list(ref_grads)):
        assert rel_err(got, want) < tol[BF16 if h_dtype == BF16 else got.dtype], (got.dtype, rel_err(got, want))


def test_cpu_register_fake_and_autograd_of_the_mixed_ops(fake_ext):
    """opcheck: schema, fake (meta) outputs with the real dtypes, autograd registration, AOT."""
    x, r, w, b = cpu_inputs(F32, BF16)
    for y_bf16 in (False, True):
        torch.library.opcheck(torch.ops.tk.add_layernorm_fwd.default, (x, r, w, b, 1e-5, y_bf16))
        torch.library.opcheck(torch.ops.tk.layernorm_fwd.default, (x, w, None, 1e-5, y_bf16))
    from kernels import layernorm
    y, h, mean, rstd = layernorm.add_layernorm_fwd(x.detach(), r.detach(), w.detach(), b.detach(), 1e-5, True)
    dy, dh = torch.randn(y.shape).to(BF16), torch.randn(h.shape)
    torch.library.opcheck(torch.ops.tk.layernorm_bwd_mixed.default, (dy, dh, h, mean, rstd, w.detach()))
    torch.library.opcheck(torch.ops.tk.layernorm_bwd_mixed.default, (dy, None, h, mean, rstd, w.detach()))
    torch.library.opcheck(torch.ops.tk.layernorm_bwd.default, (dy, dh, h, mean, rstd, w.detach()))


def test_cpu_torch_compile_traces_the_mixed_model_case(fake_ext, monkeypatch):
    """A real torch.compile (aot_eager, one graph) of the model's call under autocast: the fakes
    must give the dtypes the kernel gives, or the traced graph would not match the eager run."""
    from kernels import layernorm
    monkeypatch.setattr(layernorm, "_autocast_bf16", lambda: True)
    x, r, w, b = cpu_inputs(F32, BF16)

    def step(x, r, w, b):
        y, h = layernorm.add_layernorm(x, r, w, b, 1e-5)
        return (y.float() * 0.5).sum() + (h * h).sum()
    eager = step(x, r, w, b)
    ge = torch.autograd.grad(eager, [x, r, w, b])

    class Forbidden:
        @staticmethod
        def apply(*args):
            raise AssertionError("the eager fast path ran under torch.compile")
    monkeypatch.setattr(layernorm, "_AddLayerNormEager", Forbidden)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(x, r, w, b)
    gc = torch.autograd.grad(got, [x, r, w, b])
    assert torch.equal(got, eager)
    for a, e in zip(gc, ge):
        assert a.dtype == e.dtype and torch.equal(a, e)
    assert [c[0] for c in fake_ext.calls] == ["forward", "backward"] * 2


@pytest.mark.parametrize("what, call, error, match", [
    ("residual fp32 beside bf16 x", lambda L, t: L.check_forward(t(BF16), t(F32), t(F32, 1), None, 1e-5, cuda=False),
     TypeError, "residual is float32 but x is bfloat16; it must have x's dtype .or bfloat16."),
    ("residual fp16", lambda L, t: L.check_forward(t(F32), t(torch.half), t(F32, 1), None, 1e-5, cuda=False),
     TypeError, "residual must be bfloat16 or float32, got float16"),
    ("y_bf16 not a bool", lambda L, t: L.check_forward(t(F32), None, t(F32, 1), None, 1e-5, 1, cuda=False),
     TypeError, "y_bf16 must be True or False"),
    ("dy fp32 beside bf16 h", lambda L, t: L.check_backward(t(F32), None, t(BF16), t(F32, 0), t(F32, 0), t(F32, 1),
                                                           cuda=False),
     TypeError, "dy is float32 but h is bfloat16; it must have h's dtype .or bfloat16"),
    ("dh bf16 beside fp32 h", lambda L, t: L.check_backward(t(BF16), t(BF16), t(F32), t(F32, 0), t(F32, 0), t(F32, 1),
                                                           cuda=False),
     TypeError, "dh is bfloat16 but h is float32"),
    ("bf16 residual grad of bf16 h", lambda L, t: L.check_backward(t(BF16), None, t(BF16), t(F32, 0), t(F32, 0),
                                                                  t(F32, 1), True, cuda=False),
     ValueError, "residual_grad_bf16 is for a bfloat16 residual beside float32 h"),
])
def test_cpu_checks_refuse_the_other_combinations(what, call, error, match):
    from kernels import layernorm

    def t(dtype, dims=2):   # (4, 128) activations, (4,) statistics, (128,) parameters
        return torch.randn(*{2: (4, 128), 1: (128,), 0: (4,)}[dims]).to(dtype)
    with pytest.raises(error, match=match):
        call(layernorm, t)


def test_cpu_checks_take_the_new_combinations():
    from kernels import layernorm
    a = lambda dt, *s: torch.randn(*(s or (4, 128))).to(dt)
    for x_dt, r_dt in ((F32, F32), (F32, BF16), (BF16, BF16)):
        for y_bf16 in (False, True):
            layernorm.check_forward(a(x_dt), a(r_dt), a(F32, 128), a(F32, 128), 1e-5, y_bf16, cuda=False)
    stats = a(F32, 4)
    for h_dt, dy_dt, split in ((F32, F32, False), (F32, BF16, False), (F32, BF16, True), (F32, F32, True),
                               (BF16, BF16, False)):
        layernorm.check_backward(a(dy_dt), a(h_dt), a(h_dt), stats, stats, a(BF16, 128), split, cuda=False)


# ---- CPU: nvcc compiles every instance --------------------------------------------------------

NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc") if os.path.exists(p)), None)
# 5 dtype combinations x 4 chunk counts x (the forward with dropout, without it, and without it with
# an early pdl trigger: 3; the backward with dropout, without it, and without it asking L2 for its
# first 1 or 2 row steps: 4), and the column sum; session 8's lean kernels (fwd_lean, bwd_lean): the
# forward for bf16 and fp32 parameters, with and without the early trigger (5 x 4 x 2 x 2), the
# backward for bf16 parameters (5 x 4) and fp32 ones beside fp32 h (4 x 4); session 9's bwd_wide: the
# lean backward for rows of two warps with 3 chunks (5 + 4)
EXPECTED_KERNELS = 5 * 4 * (3 + 4) + 1 + 5 * 4 * 2 * 2 + 5 * 4 + 4 * 4 + (5 + 4)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_cpu_layernorm_cu_compiles_for_sm90a_and_sm80(tmp_path):
    """kernels/layernorm.cu with the real build's nvcc flags (kernels/build.py), for both targets in
    parallel; ptxas must see every kernel instance and spill at most 8 bytes in any (session 2: the
    fp32-h 4-chunk forward spilled 4 and 8; session 3: none spills, nvcc 13.0, both targets)."""
    from kernels.build import CUDA_FLAGS

    def compile_for(arch):
        cmd = [NVCC, *CUDA_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v",
               f"-I{REPO}", f"-I{os.path.join(REPO, 'kernels')}", "-c", os.path.join(REPO, "kernels", "layernorm.cu"),
               "-o", str(tmp_path / f"layernorm_{arch}.o")]
        return arch, subprocess.run(cmd, capture_output=True, text=True)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(compile_for, ["90a", "80"]))
    for arch, res in results:
        assert res.returncode == 0, f"sm_{arch}:\n{res.stderr[-4000:]}"
        assert not re.search(r"warning", res.stderr, re.IGNORECASE), res.stderr[-4000:]
        kernels_seen = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
        assert len(set(kernels_seen)) == EXPECTED_KERNELS, (arch, len(set(kernels_seen)))
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", res.stderr)]
        assert max(spills) <= 8, (arch, spills)

"""GPU tests of the tk fused residual + LayerNorm (kernels/layernorm.cu) against a float64
reference: forward and backward, rows 1 / 7 / 16384, every supported width, with and without
bias and residual, bf16 and fp32; poisoned outputs; opcheck; torch.compile; bad inputs.
Skipped without CUDA. No timing here (bench.py does that)."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import kernels  # noqa: E402
from conftest import rel_err  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ALL_WIDTHS = list(range(64, 4097, 64))                       # every supported hidden size
MODEL_WIDTHS = [384, 768, 1024, 1280, 1600, 2048, 4096]      # the ones models use
TOL = {torch.bfloat16: 1e-2, torch.float32: 2e-5}            # relative norm error allowed


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


def make(rows, cols, dtype, seed, bias=True, residual=True, param_dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def rnd(*shape, dt=dtype, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * scale + shift).to(dt)
    x = rnd(rows, cols, scale=2.0, shift=0.5)                 # non-zero mean, non-unit variance
    r = rnd(rows, cols) if residual else None
    w = rnd(cols, dt=param_dtype, scale=0.5, shift=1.0)
    b = rnd(cols, dt=param_dtype, scale=0.5) if bias else None
    dy = rnd(rows, cols)
    dh = rnd(rows, cols) if residual else None
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


def run_tk(x, r, w, b, dy, dh, eps=1e-5):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, r, w, b)]
    xt, rt, wt, bt = leaves
    poison_allocator(x, x, x)
    y, h = kernels.add_layernorm(xt, rt, wt, bt, eps)
    outs, grads = [y], [dy]
    if rt is not None:
        outs.append(h)
        grads.append(dh)
    got = torch.autograd.grad(outs, [t for t in leaves if t is not None], grads)
    return y, h, got


def check(rows, cols, dtype, bias=True, residual=True, seed=0, param_dtype=torch.float32):
    kernels.configure("auto", layernorm="tk")
    try:
        x, r, w, b, dy, dh = make(rows, cols, dtype, seed, bias, residual, param_dtype)
        y, h, grads = run_tk(x, r, w, b, dy, dh)
        ry, rh, rgrads = reference64(x, r, w, b, dy, dh)
    finally:
        kernels.configure("auto")
    tol = TOL[dtype]
    assert y.dtype == dtype and h.dtype == dtype and y.shape == x.shape
    errs = {"y": rel_err(y, ry), "h": rel_err(h, rh)}
    names = ["dx"] + (["dr"] if residual else []) + ["dw"] + (["db"] if bias else [])
    for name, gt, gr in zip(names, grads, rgrads):
        errs[name] = rel_err(gt, gr)
    for name, gt in zip(names, grads):
        expect = param_dtype if name in ("dw", "db") else dtype
        assert gt.dtype == expect, (name, gt.dtype)
    bad = {k: v for k, v in errs.items() if not v < (1e-2 if k in ("dw", "db") and param_dtype == torch.bfloat16 else tol)}
    assert not bad, f"rows={rows} cols={cols} {dtype}: relative errors over tolerance {bad} (all: {errs})"


# ---- correctness sweeps ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", [1, 7])
def test_every_width_small_rows(ln, rows, dtype):
    for cols in ALL_WIDTHS:
        check(rows, cols, dtype, seed=cols + rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("cols", MODEL_WIDTHS)
def test_model_widths_many_rows(ln, cols, dtype):
    check(16384, cols, dtype, seed=cols)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "noresidual"])
@pytest.mark.parametrize("rows, cols", [(7, 384), (1000, 768), (333, 4096), (5, 1600)])
def test_bias_and_residual_combinations(ln, rows, cols, dtype, bias, residual):
    check(rows, cols, dtype, bias=bias, residual=residual, seed=rows * cols)


def test_bf16_parameters(ln):
    check(513, 768, torch.bfloat16, param_dtype=torch.bfloat16)


def test_three_dim_input_and_mixed_dtypes_like_autocast(ln):
    """The model passes (B, T, C) tensors; under autocast a bf16 branch meets the fp32 stream."""
    g = torch.Generator(device="cuda").manual_seed(5)
    h0 = torch.randn(3, 37, 384, device="cuda", generator=g).requires_grad_()
    branch = torch.randn(3, 37, 384, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = torch.randn(384, device="cuda", generator=g).requires_grad_()
    kernels.configure("auto", layernorm="tk")
    try:
        y, h = kernels.add_layernorm(h0, branch, w, None)
    finally:
        kernels.configure("auto")
    ry, rh = kernels.reference.add_layernorm(h0, branch, w, None)
    assert y.dtype == ry.dtype == torch.float32 and h.dtype == rh.dtype
    assert rel_err(y, ry) < 1e-5 and rel_err(h, rh) < 1e-6
    (y.square().sum() + h.sum()).backward()
    assert branch.grad.dtype == torch.bfloat16 and h0.grad.dtype == torch.float32
    assert torch.isfinite(branch.grad.float()).all()


def test_unused_h_and_empty_rows(ln):
    x, r, w, b, dy, _ = make(64, 768, torch.bfloat16, 3)
    xt, rt = x.clone().requires_grad_(), r.clone().requires_grad_()
    y, _, _, _ = ln.add_layernorm_fwd(xt, rt, w, b, 1e-5)      # h unused: its grad is zero
    (gx,) = torch.autograd.grad(y, [xt], dy)
    ry, _, (rgx, *_) = reference64(x, r, w, b, dy, torch.zeros_like(dy))
    assert rel_err(gx, rgx) < 1e-2
    e = torch.empty(0, 768, device="cuda", dtype=torch.bfloat16)
    y, h, mean, rstd = ln.add_layernorm_fwd(e, e, w, b, 1e-5)
    assert y.shape == (0, 768) and mean.shape == (0,)
    dx, dw, db = ln.layernorm_bwd(e, None, e, mean, rstd, w)
    assert dx.shape == (0, 768) and (dw == 0).all() and (db == 0).all()


def test_statistics_and_determinism(ln):
    x, r, w, b, dy, dh = make(4099, 1280, torch.float32, 11)
    y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5)
    h64 = x.double() + r.double()
    torch.testing.assert_close(mean.double(), h64.mean(-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(rstd.double(), (h64.var(-1, unbiased=False) + 1e-5).rsqrt(), rtol=1e-5, atol=0)
    first = ln.layernorm_bwd(dy, dh, h, mean, rstd, w)
    second = ln.layernorm_bwd(dy, dh, h, mean, rstd, w)
    for a, c in zip(first, second):
        assert torch.equal(a, c), "backward is not bitwise reproducible"


def test_used_reports_tk(ln):
    kernels.configure("auto", layernorm="tk")
    kernels.reset_used()
    try:
        x, r, w, b, _, _ = make(8, 768, torch.bfloat16, 1)
        kernels.add_layernorm(x, r, w, b)
        assert kernels.used()["layernorm"] == "tk"
    finally:
        kernels.configure("auto")
        kernels.reset_used()


# ---- torch.library and torch.compile -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_opcheck(ln, dtype):
    x, r, w, b, dy, dh = make(33, 384, dtype, 2)
    xs, rs, ws, bs = (t.clone().requires_grad_() for t in (x, r, w, b))
    torch.library.opcheck(torch.ops.tk.add_layernorm_fwd.default, (xs, rs, ws, bs, 1e-5))
    torch.library.opcheck(torch.ops.tk.add_layernorm_fwd.default, (xs, rs, ws, None, 1e-5))
    torch.library.opcheck(torch.ops.tk.layernorm_fwd.default, (xs, ws, bs, 1e-5))
    y, h, mean, rstd = ln.add_layernorm_fwd(x, r, w, b, 1e-5)
    torch.library.opcheck(torch.ops.tk.layernorm_bwd.default, (dy, dh, h, mean, rstd, w))
    torch.library.opcheck(torch.ops.tk.layernorm_bwd.default, (dy, None, h, mean, rstd, w))


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
        return (y * h).sum()


def test_torch_compile_matches_eager(ln):
    torch.manual_seed(0)
    m = TwoNorms(768).cuda()
    h = torch.randn(4, 65, 768, device="cuda")
    branch = torch.randn(4, 65, 768, device="cuda")
    kernels.configure("auto", layernorm="tk")
    kernels.reset_used()
    try:
        loss_e = m(h, branch)
        grads_e = torch.autograd.grad(loss_e, list(m.parameters()))
        compiled = torch.compile(m, fullgraph=False)
        loss_c = compiled(h, branch)
        grads_c = torch.autograd.grad(loss_c, list(m.parameters()))
        assert kernels.used()["layernorm"] == "tk"
    finally:
        kernels.configure("auto")
        kernels.reset_used()
    assert rel_err(loss_c.reshape(1), loss_e.reshape(1)) < 1e-5
    for gc, ge in zip(grads_c, grads_e):
        assert rel_err(gc, ge) < 1e-4


# ---- bad inputs: Python errors naming the argument ---------------------------------------------

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
]
# First the checks alone (check_forward/check_backward return the message, no C++ throw), then
# the real calls, which raise it: if a raise ever crashed again, the log would tell the two apart.
for i, (fn, args, exc, fragment) in enumerate(cases):
    problem = getattr(ext, "check_" + fn)(*args)
    assert fragment in problem, (i, fragment, problem)
    print(f"check {i}: {problem}", flush=True)
assert ext.check_forward(x, r, w, b, 1e-5) == "" and ext.check_backward(dy, dh, h, mean, rstd, w) == ""
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
print("all bad inputs refused", flush=True)
"""


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

"""Tests of the residual dropout fused into add_layernorm: h = x + dropout(residual), y = LN(h).

The kernels' mask is a function of (seed, element index) (kernels/layernorm.cu, "dropout");
kernels.layernorm.dropout_keep_mask is the same function in numpy. So the statistics of the mask
are tested on the CPU on that twin, and the GPU tests check that the kernel's mask IS the twin's
(recovered from the forward's h, with residual elements of magnitude >= 1 so a kept one always
changes h) and that the backward regenerates the same mask from the saved seed.

CPU: keep rate, per-row/per-column rates and neighbour correlations within statistical bounds;
different seeds differ; p's 16-bit threshold; bad p and bad seeds are clear errors; the reference
path (kernels=torch) is F.dropout; the Python half with a fake extension (the seed reaches forward
and backward, the branch's gradient is masked, p=0 passes no dropout argument, opcheck, a real
torch.compile); model.py routes each branch's dropout into add_layernorm, and only in training.
GPU (skipped without CUDA): the kernel's mask equals the twin's at awkward shapes and every dtype
combination; values and gradients vs float64 using that mask; dr == dx * mask / (1 - p) bit for
bit (fp32 h); fresh masks per call and per CUDA-graph replay; p=0 bit-identical to no dropout;
opcheck; torch.compile; the bindings' checks. No timing here (kernels/layernorm_bench.py).
"""
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import kernels  # noqa: E402
from kernels import layernorm as L  # noqa: E402
from kernels import reference  # noqa: E402
from conftest import rel_err, use_cpu_checks  # noqa: E402
from test_layernorm import MixedFakeExt  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
F32, BF16 = torch.float32, torch.bfloat16
TOL = {BF16: 1e-2, F32: 2e-5}


def keep_prob(p):
    """The kernel's keep probability for p (p is kept to 16 bits)."""
    return 1 - math.floor(p * 65536 + 0.5) / 65536


def within(observed, expected, n, sigmas=5.0):
    """|observed - expected| within `sigmas` binomial standard deviations of n draws."""
    sd = math.sqrt(expected * (1 - expected) / n)
    return abs(observed - expected) <= sigmas * sd + 1e-12, f"{observed:.6f} vs {expected:.6f} (sd {sd:.2e})"


# ---- CPU: the mask's statistics, on the numpy twin --------------------------------------------

@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_cpu_keep_rate_rows_columns_and_neighbours(p):
    rows, cols = 16384, 384
    keep = L.dropout_keep_mask(12345, rows, cols, p)
    q = keep_prob(p)
    ok, msg = within(keep.mean(), q, keep.size)
    assert ok, f"keep rate {msg}"
    # every column and every row (each a 'fresh' binomial sample): 6 sigma over 384 / 16384 tests
    for axis, n in ((0, rows), (1, cols)):
        rates = keep.mean(axis=axis)
        worst = np.abs(rates - q).max()
        assert worst <= 6 * math.sqrt(q * (1 - q) / n), (axis, worst)
    # neighbours: both kept with probability q^2 (no correlation), for elements that share a hash
    # (offset 1, inside a group of 4), the next group (offset 4) and the next row (offset cols)
    flat = keep.reshape(-1)
    for offset in (1, 2, 3, 4, cols):
        both = (flat[:-offset] & flat[offset:]).mean()
        ok, msg = within(both, q * q, flat.size - offset, sigmas=6)
        assert ok, f"offset {offset}: P(both kept) {msg}"


def test_cpu_different_seeds_give_unrelated_masks():
    p, rows, cols = 0.2, 4096, 384
    q = keep_prob(p)
    base = L.dropout_keep_mask(7, rows, cols, p)
    for other in (8, 7 + 2**40, 2**62 - 1, 123456789):
        mask = L.dropout_keep_mask(other, rows, cols, p)
        same = (mask == base).mean()
        ok, msg = within(same, q * q + (1 - q) ** 2, base.size)
        assert ok, f"seed {other}: fraction equal {msg}"
    assert np.array_equal(L.dropout_keep_mask(7, rows, cols, p), base)   # a pure function of the seed


def test_cpu_p_is_kept_to_16_bits():
    assert L.dropout_keep_mask(3, 64, 256, 1e-6).all()            # rounds to threshold 0: keep all
    assert L.dropout_keep_mask(3, 64, 256, 0.0).all()
    nearly_all = L.dropout_keep_mask(3, 256, 256, 0.99999)       # threshold 65535: keep 1 in 65536
    assert nearly_all.sum() <= 8
    assert keep_prob(0.2) == 1 - 13107 / 65536


# ---- CPU: bad p, bad seeds, the reference path ------------------------------------------------

def ln_inputs(rows=6, cols=128, seed=0, dtype=F32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, cols, generator=g) * 2 + 0.5).to(dtype)
    sign = torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0)
    r = (sign * (1 + torch.rand(rows, cols, generator=g))).to(dtype)   # |r| >= 1: a kept r shows in h
    w = torch.randn(cols, generator=g) * 0.5 + 1
    b = torch.randn(cols, generator=g) * 0.5
    return x, r, w, b


@pytest.mark.parametrize("switch", ["torch", "auto"])
@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan"), True, "0.2"])
def test_cpu_bad_p_is_a_clear_error(switch, p):
    x, r, w, b = ln_inputs()
    kernels.configure(switch)
    try:
        with pytest.raises(ValueError, match=r"dropout_p must be a number in \[0, 1\)"):
            kernels.add_layernorm(x, r, w, b, 1e-5, p)
    finally:
        kernels.configure("auto")
    with pytest.raises((ValueError, TypeError), match=r"dropout_p must be"):
        L.add_layernorm(x, r, w, b, 1e-5, p)


def test_cpu_bad_seeds_name_the_argument():
    x, r, w, b = ln_inputs()
    seed = torch.tensor([5])
    cases = [
        (dict(dropout_seed=seed.float()), TypeError, "dropout_seed must be"),
        (dict(dropout_seed=torch.tensor([1, 2])), ValueError, "dropout_seed must hold one value"),
        (dict(dropout_seed=seed, dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            L.check_forward(x, r, w, b, 1e-5, **kwargs, cuda=False)
    with pytest.raises(ValueError, match="dropout_seed is given but residual is None"):
        L.check_forward(x, None, w, b, 1e-5, dropout_seed=seed, dropout_p=0.2, cuda=False)
    L.check_forward(x, r, w, b, 1e-5, dropout_seed=seed, dropout_p=0.2, cuda=False)   # a good one passes


def test_cpu_reference_path_is_f_dropout():
    """kernels=torch: h = x + F.dropout(residual, p): each element of h - x is 0 or r / (1 - p),
    about 1 - p of them kept; p = 0 is the plain add."""
    x, r, w, b = ln_inputs(rows=512, cols=256)
    kernels.configure("torch")
    try:
        torch.manual_seed(0)
        y, h = kernels.add_layernorm(x, r, w, b, 1e-5, 0.25)
        y0, h0 = kernels.add_layernorm(x, r, w, b, 1e-5, 0.0)
    finally:
        kernels.configure("auto")
    added = h - x
    kept = added != 0
    torch.testing.assert_close(added[kept], (r / 0.75)[kept])
    ok, msg = within(kept.float().mean().item(), 0.75, kept.numel())
    assert ok, msg
    torch.testing.assert_close(y, F.layer_norm(h, (256,), w, b, 1e-5))
    assert torch.equal(h0, x + r) and torch.equal(y0, reference.add_layernorm(x, r, w, b)[0])


# ---- CPU: the Python half with a fake extension ----------------------------------------------

def twin_mask(seed, shape, p):
    """The twin's mask for a seed tensor, as a float64 tensor of 0/1 shaped like `shape`."""
    cols = shape[-1]
    rows = math.prod(shape) // cols
    return torch.from_numpy(L.dropout_keep_mask(int(seed.item()), rows, cols, p)).double().reshape(shape)


class DropoutFakeExt(MixedFakeExt):
    """The bindings' forward/backward with dropout, in plain torch (the mask from the twin)."""

    def __init__(self):
        super().__init__()
        self.seeds = []   # ("forward" | "backward", the seed tensor) per call with dropout

    def forward(self, x, residual, weight, bias, eps, y_bf16=False, dropout_seed=None, dropout_p=0.0):
        if dropout_seed is None:
            return super().forward(x, residual, weight, bias, eps, y_bf16)
        self.seeds.append(("forward", dropout_seed))
        keep = twin_mask(dropout_seed, x.shape, dropout_p)
        h = (x.double() + residual.double() * keep / (1 - dropout_p)).to(x.dtype)
        y, _, mean, rstd = super().forward(h, None, weight, bias, eps, y_bf16)
        return [y, h, mean, rstd]

    def backward(self, dy, dh, h, mean, rstd, weight, residual_grad_bf16=False, dropout_seed=None, dropout_p=0.0):
        out = super().backward(dy, dh, h, mean, rstd, weight, residual_grad_bf16)
        if dropout_seed is None:
            return out
        self.seeds.append(("backward", dropout_seed))
        keep = twin_mask(dropout_seed, h.shape, dropout_p)
        dr = (out[0].double() * keep / (1 - dropout_p)).to(BF16 if residual_grad_bf16 else h.dtype)
        return out[:3] + [dr]


@pytest.fixture
def drop_ext(monkeypatch):
    fake = DropoutFakeExt()
    monkeypatch.setattr(L._ext, "_module", fake)
    use_cpu_checks(monkeypatch, L, "check_forward", "check_backward")
    # a CPU seed (the real one is drawn on x's device, which is the CPU here too)
    return fake


@pytest.mark.parametrize("compiling", [False, True], ids=["fast_path", "custom_ops"])
@pytest.mark.parametrize("dtypes", [(F32, F32), (F32, BF16), (BF16, BF16)], ids=["fp32", "fp32_bf16r", "bf16"])
def test_cpu_fake_ext_same_seed_forward_and_backward(drop_ext, monkeypatch, dtypes, compiling):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    x_dtype, r_dtype = dtypes
    x, r, w, b = ln_inputs(rows=4, cols=128, seed=1)
    x, r = x.to(x_dtype).requires_grad_(), r.to(r_dtype).requires_grad_()
    p = 0.3
    y, h = L.add_layernorm(x, r, w, b, 1e-5, p)
    g = torch.Generator().manual_seed(2)
    dy, dh = torch.randn(y.shape, generator=g).to(y.dtype), torch.randn(h.shape, generator=g).to(h.dtype)
    dx, dr = torch.autograd.grad((y, h), (x, r), (dy, dh))
    (kind_f, seed_f), (kind_b, seed_b) = drop_ext.seeds
    assert (kind_f, kind_b) == ("forward", "backward") and seed_b is seed_f   # the saved seed, not a new draw
    keep = twin_mask(seed_f, h.shape, p)
    # the mask as seen in h (|r| >= 1, so a kept element always changes h)
    assert torch.equal((h.double() != x.double()).double(), keep)
    # x's gradient is the plain LN gradient; r's is it, masked and scaled
    assert dx.dtype == x_dtype and dr.dtype == r_dtype
    want = (dx.double() * keep / (1 - p)).to(r_dtype)
    tol = TOL[BF16] if BF16 in dtypes else 1e-6
    assert rel_err(dr, want) < tol


def test_cpu_fake_ext_p0_passes_no_dropout_argument(drop_ext):
    x, r, w, b = ln_inputs()
    y0, h0 = L.add_layernorm(x, r, w, b, 1e-5)
    y1, h1 = L.add_layernorm(x, r, w, b, 1e-5, 0.0)
    assert drop_ext.seeds == [] and torch.equal(y0, y1) and torch.equal(h0, h1)
    assert torch.equal(h0, x + r)


def test_cpu_dropout_of_a_wider_residual_is_refused_not_misapplied(drop_ext):
    """bf16 x beside an fp32 residual: the op swaps them (h is stored in the first input's
    dtype), so the kernel would drop x. The public op refuses, as why_not does."""
    x, r, w, b = ln_inputs(rows=4, cols=128)
    with pytest.raises(ValueError, match="dropout of a residual wider than x"):
        L.add_layernorm(x.to(BF16), r, w, b, 1e-5, 0.2)
    assert drop_ext.seeds == []
    y, h = L.add_layernorm(x.to(BF16), r, w, b, 1e-5)   # without dropout the swap is fine
    assert h.dtype == F32 and torch.equal(h, x.to(BF16).float() + r)

def test_cpu_fake_ext_opcheck_of_the_dropout_ops(drop_ext):
    x, r, w, b = ln_inputs(rows=3, cols=128)
    seed = torch.tensor([99], dtype=torch.int64)
    for r_dtype, y_bf16 in ((F32, False), (BF16, True)):
        args = (x.requires_grad_(), r.to(r_dtype).requires_grad_(), w.requires_grad_(), b, 1e-5, y_bf16, seed, 0.2)
        torch.library.opcheck(torch.ops.tk.add_layernorm_fwd.default, args)
    y, h, mean, rstd = L.add_layernorm_fwd(x.detach(), r.detach(), w.detach(), b, 1e-5, False, seed, 0.2)
    dy, dh = torch.randn(y.shape), torch.randn(h.shape)
    for split in (False, True):
        torch.library.opcheck(torch.ops.tk.layernorm_bwd_dropout.default,
                              (dy, dh, h, mean, rstd, w.detach(), seed, 0.2, split))


def test_cpu_fake_ext_torch_compile_traces_the_dropout_call(drop_ext, monkeypatch):
    """A real torch.compile (aot_eager, one graph): the seed is drawn inside the graph, the custom
    ops get it, and the backward sees the forward's mask."""
    monkeypatch.setattr(L, "_autocast_bf16", lambda: True)
    x, r, w, b = ln_inputs(rows=4, cols=128, seed=3)
    x, r = x.requires_grad_(), r.to(BF16).requires_grad_()

    def step(x, r, w, b):
        y, h = L.add_layernorm(x, r, w, b, 1e-5, 0.2)
        return y, h
    torch._dynamo.reset()
    y, h = torch.compile(step, backend="aot_eager", fullgraph=True)(x, r, w, b)
    dx, dr = torch.autograd.grad((y.float().sum() + (h * h).sum()), (x, r))
    (_, seed_f), (_, seed_b) = drop_ext.seeds[-2:]
    assert int(seed_f.item()) == int(seed_b.item())
    keep = twin_mask(seed_f, h.shape, 0.2)
    assert torch.equal((h.double() != x.double()).double(), keep)
    assert rel_err(dr, (dx.double() * keep / 0.8).to(BF16)) < TOL[BF16]


# ---- CPU: model.py routes each branch's dropout into add_layernorm ----------------------------

def test_cpu_model_passes_dropout_to_every_add_with_a_branch(monkeypatch):
    from model import GPT, GPTConfig
    calls = []
    real = kernels.add_layernorm

    def spy(x, residual, weight, bias, eps=1e-5, dropout_p=0.0):
        calls.append((residual is not None, dropout_p))
        return real(x, residual, weight, bias, eps, dropout_p)
    monkeypatch.setattr(kernels, "add_layernorm", spy)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=64, dropout=0.2))
    assert not [m for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and name != "drop"]
    idx = torch.randint(0, 64, (2, 16))
    model.train()
    _, loss = model(idx, idx)
    # layer 0's ln_1 has no branch; every other add (ln_2, the next ln_1, ln_f) drops its branch
    assert calls == [(False, 0.2)] + [(True, 0.2)] * 4
    calls.clear()
    model.eval()
    model(idx, idx)
    assert all(p == 0.0 for _, p in calls) and len(calls) == 5
    assert torch.isfinite(loss)


# ---- GPU: the kernel's mask, values and gradients ---------------------------------------------

COMBOS = {   # (x dtype, residual dtype, bf16 autocast): each kernel dtype instance
    "fp32": (F32, F32, False),
    "bf16": (BF16, BF16, False),
    "fp32_bf16r": (F32, BF16, False),
    "fp32_autocast": (F32, F32, True),
    "fp32_bf16r_autocast": (F32, BF16, True),   # the model under bf16 autocast
}


@pytest.fixture(scope="module")
def ln():
    reason = L._ext.why_not()
    assert reason is None, reason
    return L


@pytest.fixture
def seeds(monkeypatch):
    """The seed tensors the public op draws, in order."""
    drawn = []
    real = L.draw_dropout_seed

    def record(device):
        seed = real(device)
        drawn.append(seed)
        return seed
    monkeypatch.setattr(L, "draw_dropout_seed", record)
    return drawn


def gpu_inputs(rows, cols, combo, seed):
    x_dtype, r_dtype, autocast = combo
    h_dtype = torch.promote_types(x_dtype, r_dtype)
    y_dtype = BF16 if autocast else h_dtype
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")
    x = (rnd(rows, cols) * 2 + 0.5).to(x_dtype)
    sign = torch.where(torch.rand(rows, cols, generator=g, device="cuda") < 0.5, -1.0, 1.0)
    r = (sign * (1 + torch.rand(rows, cols, generator=g, device="cuda"))).to(r_dtype)
    w, b = rnd(cols) * 0.5 + 1, rnd(cols) * 0.5
    dy, dh = rnd(rows, cols).to(y_dtype), rnd(rows, cols).to(h_dtype)
    return x, r, w, b, dy, dh


def run(x, r, w, b, dy, dh, p, autocast):
    leaves = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    with torch.autocast("cuda", dtype=BF16, enabled=autocast):
        y, h = kernels.add_layernorm(*leaves, 1e-5, p)
    grads = torch.autograd.grad((y, h), leaves, (dy, dh))
    return y, h, grads


def mask_in(h, x):
    """The kept elements, read off h (|r| >= 1 makes every kept one change h)."""
    return (h.double() != x.double()).double()


def twin_for(seed, shape, p):
    return twin_mask(seed.cpu(), shape, p).cuda()


@needs_cuda
@pytest.mark.parametrize("combo", list(COMBOS))
@pytest.mark.parametrize("rows, cols", [(1, 64), (7, 384), (333, 768), (5, 1600), (9, 4096), (4099, 1024),
                                        (16384, 384)])
def test_kernel_mask_is_the_twins_and_gradients_match_float64(ln, seeds, rows, cols, combo):
    x_dtype, r_dtype, autocast = COMBOS[combo]
    p = 0.2
    kernels.configure("auto", layernorm="tk")
    try:
        x, r, w, b, dy, dh = gpu_inputs(rows, cols, COMBOS[combo], seed=rows + cols)
        y, h, (dx, dr, dw, db) = run(x, r, w, b, dy, dh, p, autocast)
    finally:
        kernels.configure("auto")
    where = f"rows={rows} cols={cols} {combo}"
    assert len(seeds) == 1, where
    keep = twin_for(seeds[0], h.shape, p)
    assert torch.equal(mask_in(h, x), keep), f"{where}: the kernel's mask is not the twin's"
    # float64 reference on the same mask: h = x + r * keep / (1 - p)
    leaves = [t.detach().double().requires_grad_() for t in (x, r, w, b)]
    x64, r64, w64, b64 = leaves
    h64 = x64 + r64 * keep / (1 - p)
    y64 = F.layer_norm(h64, (cols,), w64, b64, 1e-5)
    ref = torch.autograd.grad((y64, h64), leaves, (dy.double(), dh.double()))
    bf16_h = x_dtype == BF16
    errs = {name: rel_err(got, want) for name, got, want in
            (("y", y, y64), ("h", h, h64), ("dx", dx, ref[0]), ("dr", dr, ref[1]), ("dw", dw, ref[2]), ("db", db, ref[3]))}
    tols = {name: TOL[BF16] if (bf16_h or t.dtype == BF16) else TOL[F32]
            for name, t in (("y", y), ("h", h), ("dx", dx), ("dr", dr), ("dw", dw), ("db", db))}
    bad = {k: e for k, e in errs.items() if not e < tols[k]}
    assert not bad, f"{where}: over tolerance {bad} (all {errs})"
    if not bf16_h:   # fp32 dh_out: the branch's gradient is exactly it, masked, scaled, rounded once
        scale = torch.tensor(1 / (1 - p), dtype=F32)
        assert torch.equal(dr, (dx * keep.float() * scale.cuda()).to(r_dtype)), where


@needs_cuda
def test_keep_rate_on_the_gpu_and_fresh_masks_each_call(ln, seeds):
    rows, cols, p = 16384, 384, 0.2
    x, r, w, b, dy, dh = gpu_inputs(rows, cols, COMBOS["fp32_bf16r_autocast"], seed=11)
    kernels.configure("auto", layernorm="tk")
    try:
        masks = [mask_in(run(x, r, w, b, dy, dh, p, True)[1], x) for _ in range(3)]
    finally:
        kernels.configure("auto")
    q = keep_prob(p)
    for m in masks:
        ok, msg = within(m.mean().item(), q, m.numel())
        assert ok, msg
    for a, c in ((0, 1), (1, 2), (0, 2)):
        same = (masks[a] == masks[c]).double().mean().item()
        ok, msg = within(same, q * q + (1 - q) ** 2, masks[a].numel())
        assert ok, f"calls {a}, {c}: {msg}"
    assert len({int(s.item()) for s in seeds}) == 3


@needs_cuda
@pytest.mark.parametrize("combo", list(COMBOS))
def test_p0_is_bit_identical_to_no_dropout(ln, seeds, combo):
    x, r, w, b, dy, dh = gpu_inputs(1000, 768, COMBOS[combo], seed=3)
    autocast = COMBOS[combo][2]
    kernels.configure("auto", layernorm="tk")
    try:
        leaves = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
        with torch.autocast("cuda", dtype=BF16, enabled=autocast):
            y0, h0 = kernels.add_layernorm(*leaves, 1e-5)
        g0 = torch.autograd.grad((y0, h0), leaves, (dy, dh))
        y1, h1, g1 = run(x, r, w, b, dy, dh, 0.0, autocast)
    finally:
        kernels.configure("auto")
    assert seeds == []
    assert torch.equal(y0, y1) and torch.equal(h0, h1)
    assert all(torch.equal(a, c) for a, c in zip(g0, g1))


@needs_cuda
def test_cuda_graph_replays_draw_fresh_masks(ln):
    """The seed is drawn inside the graph: each replay has its own mask, and each replay's branch
    gradient is masked by that replay's mask."""
    rows, cols, p = 4096, 384, 0.2
    x, r, w, b, dy, dh = gpu_inputs(rows, cols, COMBOS["fp32_bf16r_autocast"], seed=5)
    xs, rs = x.clone().requires_grad_(), r.clone().requires_grad_()
    ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()
    kernels.configure("auto", layernorm="tk")

    def step():
        with torch.autocast("cuda", dtype=BF16):
            y, h = kernels.add_layernorm(xs, rs, ws, bs, 1e-5, p)
        dx, dr = torch.autograd.grad((y, h), (xs, rs), (dy, dh))
        return h, dx, dr
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            h, dx, dr = step()
        masks = []
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            keep = mask_in(h, x)
            masks.append(keep)
            assert torch.equal(dr, (dx * keep.float() * torch.tensor(1 / (1 - p), device="cuda")).to(BF16))
            ok, msg = within(keep.mean().item(), keep_prob(p), keep.numel())
            assert ok, msg
    finally:
        kernels.configure("auto")
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])


@needs_cuda
def test_opcheck_with_dropout(ln):
    x, r, w, b, dy, dh = gpu_inputs(37, 384, COMBOS["fp32_bf16r"], seed=9)
    seed = L.draw_dropout_seed(x.device)
    for y_bf16 in (False, True):
        torch.library.opcheck(torch.ops.tk.add_layernorm_fwd.default,
                              (x.requires_grad_(), r.requires_grad_(), w.requires_grad_(), b, 1e-5, y_bf16, seed, 0.2))
    y, h, mean, rstd = L.add_layernorm_fwd(x.detach(), r.detach(), w.detach(), b, 1e-5, True, seed, 0.2)
    torch.library.opcheck(torch.ops.tk.layernorm_bwd_dropout.default, (dy.to(BF16), dh, h, mean, rstd, w.detach(), seed, 0.2, True))
    torch.library.opcheck(torch.ops.tk.layernorm_bwd_dropout.default, (dy.to(BF16), None, h, mean, rstd, w.detach(), seed, 0.2, False))


@needs_cuda
@pytest.mark.parametrize("backend, combo", [("aot_eager", "fp32_bf16r_autocast"), ("inductor", "fp32_bf16r")])
def test_torch_compile_with_dropout(ln, backend, combo):
    """The compiled call draws a seed in its graph (inductor may use its own RNG for it): the
    mask seen in h is one the kernel makes (keep rate) and the backward uses the same one.
    (Inductor without autocast, as test_layernorm.py's compile test: one inductor compile.)"""
    rows, cols, p = 2048, 768, 0.2
    autocast = COMBOS[combo][2]
    x, r, w, b, dy, dh = gpu_inputs(rows, cols, COMBOS[combo], seed=13)
    xs, rs = x.clone().requires_grad_(), r.clone().requires_grad_()
    kernels.configure("auto", layernorm="tk")
    try:
        def f(x, r, w, b):
            with torch.autocast("cuda", dtype=BF16, enabled=autocast):
                return kernels.add_layernorm(x, r, w, b, 1e-5, p)
        torch._dynamo.reset()
        compiled = torch.compile(f, backend=backend)
        for _ in range(2):
            y, h = compiled(xs, rs, w, b)
            dx, dr = torch.autograd.grad((y, h), (xs, rs), (dy, dh))
            keep = mask_in(h, x)
            ok, msg = within(keep.mean().item(), keep_prob(p), keep.numel())
            assert ok, msg
            assert torch.equal(dr, (dx * keep.float() * torch.tensor(1 / (1 - p), device="cuda")).to(r.dtype))
    finally:
        kernels.configure("auto")


@needs_cuda
def test_bindings_refuse_bad_dropout_arguments(ln):
    """The C++ checks (called without the Python ones): a Python error naming the argument."""
    ext = L._ext.module
    x, r, w, b, dy, dh = gpu_inputs(8, 128, COMBOS["fp32"], seed=1)
    seed = L.draw_dropout_seed(x.device)
    cases = [
        (dict(dropout_seed=seed.cpu(), dropout_p=0.2), ValueError, "dropout_seed must be on cuda"),
        (dict(dropout_seed=seed.float(), dropout_p=0.2), TypeError, "dropout_seed must be int64"),
        (dict(dropout_seed=torch.zeros(2, dtype=torch.int64, device="cuda"), dropout_p=0.2), ValueError, "one value"),
        (dict(dropout_seed=seed, dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
        (dict(dropout_seed=seed, dropout_p=-0.5), ValueError, r"dropout_p must be in \[0, 1\)"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            ext.forward(x, r, w, b, 1e-5, **kwargs)
    with pytest.raises(ValueError, match="residual is None"):
        ext.forward(x, None, w, b, 1e-5, dropout_seed=seed, dropout_p=0.2)
    _, h, mean, rstd = ext.forward(x, r, w, b, 1e-5)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        ext.backward(dy, dh, h, mean, rstd, w, dropout_seed=seed, dropout_p=1.0)


@needs_cuda
def test_why_not_refuses_dropout_of_a_wider_residual(ln):
    x, r, w, b, _, _ = gpu_inputs(8, 128, COMBOS["fp32_bf16r"], seed=2)
    assert L.why_not(r, x, w, b, 1e-5, 0.2) is not None        # bf16 x, fp32 residual: swapped in the kernel
    assert L.why_not(r, x, w, b, 1e-5) is None                  # fine without dropout
    assert L.why_not(x, r, w, b, 1e-5, 0.2) is None


def test_cpu_unfused_switch_drops_with_f_dropout(drop_ext, monkeypatch):
    """TK_LAYERNORM_DROPOUT=unfused (A/B runs): F.dropout's mask before the kernel, no seed drawn."""
    monkeypatch.setattr(L, "DROPOUT_UNFUSED", True)
    x, r, w, b = ln_inputs(rows=64, cols=128)
    torch.manual_seed(0)
    y, h = L.add_layernorm(x, r, w, b, 1e-5, 0.5)
    assert drop_ext.seeds == []
    added = h - x
    kept = added != 0
    torch.testing.assert_close(added[kept], (r / 0.5)[kept])
    assert 0.35 < kept.float().mean().item() < 0.65


@needs_cuda
def test_model_masks_are_fresh_per_layer_and_per_step(ln, monkeypatch):
    """The real model in training (bf16 autocast, tk layernorm): every add with a branch drops it
    with keep rate ~0.8, and the masks of different layers and of the same layer in consecutive
    steps agree as independent masks would (q^2 + (1-q)^2 of the elements)."""
    from model import GPT, GPTConfig
    calls = []
    real = kernels.add_layernorm

    def spy(x, residual, weight, bias, eps=1e-5, dropout_p=0.0):
        y, h = real(x, residual, weight, bias, eps, dropout_p)
        if residual is not None and dropout_p > 0:
            calls.append((x.detach().clone(), residual.detach().clone(), h.detach().clone()))
        return y, h
    monkeypatch.setattr(kernels, "add_layernorm", spy)
    kernels.configure("auto", layernorm="tk")
    try:
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=128, vocab_size=65, n_layer=4, n_head=4, n_embd=256, dropout=0.2)).cuda()
        model.train()
        idx = torch.randint(0, 65, (16, 128), device="cuda")
        for _ in range(2):
            with torch.autocast("cuda", dtype=BF16):
                _, loss = model(idx, idx)
            loss.backward()
    finally:
        kernels.configure("auto")
    assert len(calls) == 2 * 2 * 4   # per step: ln_2 of each block, ln_1 of blocks 1..3, ln_f
    masks = []
    for x, r, h in calls:
        assert h.dtype == F32 and r.dtype == BF16   # the fp32 stream and the bf16 branch
        # where r is not tiny next to x, a kept element changes h (2^-24 relative would do)
        visible = r.float().abs() > 1e-5 * x.abs().clamp_min(1e-3)
        masks.append((h != x, visible))
    q = keep_prob(0.2)
    for kept, visible in masks:
        rate = kept[visible].float().mean().item()
        assert abs(rate - q) < 0.004, rate   # ~7 sd of 5e5 draws
    agree = q * q + (1 - q) ** 2
    for i in range(len(masks)):
        for j in range(i + 1, len(masks)):
            both = masks[i][1] & masks[j][1]
            same = (masks[i][0] == masks[j][0])[both].float().mean().item()
            assert abs(same - agree) < 0.004, (i, j, same)

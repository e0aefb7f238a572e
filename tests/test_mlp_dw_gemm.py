"""TK_MLP_DW_GEMM=planned (session 10, W; opt-in): the MLP backward's two weight gradients on
kernels/gemm.py's matmul (step 4 variant 9: whole 128x256 tiles + k-pieces summed in the kernel)
instead of the extension's split-K weight_grad; the extension's backward skips those two launches
and the zeroing of their buffer and hands back dpre (mlp_bindings.cpp, dw_outside).

CPU tests (a fake extension and a fake matmul; run in CI): the flag is read at each backward; on,
the extension is asked for dpre and the two products go to matmul with step 4 / variant 9 in fp32
(fp32-weight path) or bf16; token counts that are not a multiple of 16 and the flag off keep the old
call; a bad value is refused naming the variable.
GPU tests (skip without CUDA): the gradients against float64 at M = 1, 333, 4099 (the old path
under the flag: not a multiple of 16), 4112 and 32752 (the new path, K tails) and 32768 (GPT-2),
with the fp32-weight path and with bf16 weights, with and without biases; agreement with the default
path (dx bit for bit, weight gradients within fp32 / bf16 summation noise); the custom op under the
flag; a CUDA-graph capture + replay (warmed up, and a first call inside the capture); and which
kernels ran (torch.profiler names: scheduled_splitk_epilogue with the flag, reduce_add_epilogue
without)."""
import collections

import pytest
import torch
import torch.nn.functional as F

from kernels import gemm, mlp_op

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
ENV = "TK_MLP_DW_GEMM"


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


# ---- CPU: the plumbing, on a fake extension and a fake matmul ----------------------------------

class FakeExt:
    """mlp_bindings.cpp's forward/backward in float32 on the CPU (pre, not gelu'(pre), is saved)."""

    def __init__(self, calls):
        self.calls = calls

    def forward(self, x, w_fc, b_fc, w_proj, b_proj):
        pre = x.float() @ w_fc.float().T + (0 if b_fc is None else b_fc.float())
        h = F.gelu(pre, approximate="tanh")
        y = h @ w_proj.float().T + (0 if b_proj is None else b_proj.float())
        return [y.bfloat16(), pre.bfloat16(), h.bfloat16()]

    def backward(self, dy, x, pre, h, w_fc, w_proj, bias_grads=True, saved=-1, dw_float=False, dw_outside=False):
        self.calls[f"backward dw_outside={dw_outside}"] += 1
        with torch.enable_grad():                  # (autograd runs a backward with grad mode off)
            p = pre.float().requires_grad_()
            dpre = torch.autograd.grad(F.gelu(p, approximate="tanh"), p, dy.float() @ w_proj.float())[0]
        dx = (dpre @ w_fc.float()).bfloat16()
        db = (dpre.sum(0), dy.float().sum(0)) if bias_grads else (dpre[0, :0], dy[0, :0].float())
        if dw_outside:
            return [dx, x.new_empty(0), db[0].bfloat16(), x.new_empty(0), db[1].bfloat16(), dpre.bfloat16()]
        dw = (dpre.T @ x.float(), dy.float().T @ h.float())
        dw = dw if dw_float else tuple(w.bfloat16() for w in dw)
        return [dx, dw[0], db[0].bfloat16(), dw[1], db[1].bfloat16()]


@pytest.fixture
def fake(monkeypatch):
    calls = collections.Counter()
    monkeypatch.setattr(mlp_op._ext, "_module", FakeExt(calls))
    for name in ("check_forward", "check_backward"):
        real = getattr(mlp_op, name)
        monkeypatch.setattr(mlp_op, name, lambda *a, real=real, **k: real(*a, **{**k, "cuda": False}))
    monkeypatch.setattr(mlp_op, "_saves_gelu_grad", lambda has_biases: False)   # the fake saves pre

    def matmul(a, b, *, out_dtype=torch.bfloat16, step=4, variant=0, **rest):
        calls[f"matmul step={step} variant={variant} {out_dtype} {tuple(a.shape)}x{tuple(b.shape)}"] += 1
        return (a.float() @ b.float()).to(out_dtype)
    monkeypatch.setattr(gemm, "matmul", matmul)
    return calls


def cpu_step(M, fp32_weights, bias, C=64, H=192):
    g = torch.Generator().manual_seed(M)
    x = torch.randn(M, C, generator=g).bfloat16().requires_grad_()
    dtype = torch.float32 if fp32_weights else torch.bfloat16
    w_fc = (torch.randn(H, C, generator=g) / C ** 0.5).to(dtype).requires_grad_()
    w_proj = (torch.randn(C, H, generator=g) / H ** 0.5).to(dtype).requires_grad_()
    b = [torch.randn(n, generator=g).to(dtype).requires_grad_() if bias else None for n in (H, C)]
    y = mlp_op.mlp(x, w_fc, b[0], w_proj, b[1])
    y.backward(torch.randn(y.shape, generator=g).to(y.dtype))
    return x, w_fc, b[0], w_proj, b[1]


@pytest.mark.parametrize("fp32_weights", [True, False], ids=["fp32_weights", "bf16_weights"])
@pytest.mark.parametrize("flag", ["planned", None])
def test_flag_sends_the_weight_gradients_to_matmul(fake, monkeypatch, flag, fp32_weights):
    monkeypatch.setattr(mlp_op, "_autocast_bf16", lambda: fp32_weights)   # as under autocast on a GPU
    if flag:
        monkeypatch.setenv(ENV, flag)
    else:
        monkeypatch.delenv(ENV, raising=False)
    _, w_fc, _, w_proj, _ = cpu_step(48, fp32_weights, bias=False)
    want = torch.float32 if fp32_weights else torch.bfloat16
    assert w_fc.grad.dtype == w_proj.grad.dtype == w_fc.dtype
    if flag:
        assert fake == {"backward dw_outside=True": 1,
                        f"matmul step=4 variant=9 {want} (64, 48)x(48, 192)": 1,     # dw_proj = dyᵀ·h
                        f"matmul step=4 variant=9 {want} (192, 48)x(48, 64)": 1}, dict(fake)   # dw_fc = dpreᵀ·x
    else:
        assert fake == {"backward dw_outside=False": 1}, dict(fake)


def test_flag_keeps_the_old_call_for_token_counts_not_a_multiple_of_16(fake, monkeypatch):
    monkeypatch.setattr(mlp_op, "_autocast_bf16", lambda: False)
    monkeypatch.setenv(ENV, "planned")
    cpu_step(47, False, bias=True)
    assert fake == {"backward dw_outside=False": 1}, dict(fake)


def test_flag_read_at_each_backward_and_gradients_agree(fake, monkeypatch):
    monkeypatch.setattr(mlp_op, "_autocast_bf16", lambda: False)
    grads = {}
    for flag in ("planned", "0", "planned"):
        monkeypatch.setenv(ENV, flag)
        grads.setdefault(flag, []).append([t.grad for t in cpu_step(32, False, bias=True)])
    assert fake["backward dw_outside=True"] == 2 and fake["backward dw_outside=False"] == 1, dict(fake)
    for new, old in zip(grads["planned"][0], grads["0"][0]):
        assert rel_err(new, old) < 1e-2


def test_bad_flag_value_is_refused(fake, monkeypatch):
    monkeypatch.setattr(mlp_op, "_autocast_bf16", lambda: False)
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match=ENV):
        cpu_step(32, False, bias=False)


# ---- GPU: the real kernels ---------------------------------------------------------------------

C, H = 768, 3072


def make(M, seed, fp32_weights, bias):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = torch.float32 if fp32_weights else torch.bfloat16
    x = torch.randn(M, C, device="cuda", generator=g).bfloat16().requires_grad_()
    w_fc = (torch.randn(H, C, device="cuda", generator=g) * 0.02).to(dtype).requires_grad_()
    w_proj = (torch.randn(C, H, device="cuda", generator=g) * 0.02).to(dtype).requires_grad_()
    b = [(torch.randn(n, device="cuda", generator=g) * 0.5).to(dtype).requires_grad_() if bias else None for n in (H, C)]
    dy = torch.randn(M, C, device="cuda", generator=g).bfloat16()
    return [x, w_fc, b[0], w_proj, b[1]], dy


def set_flag(monkeypatch, flag):
    if flag:
        monkeypatch.setenv(ENV, flag)
    else:
        monkeypatch.delenv(ENV, raising=False)


def run(leaves, dy, flag, monkeypatch, fp32_weights):
    """The public op's fwd+bwd under the flag (under bf16 autocast with fp32 weights, as GPT-2
    trains, or in bf16); returns copies of the leaves' gradients (None for absent biases)."""
    set_flag(monkeypatch, flag)
    for t in leaves:
        if t is not None:
            t.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fp32_weights):
        y = mlp_op.mlp(*leaves)
    y.backward(dy)
    torch.cuda.synchronize()
    return [None if t is None else t.grad.clone() for t in leaves]


def float64_grads(leaves, dy):
    ref = [None if t is None else t.detach().double().requires_grad_() for t in leaves]
    pre = ref[0] @ ref[1].T + (0 if ref[2] is None else ref[2])
    y = F.gelu(pre, approximate="tanh") @ ref[3].T + (0 if ref[4] is None else ref[4])
    y.backward(dy.double())
    return [None if t is None else t.grad for t in ref]


CASES = [(True, False), (False, False), (False, True)]    # (fp32 weights under autocast, biases)
CASE_IDS = ["fp32_weights", "bf16_weights", "bf16_weights_bias"]


@gpu
@pytest.mark.parametrize("fp32_weights,bias", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("M", [1, 333, 4099, 4112, 32752, 32768])
def test_gradients_match_float64_and_the_default_path(M, fp32_weights, bias, monkeypatch):
    leaves, dy = make(M, seed=M, fp32_weights=fp32_weights, bias=bias)
    new = run(leaves, dy, "planned", monkeypatch, fp32_weights)
    old = run(leaves, dy, None, monkeypatch, fp32_weights)
    ref = float64_grads(leaves, dy)
    for name, got, want, default in zip(("x", "w_fc", "b_fc", "w_proj", "b_proj"), new, ref, old):
        if want is None:
            continue
        assert torch.isfinite(got).all(), name
        assert rel_err(got, want) < 1e-2, (name, rel_err(got, want))
        if name == "x":                         # dx does not depend on the weight gradients
            assert torch.equal(got, default)
        elif name.startswith("w"):
            assert got.dtype == default.dtype
            # fp32 sums in another order (fp32 path); the same sums rounded to bf16 (else)
            tol = 1e-4 if fp32_weights else 4e-3      # (a lost k-piece: > 1e-2)
            assert rel_err(got, default) < tol, (name, rel_err(got, default))
        else:                                   # bias sums: torch's reductions instead of the finish kernel
            assert rel_err(got, default) < 1e-2, (name, rel_err(got, default))


def kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


@gpu
@pytest.mark.parametrize("M,flag,planned", [(4112, "planned", True), (4112, None, False), (333, "planned", False)])
def test_the_flag_changes_which_kernels_run(M, flag, planned, monkeypatch):
    leaves, dy = make(M, seed=1, fp32_weights=True, bias=False)
    run(leaves, dy, flag, monkeypatch, True)                   # warm-up (workspace, schedule)
    names = kernel_names(lambda: run(leaves, dy, flag, monkeypatch, True))
    assert ("scheduled_splitk_epilogue" in names) == planned, names
    assert ("reduce_add_epilogue" in names) == (not planned), names


@gpu
@pytest.mark.parametrize("bias", [False, True])
def test_custom_op_follows_the_flag(bias, monkeypatch):
    M = 2048 + 16
    leaves, dy = make(M, seed=5, fp32_weights=False, bias=bias)
    x, w_fc, b_fc, w_proj, b_proj = (None if t is None else t.detach() for t in leaves)
    _, pre, h = mlp_op.mlp_fwd(x, w_fc, b_fc, w_proj, b_proj)
    out = {}
    for flag in ("planned", None):
        set_flag(monkeypatch, flag)
        out[flag] = mlp_op.mlp_bwd(dy, x, pre, h, w_fc, w_proj, bias, -1)
    assert torch.equal(out["planned"][0], out[None][0])        # dx
    for i in (1, 3):                                           # dw_fc, dw_proj (bf16)
        assert out["planned"][i].dtype == torch.bfloat16
        assert rel_err(out["planned"][i], out[None][i]) < 4e-3
    for i in ((2, 4) if bias else ()):
        assert rel_err(out["planned"][i], out[None][i]) < 1e-2
    if not bias:
        assert out["planned"][2].numel() == out["planned"][4].numel() == 0


@gpu
@pytest.mark.parametrize("warm", [True, False], ids=["warmed_up", "first_call_in_capture"])
def test_cuda_graph_capture_and_replay(warm, monkeypatch):
    """The step as GPT-2 trains it, captured in a CUDA graph under the flag and replayed on new
    inputs. warmed_up: the workspace and schedule exist before the capture, and the planned products
    are captured; first_call_in_capture: a token count never seen: the capture keeps the extension's
    weight_grad (gemm.py would otherwise capture its fallback). Both must give the eager gradients."""
    M = 4096 if warm else 3072 + 48
    monkeypatch.setenv(ENV, "planned")
    leaves, dy = make(M, seed=11, fp32_weights=True, bias=False)
    x, w_fc, w_proj = leaves[0], leaves[1], leaves[3]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            y = mlp_op.mlp(x, w_fc, None, w_proj, None)
        return torch.autograd.grad(y, (x, w_fc, w_proj), dy)

    if not warm:                                   # both extensions loaded, this token count unseen
        small, small_dy = make(64, seed=12, fp32_weights=True, bias=False)
        run(small, small_dy, "planned", monkeypatch, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    if warm:
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
    planned = []
    real = mlp_op._weight_grads_by_gemm
    monkeypatch.setattr(mlp_op, "_weight_grads_by_gemm", lambda *a: planned.append(1) or real(*a))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    assert len(planned) == (1 if warm else 0)
    for seed in (21, 22):                          # new inputs, copied into the captured ones
        new, new_dy = make(M, seed=seed, fp32_weights=True, bias=False)
        with torch.no_grad():
            for dst, src in ((x, new[0]), (w_fc, new[1]), (w_proj, new[3]), (dy, new_dy)):
                dst.copy_(src)
        for t in static:
            t.fill_(float("nan"))                  # poisoned: the replay must write every value
        graph.replay()
        torch.cuda.synchronize()
        monkeypatch.delenv(ENV)
        want = step()                              # eager, the default path
        monkeypatch.setenv(ENV, "planned")
        assert torch.equal(static[0], want[0])     # dx
        for got, ref in zip(static[1:], want[1:]):
            assert got.dtype == torch.float32 and torch.isfinite(got).all()
            assert rel_err(got, ref) < 1e-4, rel_err(got, ref)


@gpu
@pytest.mark.parametrize("spec", ["side=0", "side=2", "fcfast=9", "fcfast=4"])
@pytest.mark.parametrize("bias", [False, True])
def test_other_schedules_under_the_flag(spec, bias, monkeypatch):
    """The flag with the side jobs off (the dW buffer's fill kernel, now skipped) or pipelined, and
    forwards that save gelu'(pre) or pre: the same dx and gradients as the default path's."""
    M = 1024 + 48
    leaves, dy = make(M, seed=9, fp32_weights=False, bias=bias)
    x, w_fc, b_fc, w_proj, b_proj = (None if t is None else t.detach() for t in leaves)
    mlp_op.set_schedule(spec)
    try:
        _, pre, h = mlp_op.mlp_fwd(x, w_fc, b_fc, w_proj, b_proj)
        saved = 1 if mlp_op._saves_gelu_grad(bias) else 0
        out = {}
        for flag in ("planned", None):
            set_flag(monkeypatch, flag)
            out[flag] = mlp_op.mlp_bwd(dy, x, pre, h, w_fc, w_proj, bias, saved)
        torch.cuda.synchronize()
    finally:
        mlp_op.set_schedule("0")
    assert torch.equal(out["planned"][0], out[None][0])
    for i in (1, 3) + ((2, 4) if bias else ()):
        assert torch.isfinite(out["planned"][i]).all()
        assert rel_err(out["planned"][i], out[None][i]) < (4e-3 if i in (1, 3) else 1e-2), (spec, i)

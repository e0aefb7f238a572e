"""The lean k-step (session 10, opt-in): gemm4's consumer loop with its stage addresses and wgmma
descriptors computed once and stepped by constants (config::LEAN, kernels/gemm_4_warp_specialized.cuh),
run in place of the default pipeline config<4, 64, false, 2, 1> when TK_GEMM_LEAN_KSTEP=1 (read
at every launch). The same wgmmas on the same shared data, so the outputs must be BIT-IDENTICAL
to the default's; and both must match torch.matmul in float32.

GPU tests (skip without CUDA): matmul at tails in M, N and K (K not a multiple of the 64 of a
stage, 1-3 k-steps, one row) and at GPT-2's shapes (x·Wᵀ, dx with W N-major, dW with split-K
into fp32 and the planned 5v10, which has no twin and must not change), into NaN-poisoned
outputs; the MLP's own calls of the same kernel (c_proj, dx, dW through tk_mlp's forward and
backward at a tail and at GPT-2's width); a bad TK_GEMM_LEAN_KSTEP value refused with a message.
CPU test: the flag's parsing lives in C++; kernels/gemm_4_warp_specialized.cuh is compiled with
the twin by tests/test_gemm_compile.py (GEMM_DEFAULT_VARIANT_ONLY keeps config0, which has it).
"""
import pytest
import torch
from conftest import rel_err

from kernels import gemm

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
ENV = "TK_GEMM_LEAN_KSTEP"


def run_both(monkeypatch, fn):
    """fn() under the default and under the lean k-step, each into fresh (poisoned) outputs."""
    monkeypatch.setenv(ENV, "0")
    default = fn()
    monkeypatch.setenv(ENV, "1")
    lean = fn()
    monkeypatch.delenv(ENV)
    torch.cuda.synchronize()
    return default, lean


def operands(M, K, N, kind, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
    if kind == "fwd":                                  # x [M][K] · Wᵀ, W [N][K]
        return r(M, K), r(N, K).t()
    if kind == "dx":                                   # dy [M][K] · W, W [K][N] (N-major)
        return r(M, K), r(K, N)
    dy, x = r(K, M), r(K, N)                           # dW = dyᵀ · x, K = tokens
    return dy.t(), x


# (M, K, N, kind, step, variant, out dtype): tails on 4v8 (the plain deferred product) and 4v0
# (run-time epilogue, split-K), then GPT-2's products at 32768 tokens as matmul(step=0) plans them
# (4v8; dW: 5v10, which has no twin: a control) and dW on 4v0's split-K (the MLP's kind).
# (matmul(step=0) sends small products to step 5, which has no twin: the tails name step 4.)
CASES = [
    (1, 64, 16, "fwd", 4, 8, torch.bfloat16),
    (333, 80, 208, "fwd", 4, 8, torch.bfloat16),        # K = 80: a stage and a partial one
    (4099, 720, 784, "fwd", 4, 8, torch.bfloat16),      # 12 k-steps, the last partial; M, N tails
    (1000, 3072, 768, "fwd", 4, 8, torch.float32),
    (517, 128, 3072, "dx", 4, 8, torch.bfloat16),
    (4099, 3072, 784, "dx", 4, 0, torch.bfloat16),      # 4v0 (linear_epilogue)
    (2000, 1040, 528, "fwd", 4, 0, torch.float32),
    (784, 4112, 272, "dW", 4, 0, torch.float32),        # split-K, 64.25 stages of K
    (1000, 720, 3072, "dW", 4, 8, torch.bfloat16),      # A and B N-major, one unit of K per tile
    (3072, 32768, 768, "dW", 4, 0, torch.float32),      # split-K reduce-add, as the MLP's dW
    (768, 32768, 3072, "dW", 0, 0, torch.float32),      # 5v10: no twin, must be unchanged too
    (32768, 768, 3072, "fwd", 0, 0, torch.bfloat16),    # c_fc's product (4v8)
    (32768, 3072, 768, "fwd", 0, 0, torch.bfloat16),    # c_proj's (4v8)
    (32768, 768, 3072, "dx", 0, 0, torch.bfloat16),     # dGELU's product
    (32768, 3072, 768, "dx", 0, 0, torch.bfloat16),     # c_fc's dx
]


@gpu
@pytest.mark.parametrize("M,K,N,kind,step,variant,out_dtype", CASES)
def test_lean_matches_default_bit_for_bit_and_fp32(monkeypatch, M, K, N, kind, step, variant, out_dtype):
    a, b = operands(M, K, N, kind)
    def fn():
        out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)
        return gemm.matmul(a, b, out_dtype=out_dtype, step=step, variant=variant, out=out)
    default, lean = run_both(monkeypatch, fn)
    assert torch.isfinite(lean).all(), "unwritten (NaN) outputs under the lean k-step"
    p = gemm.plan(a, b, out_dtype=out_dtype, step=step, variant=variant)
    if p.splits > 1 or p.variant in gemm.SCHEDULED.get(p.step, ()):
        # split-K and 5v10's pieces reduce-add fp32 partials in whatever order they finish: not
        # bit-stable between any two runs, so compare to the default within fp32 summation noise
        assert rel_err(lean, default.double()) < 1e-5
    else:
        assert torch.equal(default, lean), f"lean differs from the default: max |diff| {(default.float() - lean.float()).abs().max()}"
    ref = (a.float() @ b.float())
    err = rel_err(lean, ref.double())
    assert err < (1e-2 if out_dtype == torch.bfloat16 else 1e-4), err


@gpu
@pytest.mark.parametrize("M,K,N", [(1000, 4096, 528), (3072, 16384, 768), (4097, 1024, 784)])
def test_lean_planned_schedule(monkeypatch, M, K, N):
    """4v9 (step 4 on a planned schedule: whole tiles + k-pieces summed in the kernel) on the twin:
    heads + tails (few tiles), whole tiles + pieces (many); pieces arrive in any order, so fp32 noise."""
    a, b = operands(M, K, N, "dW" if K >= 4096 else "fwd", seed=2)
    def fn():
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
        return gemm.matmul(a, b, step=4, variant=9, out_dtype=torch.float32, out=out)
    default, lean = run_both(monkeypatch, fn)
    assert rel_err(lean, default.double()) < 1e-5
    assert rel_err(lean, (a.float() @ b.float()).double()) < 1e-4


@gpu
def test_lean_bias_and_gelu(monkeypatch):
    """step 4's fused epilogue (linear_epilogue: bias + GELU at run time) on the twin."""
    a, b = operands(1000, 768, 3072, "fwd", seed=3)
    bias = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    default, lean = run_both(monkeypatch, lambda: gemm.matmul(a, b, bias=bias, gelu=True, step=4))
    assert torch.equal(default, lean)
    ref = torch.nn.functional.gelu(a.float() @ b.float() + bias.float(), approximate="tanh")
    assert rel_err(lean, ref.double()) < 1e-2


@gpu
@pytest.mark.parametrize("M,C", [(4099, 768), (32768, 768)])
def test_mlp_kernels_on_the_lean_k_step(monkeypatch, M, C):
    """The MLP's c_proj forward, dx and dW run gemm4's kernel with the default pipeline (M's
    bias_epilogue and reduce_add_epilogue): under the flag they run the twin. y and dx must be
    bit-identical; dW (split-K sums reduce-added in any order) within fp32 noise, all vs float32."""
    from kernels import mlp_op
    H = 4 * C
    g = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)
    x, w_fc, w_proj, dy = r(M, C), r(H, C, scale=0.05), r(C, H, scale=0.05), r(M, C)

    def fn():
        y, pre, h = mlp_op._ext_forward(x, w_fc, None, w_proj, None)
        grads = mlp_op._ext_backward(dy, x, pre, h, w_fc, w_proj, False, -1)
        return (y, grads[0], grads[1], grads[3])
    default, lean = run_both(monkeypatch, fn)
    for name, d, l in zip(("y", "dx", "dw_fc", "dw_proj"), default, lean):
        assert torch.isfinite(l).all(), name
        if name in ("y", "dx"):
            assert torch.equal(d, l), name
        else:
            assert rel_err(l, d.double()) < 1e-2, name    # bf16 dW from fp32 sums in another order
    # and against float32 math
    pre = x.float() @ w_fc.float().t()
    h = torch.nn.functional.gelu(pre, approximate="tanh")
    assert rel_err(lean[0], (h @ w_proj.float().t()).double()) < 2e-2
    assert rel_err(lean[3], (dy.float().t() @ h).double()) < 2e-2


@gpu
def test_bad_flag_value_is_refused(monkeypatch):
    a, b = operands(256, 128, 256, "fwd")
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(RuntimeError, match="TK_GEMM_LEAN_KSTEP must be 1"):
        gemm.matmul(a, b, step=4, variant=8)
        torch.cuda.synchronize()

"""CPU tests of the tk ops' input checks (kernels/checks.py and the check_* functions of each op
module): these run in Python before any call into a C++ extension, so bad input is a Python error
naming the argument, never a C++ throw (which crashed the process on the H200). No GPU, no build:
the checks run with cuda=False (device checks off) on CPU tensors, and the entry points are
called on CPU tensors to show they refuse before touching the extension.

Each table row: (what is wrong, a call, the exception type, a regex its message must match)."""
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from kernels import attention_hopper, attention_op, gemm, layernorm, mlp_op  # noqa: E402
from kernels.checks import InputDTypeError, aligned16, realign16, require_number  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32
g = torch.Generator().manual_seed(0)


def rand(*shape, dtype=BF16):
    return torch.randn(*shape, generator=g).to(dtype)


def misaligned(*shape, dtype=BF16):
    """A contiguous view that starts 8 bytes past a 16-byte boundary (values random)."""
    n = 1
    for s in shape:
        n *= s
    pad = 8 // torch.empty(0, dtype=dtype).element_size()
    base = rand(n + pad, dtype=dtype)
    t = base[pad:].view(*shape)
    assert t.data_ptr() % 16 == 8
    return t


def strided(n, dtype=BF16):
    """A non-contiguous (n,) vector."""
    return rand(2 * n, dtype=dtype)[::2]


def expect(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- the helpers -----------------------------------------------------------------------------

def test_realign16_copies_only_misaligned_views():
    t = misaligned(4, 64)
    fixed = realign16(t)
    assert aligned16(fixed) and fixed.is_contiguous() and torch.equal(fixed, t)
    ok = rand(4, 64)
    assert realign16(ok) is ok and realign16(None) is None


def test_dtype_error_is_a_type_error_and_a_value_error():
    assert issubclass(InputDTypeError, TypeError) and issubclass(InputDTypeError, ValueError)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, 1e300, 1e-50, "0.1", True])
def test_kernel_scale_must_be_a_positive_float32(value):
    with pytest.raises((TypeError, ValueError), match="scale must be a"):
        require_number("op", "scale", value, positive=True, float32=True)


def test_numbers_that_pass():
    require_number("op", "scale", 0.125, positive=True, float32=True)
    require_number("op", "scale", 3.0e38, positive=True, float32=True)
    require_number("op", "eps", 0.0, minimum=0)
    require_number("op", "eps", 1e-5, minimum=0)


# ---- layernorm (kernels/layernorm.py <-> layernorm_bindings.cpp) -------------------------------

def ln_args(rows=16, cols=768, dtype=BF16, param_dtype=F32):
    return dict(x=rand(rows, cols, dtype=dtype), residual=rand(rows, cols, dtype=dtype),
                weight=rand(cols, dtype=param_dtype), bias=rand(cols, dtype=param_dtype), eps=1e-5)


def ln_bwd_args(rows=16, cols=768):
    return dict(dy=rand(rows, cols), dh=rand(rows, cols), h=rand(rows, cols), mean=rand(rows, dtype=F32),
                rstd=rand(rows, dtype=F32), weight=rand(cols, dtype=F32))


def ln_fwd(**changes):
    return lambda: layernorm.check_forward(**{**ln_args(), **changes}, cuda=False)


def ln_bwd(**changes):
    return lambda: layernorm.check_backward(**{**ln_bwd_args(), **changes}, cuda=False)


def test_layernorm_valid_inputs_pass():
    layernorm.check_forward(**ln_args(), cuda=False)
    layernorm.check_forward(**{**ln_args(), "residual": None, "bias": None}, cuda=False)
    layernorm.check_forward(**ln_args(rows=1, cols=64, dtype=F32, param_dtype=BF16), cuda=False)
    layernorm.check_forward(**ln_args(rows=3, cols=4096), cuda=False)
    layernorm.check_forward(**{**ln_args(), "x": rand(2, 5, 768), "residual": rand(2, 5, 768)}, cuda=False)
    layernorm.check_forward(**{**ln_args(), "weight": strided(768, F32)}, cuda=False)  # bindings copy params
    layernorm.check_backward(**ln_bwd_args(), cuda=False)
    layernorm.check_backward(**{**ln_bwd_args(), "dh": None}, cuda=False)


LN_BAD = [
    ("x not a tensor", ln_fwd(x=[1.0]), TypeError, "tk_layernorm: x must be a tensor"),
    ("x float16", ln_fwd(x=rand(16, 768, dtype=torch.half)), InputDTypeError, "x must be bfloat16 or float32, got float16"),
    ("residual dtype", ln_fwd(residual=rand(16, 768, dtype=F32)), TypeError, "residual is float32 but x is bfloat16"),
    ("residual shape", ln_fwd(residual=rand(8, 768)), ValueError, r"residual has shape \(8, 768\) but x has \(16, 768\)"),
    ("x strides", ln_fwd(x=rand(768, 16).t(), residual=None), ValueError, r"x must be contiguous.*\.contiguous\(\)"),
    ("residual strides", ln_fwd(residual=rand(768, 16).t()), ValueError, "residual must be contiguous"),
    ("width 100", ln_fwd(x=rand(4, 100), residual=None, weight=rand(100, dtype=F32), bias=None), ValueError,
     r"x's last dimension \(the hidden size\) must be a multiple of 64 between 64 and 4096, got 100"),
    ("width 4160", ln_fwd(x=rand(2, 4160), residual=None, weight=rand(4160, dtype=F32), bias=None), ValueError,
     "multiple of 64 between 64 and 4096, got 4160"),
    ("0-d x", ln_fwd(x=rand(()), residual=None), ValueError, "x must have at least one dimension"),
    ("x misaligned", ln_fwd(x=misaligned(16, 768), residual=None), ValueError, "x must start 16-byte aligned"),
    ("residual misaligned", ln_fwd(residual=misaligned(16, 768)), ValueError, "residual must start 16-byte aligned"),
    ("weight shape", ln_fwd(weight=rand(384, dtype=F32)), ValueError,
     r"weight has shape \(384,\), but x's last dimension is 768; it must have shape \(768,\)"),
    ("weight 2-D", ln_fwd(weight=rand(1, 768, dtype=F32)), ValueError, r"weight has shape \(1, 768\)"),
    ("weight missing", ln_fwd(weight=None), TypeError, "weight must be a tensor, got NoneType"),
    ("weight int", ln_fwd(weight=torch.ones(768, dtype=torch.int32)), TypeError, "weight must be bfloat16 or float32"),
    ("bias dtype", ln_fwd(bias=rand(768)), TypeError, "bias is bfloat16 but weight is float32"),
    ("bias shape", ln_fwd(bias=rand(767, dtype=F32)), ValueError, r"bias has shape \(767,\)"),
    ("eps negative", ln_fwd(eps=-1.0), ValueError, "eps must be finite and >= 0, got -1.0"),
    ("eps nan", ln_fwd(eps=float("nan")), ValueError, "eps must be finite"),
    ("eps a tensor", ln_fwd(eps=torch.tensor(1e-5)), TypeError, "eps must be a number"),
    ("h width", ln_bwd(h=rand(16, 100), dy=rand(16, 100), dh=None), ValueError, "h's last dimension"),
    ("dy shape", ln_bwd(dy=rand(4, 768)), ValueError, r"dy has shape \(4, 768\) but h has \(16, 768\)"),
    ("dy dtype", ln_bwd(dy=rand(16, 768, dtype=F32)), TypeError, "dy is float32 but h is bfloat16"),
    ("dh misaligned", ln_bwd(dh=misaligned(16, 768)), ValueError, "dh must start 16-byte aligned"),
    ("mean dtype", ln_bwd(mean=rand(16, dtype=torch.float64)), TypeError, "mean must be float32"),
    ("rstd count", ln_bwd(rstd=rand(3, dtype=F32)), ValueError, r"rstd must have one value per row of h \(16\)"),
    ("mean strides", ln_bwd(mean=strided(16, F32)), ValueError, "mean must be contiguous"),
    ("weight (bwd)", ln_bwd(weight=rand(384, dtype=F32)), ValueError, "weight has shape .* but h's last dimension is 768"),
]


@pytest.mark.parametrize("what,call,error,match", LN_BAD, ids=[row[0] for row in LN_BAD])
def test_layernorm_bad_inputs(what, call, error, match):
    expect(call, error, match)


def test_layernorm_needs_cuda_and_refuses_before_the_extension():
    a = ln_args()
    expect(lambda: layernorm.check_forward(**a), ValueError, "tk_layernorm: x must be a CUDA tensor, got one on cpu")
    expect(lambda: layernorm.layernorm_fwd(a["x"], a["weight"], a["bias"], 1e-5), ValueError, "x must be a CUDA tensor")
    expect(lambda: layernorm.add_layernorm_fwd(a["x"], a["residual"], a["weight"], None, 1e-5), ValueError,
           "x must be a CUDA tensor")
    b = ln_bwd_args()
    expect(lambda: layernorm.layernorm_bwd(b["dy"], None, b["h"], b["mean"], b["rstd"], b["weight"]), ValueError,
           "h must be a CUDA tensor")


# ---- mlp (kernels/mlp_op.py <-> mlp_bindings.cpp) --------------------------------------------

def mlp_args(M=64, C=384, H=1536):
    return dict(x=rand(M, C), w_fc=rand(H, C), b_fc=rand(H), w_proj=rand(C, H), b_proj=rand(C))


def mlp_bwd_args(M=64, C=384, H=1536):
    return dict(dy=rand(M, C), x=rand(M, C), pre=rand(M, H), h=rand(M, H), w_fc=rand(H, C), w_proj=rand(C, H))


def mlp_fwd(**changes):
    return lambda: mlp_op.check_forward(**{**mlp_args(), **changes}, cuda=False)


def mlp_bwd(**changes):
    return lambda: mlp_op.check_backward(**{**mlp_bwd_args(), **changes}, cuda=False)


def test_mlp_valid_inputs_pass():
    mlp_op.check_forward(**mlp_args(), cuda=False)
    mlp_op.check_forward(**{**mlp_args(M=1, C=64, H=64), "b_fc": None, "b_proj": None}, cuda=False)
    mlp_op.check_backward(**mlp_bwd_args(M=5), cuda=False)


MLP_BAD = [
    ("x float32", mlp_fwd(x=rand(64, 384, dtype=F32)), InputDTypeError, r"tk_mlp: x must be bfloat16, got float32 .*autocast"),
    ("w_proj transposed", mlp_fwd(w_proj=rand(1536, 384)), ValueError, r"w_proj must have shape \(384, 1536\), got \(1536, 384\)"),
    ("w_fc width", mlp_fwd(w_fc=rand(1536, 320)), ValueError, r"w_fc must have shape \(any, 384\)"),
    ("b_fc shape", mlp_fwd(b_fc=rand(384)), ValueError, r"b_fc must have shape \(1536,\), got \(384,\)"),
    ("b_proj dtype", mlp_fwd(b_proj=rand(384, dtype=F32)), TypeError, "b_proj must be bfloat16"),
    ("b_fc strides", mlp_fwd(b_fc=strided(1536)), ValueError, "b_fc must be contiguous"),
    ("x strides", mlp_fwd(x=rand(384, 64).t()), ValueError, "x must be contiguous"),
    ("w_fc strides", mlp_fwd(w_fc=rand(384, 1536).t()), ValueError, "w_fc must be contiguous"),
    ("C 96", mlp_fwd(x=rand(64, 96), w_fc=rand(384, 96), w_proj=rand(96, 384), b_fc=None, b_proj=None), ValueError,
     r"embedding size \(x's last dimension\) must be a positive multiple of 64, got 96"),
    ("H 96", mlp_fwd(w_fc=rand(96, 384), w_proj=rand(384, 96), b_fc=None), ValueError,
     r"hidden size \(w_fc's first dimension\) must be a positive multiple of 64, got 96"),
    ("x 3-D", mlp_fwd(x=rand(8, 8, 384)), ValueError, "x must be a 2-D matrix.*flatten"),
    ("no tokens", mlp_fwd(x=rand(0, 384)), ValueError, "x must have between 1 and 2\\^31-1 rows"),
    ("x misaligned", mlp_fwd(x=misaligned(64, 384)), ValueError, "x must start 16-byte aligned"),
    ("w_proj missing", mlp_fwd(w_proj=None), TypeError, "w_proj must be a tensor"),
    ("dy shape", mlp_bwd(dy=rand(5, 384)), ValueError, r"dy must have shape \(64, 384\), got \(5, 384\)"),
    ("pre dtype", mlp_bwd(pre=rand(64, 1536, dtype=F32)), TypeError, "pre must be bfloat16"),
    ("h shape", mlp_bwd(h=rand(64, 768)), ValueError, r"h must have shape \(64, 1536\)"),
    ("h misaligned", mlp_bwd(h=misaligned(64, 1536)), ValueError, "h must start 16-byte aligned"),
]


@pytest.mark.parametrize("what,call,error,match", MLP_BAD, ids=[row[0] for row in MLP_BAD])
def test_mlp_bad_inputs(what, call, error, match):
    expect(call, error, match)


def test_mlp_needs_cuda_and_refuses_before_the_extension():
    a, b = mlp_args(), mlp_bwd_args()
    expect(lambda: mlp_op.check_forward(**a), ValueError, "tk_mlp: x must be a CUDA tensor")
    expect(lambda: mlp_op.mlp_fwd(**a), ValueError, "x must be a CUDA tensor")
    expect(lambda: mlp_op.mlp_bwd(**b), ValueError, "x must be a CUDA tensor")


# ---- gemm (kernels/gemm.py <-> gemm_bindings.cpp) --------------------------------------------

def gemm_call(a=None, b=None, **kwargs):
    a = rand(64, 64) if a is None else a
    b = rand(64, 64).t() if b is None else b
    return lambda: gemm.check_inputs(a, b, cuda=False, **kwargs)


def test_gemm_valid_inputs_pass():
    gemm_call()()
    gemm_call(rand(77, 48), rand(272, 48).t(), bias=rand(272), gelu=True)()
    gemm_call(rand(64, 16).t(), rand(64, 32), out_dtype=F32, out=torch.empty(16, 32), splits=3)()
    gemm_call(step=1)()
    assert gemm.check(rand(16, 16), rand(16, 16)).endswith("a must be a CUDA tensor, got one on cpu; move it with "
                                                          ".cuda() or use the PyTorch reference (--kernels=torch)")


GEMM_BAD = [
    ("K 40", gemm_call(rand(64, 40), rand(40, 64)), ValueError, "N and K must be multiples of 16"),
    ("N 24", gemm_call(b=rand(64, 24)), ValueError, "multiples of 16"),
    ("inner", gemm_call(b=rand(48, 64)), ValueError, r"inner dimensions differ: a is \(64, 64\), b is \(48, 64\)"),
    ("a float32", gemm_call(a=rand(64, 64, dtype=F32)), InputDTypeError, "a must be bfloat16, got float32"),
    ("b float32 is also a ValueError", gemm_call(b=rand(64, 64, dtype=F32)), ValueError, "b must be bfloat16"),
    ("a 3-D", gemm_call(a=rand(2, 64, 64)), ValueError, "a must be a 2-D matrix"),
    ("b not a tensor", gemm_call(b=3), TypeError, "b must be a tensor"),
    ("M 0", gemm_call(a=rand(0, 64)), ValueError, "M must be at least 1"),
    ("step 7", gemm_call(step=7), ValueError, "step must be one of"),
    ("variant 99", gemm_call(variant=99), ValueError, "variant must be one of"),   # 9 exists on step 4 since session 8
    ("out_dtype", gemm_call(out_dtype=torch.half), ValueError, "out_dtype must be"),
    ("splits 0", gemm_call(splits=0), ValueError, "splits must be None"),
    ("bias + splits", gemm_call(bias=rand(64), splits=2), ValueError, "split-K cannot fuse bias/gelu"),
    ("gelu step 3", gemm_call(gelu=True, step=3), ValueError, "fused only in steps 4 and 5"),
    ("bias length", gemm_call(bias=rand(32)), ValueError, "bias must be a contiguous bfloat16 vector of length N=64"),
    ("bias strides", gemm_call(bias=strided(64)), ValueError, "bias must be a contiguous"),
    ("bias dtype", gemm_call(bias=rand(64, dtype=F32)), TypeError, "bias must be bfloat16"),
    ("out dtype", gemm_call(out=torch.empty(64, 64)), ValueError, "out must be a contiguous, 16-byte aligned"),
    ("out shape", gemm_call(out=torch.empty(64, 32, dtype=BF16)), ValueError, r"out must be .* shape \(64, 64\)"),
    ("out misaligned", gemm_call(out=misaligned(64, 64)), ValueError, "out must be a contiguous, 16-byte aligned"),
]


@pytest.mark.parametrize("what,call,error,match", GEMM_BAD, ids=[row[0] for row in GEMM_BAD])
def test_gemm_bad_inputs(what, call, error, match):
    expect(call, error, match)


def test_gemm_needs_cuda():
    expect(lambda: gemm.matmul(rand(64, 64), rand(64, 64)), ValueError, "kernels.gemm.matmul: a must be a CUDA tensor")


# ---- attention: portable (kernels/attention_op.py <-> attention_bindings.cpp) -----------------

def qkv(B=1, T=32, H=2, D=64):
    """q, k, v as views of one (B, T, 3, H, D) tensor, as the model makes them (strided, not contiguous)."""
    q, k, v = rand(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    return q, k, v


def attn_fwd(q=None, k=None, v=None, scale=0.125):
    q0, k0, v0 = qkv()
    q, k, v = (d if t is None else t for t, d in ((q, q0), (k, k0), (v, v0)))
    return lambda: attention_op.check_forward_inputs(q, k, v, scale, cuda=False)


def attn_bwd(**changes):
    q, k, v = qkv()
    args = dict(grad_out=rand(1, 2, 32, 64), q=q, k=k, v=v, o=rand(1, 32, 2, 64).transpose(1, 2),
                lse=rand(1, 2, 32, dtype=F32), scale=0.125)
    return lambda: attention_op.check_backward_inputs(**{**args, **changes}, cuda=False)


def test_attention_valid_inputs_pass():
    attn_fwd()()
    q, k, v = qkv(B=3, T=7, H=1, D=128)
    attention_op.check_forward_inputs(q, k, v, 0.09, cuda=False)
    attention_op.check_forward_inputs(q.contiguous(), k.contiguous(), v.contiguous(), 1.0, cuda=False)
    attn_bwd()()


ATTN_BAD = [
    ("k float16", attn_fwd(k=rand(1, 2, 32, 64, dtype=torch.half)), InputDTypeError, "tk attention: k must be bfloat16"),
    ("k float16 is a ValueError", attn_fwd(k=rand(1, 2, 32, 64, dtype=torch.half)), ValueError, "k must be bfloat16"),
    ("v shorter", attn_fwd(v=rand(1, 2, 16, 64)), ValueError, r"v has shape \(1, 2, 16, 64\) but q has \(1, 2, 32, 64\)"),
    ("q 3-D", attn_fwd(q=rand(2, 32, 64)), ValueError, r"q must have shape \(batch, heads, seq, head_dim\)"),
    ("head_dim 32", attn_fwd(*(rand(1, 2, 32, 32) for _ in range(3))), ValueError, "head_dim of q is 32; the kernel takes 64 or 128"),
    ("empty", attn_fwd(*(rand(1, 2, 0, 64) for _ in range(3))), ValueError, "q is empty"),
    ("k head_dim strided", attn_fwd(k=rand(1, 2, 64, 32).transpose(-1, -2)), ValueError, "k must be contiguous in its last"),
    ("v rows misaligned", attn_fwd(v=rand(1, 2, 32, 68)[..., :64]), ValueError, "every row of v must start on a 16-byte boundary"),
    ("q start misaligned", attn_fwd(q=misaligned(1, 2, 32, 64)), ValueError, "every row of q must start on a 16-byte"),
    ("scale nan", attn_fwd(scale=float("nan")), ValueError, "scale must be a finite positive number"),
    ("scale 0", attn_fwd(scale=0.0), ValueError, "scale must be a finite positive number"),
    ("scale too big for float32", attn_fwd(scale=1e300), ValueError, "scale must be a finite positive number"),
    ("o shape", attn_bwd(o=rand(1, 2, 31, 64)), ValueError, "o has shape"),
    ("grad_out dtype", attn_bwd(grad_out=rand(1, 2, 32, 64, dtype=F32)), TypeError, "grad_out must be bfloat16"),
    ("lse dtype", attn_bwd(lse=rand(1, 2, 32, dtype=torch.half)), TypeError, "lse must be float32"),
    ("lse shape", attn_bwd(lse=rand(1, 2, 31, dtype=F32)), ValueError, r"lse must have shape \(1, 2, 32\)"),
    ("lse strides", attn_bwd(lse=rand(1, 32, 2, dtype=F32).transpose(1, 2)), ValueError, "lse must be contiguous"),
]


@pytest.mark.parametrize("what,call,error,match", ATTN_BAD, ids=[row[0] for row in ATTN_BAD])
def test_attention_bad_inputs(what, call, error, match):
    expect(call, error, match)


def test_attention_needs_cuda_and_refuses_before_the_extension():
    q, k, v = qkv()
    expect(lambda: attention_op.check_forward_inputs(q, k, v, 0.125), ValueError, "tk attention: q must be a CUDA tensor")
    expect(lambda: attention_op._portable_forward(q, k, v, True, 0.125), ValueError, "q must be a CUDA tensor")
    lse = rand(1, 2, 32, dtype=F32)
    expect(lambda: attention_op._portable_backward(q, q, k, v, q, lse, True, 0.125), ValueError, "q must be a CUDA tensor")


# ---- attention: Hopper forward (kernels/attention_hopper.py <-> its bindings and .cu) ----------

def hopper(q=None, k=None, v=None, scale=0.125, variant=0):
    q0, k0, v0 = qkv()
    q, k, v = (d if t is None else t for t, d in ((q, q0), (k, k0), (v, v0)))
    return lambda: attention_hopper.check_inputs(q, k, v, scale, variant, cuda=False)


def test_hopper_valid_inputs_pass():
    hopper()()
    hopper(variant=4)()
    # a size-1 dimension may have any stride (TMA never steps along it)
    q = rand(1, 2, 32, 64)
    odd = q.as_strided(q.shape, (3, 2048, 64, 1))
    attention_hopper.check_inputs(odd, odd, odd, 0.125, cuda=False)


HOPPER_BAD = [
    ("k dtype", hopper(k=rand(1, 2, 32, 64, dtype=F32)), InputDTypeError, "tk Hopper attention: k must be bfloat16"),
    ("v shape", hopper(v=rand(1, 2, 16, 64)), ValueError, r"v has shape \(1, 2, 16, 64\) but q has \(1, 2, 32, 64\)"),
    ("q 5-D", hopper(q=rand(1, 1, 2, 32, 64)), ValueError, r"q must have shape \(batch, heads, seq, head_dim\)"),
    ("k head_dim strided", hopper(k=rand(1, 2, 64, 32).transpose(-1, -2)), ValueError, "k must be contiguous in its last"),
    ("head_dim 96", hopper(*(rand(1, 2, 32, 96) for _ in range(3))), ValueError, "head_dim is 96"),
    ("empty", hopper(*(rand(0, 2, 32, 64) for _ in range(3))), ValueError, "q is empty"),
    ("scale inf", hopper(scale=float("inf")), ValueError, "scale must be a finite positive number"),
    ("scale 1e-50", hopper(scale=1e-50), ValueError, "scale must be a finite positive number"),
    ("v seq stride", hopper(v=rand(1, 2, 32, 68)[..., :64]), ValueError, "v has strides .* positive multiples of 8"),
    ("q misaligned", hopper(q=misaligned(1, 2, 32, 64)), ValueError, "q has strides .* 16-byte aligned start"),
    ("variant 99", hopper(variant=99), ValueError, "variant must be one of"),
]


@pytest.mark.parametrize("what,call,error,match", HOPPER_BAD, ids=[row[0] for row in HOPPER_BAD])
def test_hopper_bad_inputs(what, call, error, match):
    expect(call, error, match)


def test_hopper_needs_cuda_and_refuses_before_the_extension():
    q, k, v = qkv()
    expect(lambda: attention_hopper.forward(q, k, v), ValueError, "tk Hopper attention: q must be a CUDA tensor")
    expect(lambda: attention_hopper.forward([q], k, v), TypeError, "tk Hopper attention: q must be a tensor")


# ---- GPU only (skipped in CI; NOT yet run on the H200): what why_not accepts, the op runs -------
# A contiguous view at an odd offset passes why_not; the bindings refuse it (16-byte alignment),
# so the custom ops copy it first (realign16). This checks that path end to end, forward and
# backward, against the reference.

def _odd_offset(*shape, requires_grad=False):
    n = 1
    for s in shape:
        n *= s
    base = torch.randn(n + 4, device="cuda").to(BF16)
    t = base[4:].view(*shape).detach().requires_grad_(requires_grad)   # 8 bytes past a boundary
    assert t.data_ptr() % 16 == 8
    return t


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_odd_offset_views_that_why_not_accepts_run():
    from kernels import reference
    x = _odd_offset(7, 768, requires_grad=True)
    w = torch.randn(768, device="cuda").to(BF16)   # bf16 like x: eager layer_norm wants one dtype
    if layernorm.why_not(x, None, w, None) is None:
        y, _ = layernorm.add_layernorm(x, None, w, None)
        y.float().square().sum().backward()
        gx, x.grad = x.grad, None
        y_ref, _ = reference.add_layernorm(x, None, w, None)
        y_ref.float().square().sum().backward()
        assert _rel(y, y_ref) < 1e-2 and _rel(gx, x.grad) < 2e-2
    x = _odd_offset(9, 384)
    w_fc, w_proj = (torch.randn(*s, device="cuda").to(BF16) * 0.05 for s in ((1536, 384), (384, 1536)))
    if mlp_op.why_not(x, w_fc, None, w_proj, None) is None:
        assert _rel(mlp_op.mlp(x, w_fc, None, w_proj, None), reference.mlp(x, w_fc, None, w_proj, None)) < 2e-2

"""The attention backward's dQ accumulator, zeroed by the forward (session 12).

The Hopper backward adds every key block's dQ partial into an fp32 accumulator that must start at
zero. The packed op (attention_qkv, the model's call) now allocates it in the forward, whose idle
producer warps zero it (kernels/attention_hopper.cu, clear_on_the_side), saves it, and hands it to
the backward, whose prep kernel then skips the zeroing unless the buffer's used-flag says a
backward already ran on it (kernels/attention_hopper_bwd.cu, prep_kernel).

CPU tests (a fake backend pair in Python): who gets a scratch buffer, that the backward receives
the very buffer the forward zeroed (eager, and under torch.compile with inductor: no copy), and
the knob. GPU tests (sm_90): the kernel zeroes a NaN-poisoned buffer at awkward shapes without
changing o or lse; gradients through the cleared buffer against float64; a dirty buffer (used-flag
set) is zeroed again, and without the flag the same junk corrupts dQ (so the check can fail);
retain_graph=True backwards twice, eager and compiled.
"""
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernels import attention_op as A  # noqa: E402
from kernels import attention_hopper as AH  # noqa: E402
from conftest import rel_err  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
gpu = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 (Hopper) GPU")


# ---- CPU: the plumbing, with a fake backend pair that records what it gets ----------------------

class FakePair:
    """forward/backward in Python (float math on CPU tensors), remembering the scratch buffers."""

    def __init__(self, floats=64):
        self.floats, self.cleared, self.received = floats, [], []

    def forward(self, q, k, v, causal, scale, clear=None):
        if clear is not None:
            clear.zero_()
            self.cleared.append(clear.data_ptr())
        o = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                             scale=scale)
        B, H, T, D = q.shape
        return o.to(q.dtype).transpose(1, 2).contiguous().transpose(1, 2), torch.zeros(B, H, T)

    def backward(self, grad_out, q, k, v, o, lse, causal, scale, out=None, dq_scratch=None):
        if dq_scratch is not None:
            assert not dq_scratch.any(), "the backward got a scratch buffer that is not zero"
            self.received.append(dq_scratch.data_ptr())
            dq_scratch.fill_(3.0)                      # as the kernels' atomics leave it: dirty
        # by hand: a custom op's body runs below autograd, where torch.autograd.grad cannot
        q, k, v, g = (t.float() for t in (q, k, v, grad_out))
        s = scale * q @ k.transpose(-1, -2)
        if causal:
            T = q.shape[2]
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(s, -1)
        dp = g @ v.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        grads = (scale * ds @ k, scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ g)
        for dst, g in zip(out, grads):
            dst.copy_(g)
        return out

    def table(self):
        return {"pair": A.Backend("pair", lambda q, c, s: None, self.forward, self.backward,
                                  dq_scratch_floats=lambda q: self.floats)}


@pytest.fixture
def pair(monkeypatch):
    fake = FakePair()
    monkeypatch.setattr(A, "BACKENDS", fake.table())
    monkeypatch.setattr(A, "_pinned", "auto")
    monkeypatch.setattr(A, "_kernel_layout", lambda t: t)
    return fake


def _qkv(B=2, T=37, H=3, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, 3, H, D, generator=g).to(torch.bfloat16).requires_grad_()


def _reference_grad(qkv, grad_y):
    x = qkv.detach().float().requires_grad_()
    q, k, v = x.permute(2, 0, 3, 1, 4)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    y.backward(grad_y.float())
    return x.grad


def test_scratch_floats_only_where_the_pair_takes_one(pair, monkeypatch):
    q = torch.zeros(1, 2, 5, 64)
    assert A._scratch_floats(q, "pair", "pair", True) == 64
    assert A._scratch_floats(q, "pair", "pair", False) == 0          # no backward will run
    assert A._scratch_floats(q, "pair", "other", True) == 0          # the backward is another backend's
    monkeypatch.setattr(A, "DQ_CLEAR_IN_FORWARD", False)
    assert A._scratch_floats(q, "pair", "pair", True) == 0


def test_knob_refuses_a_wrong_value(monkeypatch):
    monkeypatch.setenv(A.DQ_CLEAR_ENV, "sideways")
    with pytest.raises(ValueError, match="TK_ATTENTION_DQ_CLEAR='sideways'"):
        A._dq_clear_in_forward()
    monkeypatch.setenv(A.DQ_CLEAR_ENV, "backward")
    assert A._dq_clear_in_forward() is False


def test_hopper_scratch_size_follows_the_backward_variant():
    q = torch.zeros(2, 3, 17, 64)
    assert AH.dq_scratch_floats(q, 0) == 2 * 3 * 64 * 64 + 16         # 19 (prep): one 64-row chunk a head
    assert AH.dq_scratch_floats(q, 4) == 0                            # no prep kernel: it memsets anyway
    assert AH.dq_scratch_floats(torch.zeros(1, 1, 65, 128), 0) == 0   # D = 128's default 5: no prep
    assert AH.dq_scratch_floats(torch.zeros(1, 1, 65, 128), 19) == 2 * 64 * 128 + 16


def test_eager_backward_gets_the_buffer_the_forward_zeroed(pair):
    qkv = _qkv()
    grad_y = torch.randn(2, 37, 3, 64).to(torch.bfloat16)
    A.attention_qkv(qkv).backward(grad_y)
    assert len(pair.cleared) == 1 and pair.received == pair.cleared
    assert rel_err(qkv.grad, _reference_grad(qkv, grad_y)) < 1e-2
    with torch.no_grad():                                              # sampling: no scratch at all
        A.attention_qkv(qkv)
    assert len(pair.cleared) == 1


def test_compiled_backward_gets_the_buffer_the_forward_zeroed(pair):
    # Inductor must hand the saved buffer itself to the mutating backward op: a copy would move
    # 50 MB a GPT-2 layer and the backward would find it zero only by luck of the copy.
    qkv = _qkv(seed=1)
    grad_y = torch.randn(2, 37, 3, 64).to(torch.bfloat16)
    torch._dynamo.reset()
    try:
        f = torch.compile(lambda x: A.attention_qkv(x) * 2, fullgraph=True)
        f(qkv).backward(grad_y)
    finally:
        torch._dynamo.reset()
    assert len(pair.cleared) == 1 and pair.received == pair.cleared
    assert rel_err(qkv.grad, 2 * _reference_grad(qkv, grad_y)) < 1e-2


# ---- GPU: the kernels -----------------------------------------------------------------------------

def _views(B, H, T, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(B, T, 3, H, D, device="cuda", generator=g)
    qkv[:, :, :2] *= 2.5
    qkv = qkv.to(torch.bfloat16).requires_grad_()
    return qkv, qkv.detach().permute(2, 0, 3, 1, 4)


def _reference64(qkv, grad_y, causal=True):
    x = qkv.detach().double().requires_grad_()
    q, k, v = x.permute(2, 0, 3, 1, 4)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    (torch.softmax(s, -1) @ v).transpose(1, 2).backward(grad_y.double())
    return x.grad


def _assert_grad_close(got, want, T):
    dq, dk, dv = got.float().permute(2, 0, 3, 1, 4)
    dq_r, dk_r, dv_r = want.permute(2, 0, 3, 1, 4)
    assert rel_err(dv, dv_r) < 2e-2
    if T == 1:   # one key: softmax is 1, dq = dk = 0 exactly
        assert dq.abs().max() < 1e-2 and dk.abs().max() < 1e-2
    else:
        assert rel_err(dq, dq_r) < 2e-2 and rel_err(dk, dk_r) < 2e-2


SHAPES = [(1, 1, 1, 64), (2, 3, 17, 64), (1, 2, 1000, 64), (2, 1, 255, 128), (3, 2, 130, 128)]


@gpu
@pytest.mark.parametrize("variant", [0, 2, 21, 37])
@pytest.mark.parametrize("B,H,T,D", SHAPES)
def test_forward_zeroes_a_poisoned_buffer_and_keeps_its_outputs(variant, B, H, T, D):
    _, (q, k, v) = _views(B, H, T, D, seed=T + D + variant)
    floats = B * H * ((T + 63) // 64) * 64 * D + 16
    clear = torch.full((floats,), float("nan"), device="cuda")
    o0, lse0 = AH.forward(q, k, v, True, variant=variant)
    o1, lse1 = AH.forward(q, k, v, True, variant=variant, clear=clear)
    torch.cuda.synchronize()
    assert int((clear != 0).sum()) == 0, "the forward left part of the buffer unzeroed"
    assert torch.equal(o0, o1) and torch.equal(lse0, lse1)


@gpu
def test_forward_refuses_a_bad_buffer():
    _, (q, k, v) = _views(1, 1, 17, 64, seed=0)
    with pytest.raises(ValueError, match="multiple of 4"):
        AH.forward(q, k, v, True, clear=torch.zeros(6, device="cuda"))
    with pytest.raises(TypeError, match="clear"):
        AH.forward(q, k, v, True, clear=torch.zeros(8, device="cuda", dtype=torch.bfloat16))


@gpu
@pytest.mark.parametrize("B,H,T,D", SHAPES)
def test_packed_op_gradients_through_the_cleared_buffer(B, H, T, D):
    qkv, _ = _views(B, H, T, D, seed=3 * T + D)
    grad_y = torch.randn(B, T, H, D, device="cuda").to(torch.bfloat16)
    y = A.attention_qkv(qkv)
    y.backward(grad_y)
    _assert_grad_close(qkv.grad, _reference64(qkv, grad_y), T)


def _dirty_scratch_case(flag):
    """dqkv from AH.backward given a scratch full of junk whose used-flag is `flag`, and the float64 one."""
    B, H, T, D = 2, 2, 200, 64
    qkv, (q, k, v) = _views(B, H, T, D, seed=11)
    grad_y = torch.randn(B, T, H, D, device="cuda").to(torch.bfloat16)
    o, lse = AH.forward(q, k, v, True)
    floats = AH.dq_scratch_floats(q, 19)
    scratch = torch.rand(floats, device="cuda") + 1.0               # junk where the partials go
    chunks = floats - 16
    scratch[chunks:] = 0.0
    scratch[chunks + 1] = torch.tensor([flag], dtype=torch.int32).view(torch.float32)[0]
    dqkv = torch.empty_like(qkv)
    AH.backward(grad_y.transpose(1, 2), q, k, v, o, lse, True, out=dqkv.permute(2, 0, 3, 1, 4), variant=19,
                dq_scratch=scratch)
    return dqkv, _reference64(qkv, grad_y), T


@gpu
def test_a_used_buffer_is_zeroed_again():
    dqkv, want, T = _dirty_scratch_case(flag=1)
    _assert_grad_close(dqkv, want, T)


@gpu
def test_without_the_used_flag_junk_reaches_dq():
    # The same junk with the flag clear: the prep kernel trusts the buffer, and dQ is wrong. This
    # is what the flag is for, and it shows the test above could fail.
    dqkv, want, T = _dirty_scratch_case(flag=0)
    dq = dqkv.float().permute(2, 0, 3, 1, 4)[0]
    assert rel_err(dq, want.permute(2, 0, 3, 1, 4)[0]) > 0.5


@gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_retain_graph_twice(compiled):
    B, H, T, D = 2, 3, 130, 64
    qkv, _ = _views(B, H, T, D, seed=5)
    grad_y = torch.randn(B, T, H, D, device="cuda").to(torch.bfloat16)
    torch._dynamo.reset()
    try:
        f = torch.compile(A.attention_qkv, fullgraph=True) if compiled else A.attention_qkv
        y = f(qkv)
        y.backward(grad_y, retain_graph=True)
        first = qkv.grad.clone()
        y.backward(grad_y)                                          # the scratch is dirty now
    finally:
        torch._dynamo.reset()
    want = _reference64(qkv, grad_y)
    _assert_grad_close(first, want, T)
    _assert_grad_close(qkv.grad, 2 * want, T)

"""CPU test (no GPU, no extension build): under torch.compile the MLP's backward reads what the
forward saved in pre (gelu'(pre) under fcfast=5, 9, 10 and 11 (the default), pre under 4) as the graph was traced; a
schedule changed after compiling must not let the forward save one while the traced backward reads
the other (review R2, session 8). kernels/mlp_op.py: mlp() passes the trace-time answer to mlp_fwd
(saves), the backward gets the same, and mlp_fwd refuses to run when the fcfast flag disagrees.

The extension calls (_ext_forward, _ext_backward) are replaced by float stand-ins that record what
the forward saved (following the fcfast flag, as the binding does) and what the backward was told;
the custom ops, autograd and torch.compile (backend aot_eager) around them are the real ones. Last,
which fcfast values save gelu'(pre), as the Python mirror of the binding's flag says."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernels import mlp_op  # noqa: E402


def _gelu_grad(p):
    t = torch.tanh(0.7978845608 * (p + 0.044715 * p ** 3))
    return 0.5 * (1 + t) + 0.5 * p * (1 - t * t) * 0.7978845608 * (1 + 3 * 0.044715 * p * p)


@pytest.fixture
def stand_ins(monkeypatch):
    log = []

    def forward(x, w_fc, b_fc, w_proj, b_proj):
        pre = F.linear(x.float(), w_fc.float(), None if b_fc is None else b_fc.float())
        saves = mlp_op._saves_gelu_grad(b_fc is not None or b_proj is not None)   # what the binding does
        h = F.gelu(pre, approximate="tanh")
        y = F.linear(h, w_proj.float(), None if b_proj is None else b_proj.float())
        log.append(("fwd", int(saves)))
        stored = _gelu_grad(pre) if saves else pre
        return y.to(x.dtype), stored.to(x.dtype), h.to(x.dtype)

    def backward(dy, x, pre, h, w_fc, w_proj, bias_grads=True, saved=-1, dw_float=False):
        assert not dw_float                   # (bf16 weights here: the fp32-weight path is not taken)
        log.append(("bwd", int(saved)))
        gp = pre.float() if saved == 1 else _gelu_grad(pre.float())   # read pre as the flag says
        dh = dy.float() @ w_proj.float()
        dpre = dh * gp
        n_fc, n_proj = (w_fc.shape[0], w_proj.shape[0]) if bias_grads else (0, 0)
        return ((dpre @ w_fc.float()).to(x.dtype), (dpre.t() @ x.float()).to(x.dtype), x.new_zeros(n_fc),
                (dy.float().t() @ h.float()).to(x.dtype), x.new_zeros(n_proj))

    monkeypatch.setattr(mlp_op, "_ext_forward", forward)
    monkeypatch.setattr(mlp_op, "_ext_backward", backward)                 # (mlp_bwd looks it up per call)
    monkeypatch.setattr(mlp_op._MLPEager, "backward", staticmethod(mlp_op._make_backward(backward)))   # (bound at import)
    monkeypatch.setattr(mlp_op, "_env_checked", True)          # no TK_MLP_SCHEDULE, no extension
    return log


def _inputs(bias):
    g = torch.Generator().manual_seed(5)
    t = lambda *s: (torch.randn(*s, generator=g) * 0.5).to(torch.bfloat16).requires_grad_()
    return t(16, 64), t(256, 64), (t(256) if bias else None), t(64, 256), (t(64) if bias else None)


def _step(fn, args):
    for a in args:
        if a is not None:
            a.grad = None
    fn(*args).float().square().mean().backward()
    return args[0].grad.clone()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("first,second", [(5, 4), (4, 5), (9, 4), (4, 9), (10, 4), (4, 10), (11, 4), (4, 11)])
def test_compiled_mlp_refuses_a_stale_saved_flag(stand_ins, monkeypatch, bias, first, second):
    torch._dynamo.reset()
    args = _inputs(bias)
    monkeypatch.setattr(mlp_op, "_fcfast", first)
    eager_dx = _step(mlp_op.mlp, args)                          # the eager path (_MLPEager)
    assert stand_ins == [("fwd", int(first != 4)), ("bwd", int(first != 4))]
    compiled = torch.compile(mlp_op.mlp, backend="aot_eager", fullgraph=True)
    stand_ins.clear()
    dx = _step(compiled, args)
    assert stand_ins == [("fwd", int(first != 4)), ("bwd", int(first != 4))], stand_ins
    assert torch.allclose(dx.float(), eager_dx.float(), rtol=2e-2, atol=1e-3)

    monkeypatch.setattr(mlp_op, "_fcfast", second)             # what set_schedule does to the mirror
    stand_ins.clear()
    with pytest.raises(RuntimeError, match=r"traced \(torch.compile\).*torch._dynamo.reset"):
        _step(compiled, args)
    assert not stand_ins, "the forward ran under a flag the traced backward would misread"

    torch._dynamo.reset()                                      # traced again: consistent with the new flag
    stand_ins.clear()
    _step(torch.compile(mlp_op.mlp, backend="aot_eager", fullgraph=True), args)
    assert stand_ins == [("fwd", int(second != 4)), ("bwd", int(second != 4))], stand_ins


def test_saves_argument_is_checked(stand_ins, monkeypatch):
    monkeypatch.setattr(mlp_op, "_fcfast", 5)
    x, w_fc, _, w_proj, _ = (None if t is None else t.detach() for t in _inputs(False))
    with pytest.raises(ValueError, match="saves must be -1"):
        mlp_op.mlp_fwd(x, w_fc, None, w_proj, None, 2)
    mlp_op.mlp_fwd(x, w_fc, None, w_proj, None, 1)               # agrees with fcfast=5
    mlp_op.mlp_fwd(x, w_fc, None, w_proj, None, -1)              # nothing promised
    with pytest.raises(RuntimeError, match="fcfast=5"):
        mlp_op.mlp_fwd(x, w_fc, None, w_proj, None, 0)


def test_which_fcfast_values_save_gelu_grad(monkeypatch):
    """The Python mirror of the binding's saves_gelu_grad, for every fcfast value parse_schedule
    accepts: gelu'(pre) under 5, 9, 10 and 11 and under 6 without biases; pre otherwise. fcfast=7 and 8
    (session 9's quarter boxes and whole boxes by turns: lost on the H200, removed) are refused by name."""
    monkeypatch.setattr(mlp_op, "_env_checked", True)
    want = {0: (0, 0), 1: (0, 0), 2: (0, 0), 3: (0, 0), 4: (0, 0), 5: (1, 1), 6: (1, 0), 9: (1, 1), 10: (1, 1), 11: (1, 1)}
    for value in range(13):
        spec = f"fcfast={value}"
        if value not in want:
            with pytest.raises(ValueError, match=f"fcfast={value} .*lost" if value in (7, 8) else "fcfast must be"):
                mlp_op.parse_schedule(spec)
            continue
        assert mlp_op.parse_schedule(spec)[5 + mlp_op.FLAGS.index("fcfast")] == value
        monkeypatch.setattr(mlp_op, "_fcfast", value)
        got = (int(mlp_op._saves_gelu_grad(False)), int(mlp_op._saves_gelu_grad(True)))
        assert got == want[value], (value, got)


def test_default_is_fcfast11_and_old_specs_keep_their_meaning(monkeypatch):
    """Session 10: the default fcfast is 11 (fcfast=5's values on the lean k-step, dGELU's product
    packed), so the default saves gelu'(pre) with and without biases; 'fcfast=5' still selects
    session 8's form, 'fcfast=9' and 'fcfast=10' the steps between; specs that name a dGELU
    epilogue, or a schedule fcfast>=5 cannot run on, step the default back to 4, as they did under 5."""
    monkeypatch.setattr(mlp_op, "_env_checked", True)
    at = 5 + mlp_op.FLAGS.index("fcfast")
    assert mlp_op.FLAG_DEFAULTS[mlp_op.FLAGS.index("fcfast")] == 11
    assert mlp_op.parse_schedule("0")[at] == 11 and mlp_op.parse_schedule("")[at] == 11
    assert mlp_op.parse_schedule("fcfast=9")[at] == 9
    assert mlp_op.parse_schedule("fcfast=5")[at] == 5 and mlp_op.parse_schedule("fcfast=10")[at] == 10
    assert mlp_op.parse_schedule("fcfast=11")[at] == 11
    for spec in ("fast=0", "fast=3", "fc=6", "dgelu=5", "pre=1", "5"):
        assert mlp_op.parse_schedule(spec)[at] == 4, spec
    monkeypatch.setattr(mlp_op, "_fcfast", mlp_op.FLAG_DEFAULTS[mlp_op.FLAGS.index("fcfast")])
    assert mlp_op._saves_gelu_grad(True) and mlp_op._saves_gelu_grad(False)
    with pytest.raises(ValueError, match="fcfast=8 .*lost"):
        mlp_op.parse_schedule("fcfast=8")
    with pytest.raises(ValueError, match="fcfast=5, 6, 9, 10 and 11"):
        mlp_op.parse_schedule("fcfast=11,fc=6")

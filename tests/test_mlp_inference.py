"""CPU tests of the MLP's evaluation forward (kernels/mlp_inference.cu, forward_inference in
kernels/mlp_bindings.cpp, the dispatch in kernels/mlp_op.py's mlp()): the .cu compiles for
sm_90a (its seven schedules, no spills), and mlp() picks forward_inference exactly when no
gradient can be asked for, unless TK_MLP_INFERENCE=0, and never under torch.compile. The
extension is replaced by a fake (as tests/test_fast_path.py does). The GPU checks (bit-identical
y, float64 reference, no pre allocated) are in tests/test_mlp.py."""
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernels import mlp_op  # noqa: E402
from conftest import use_cpu_checks  # noqa: E402

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_mlp_inference_cu_compiles_for_sm90a(tmp_path):
    # step 4, ping-pong 128x128, 64x256 and 128x128 in clusters, each with the h-only epilogue, its
    # session 6 fast twin (fcfast=1, 2) and fcfast=3's rounded twin: 7 + 7 + 7
    cmd = [NVCC, "-std=c++20", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-I", str(ROOT),
           "-I", str(ROOT / "kernels"), "-Xptxas", "-v", "-c", str(ROOT / "kernels" / "mlp_inference.cu"),
           "-o", str(tmp_path / "mlp_inference.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "C7508" not in r.stderr and "C7515" not in r.stderr, r.stderr[-3000:]
    built = re.findall(r"Compiling entry function '(\w+)'", r.stderr)
    assert len(built) == 21 and all("bias_gelu_h_only" in k for k in built), built
    assert sum("bias_gelu_h_only_fast" in k for k in built) == 7 and sum("rounded" in k for k in built) == 7, built
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", r.stderr)]
    assert spills and max(spills) == 0, r.stderr[-3000:]


class FakeMLPExt:
    """mlp_bindings.cpp's forward -> [y, pre, h] and forward_inference -> y, counting calls."""

    def __init__(self, calls):
        self.calls = calls

    def _y(self, x, w_fc, b_fc, w_proj, b_proj):
        pre = x.float() @ w_fc.float().T + (0 if b_fc is None else b_fc.float())
        h = F.gelu(pre, approximate="tanh").bfloat16()
        y = h.float() @ w_proj.float().T + (0 if b_proj is None else b_proj.float())
        return y.bfloat16(), pre.bfloat16(), h

    def forward(self, *args):
        self.calls["forward"] += 1
        return list(self._y(*args))

    def forward_inference(self, *args):
        self.calls["forward_inference"] += 1
        return self._y(*args)[0]


@pytest.fixture
def calls(monkeypatch):
    calls = collections.Counter()
    monkeypatch.setattr(mlp_op._ext, "_module", FakeMLPExt(calls))
    use_cpu_checks(monkeypatch, mlp_op, "check_forward")
    monkeypatch.delenv(mlp_op.INFERENCE_ENV, raising=False)
    return calls


def inputs(grad=()):
    """bf16 (2, 5, 64) x and an MLP of hidden 128; names in `grad` require grad."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).bfloat16()
    t = dict(x=r(2, 5, 64), w_fc=r(128, 64) / 8, b_fc=r(128), w_proj=r(64, 128) / 11, b_proj=r(64))
    return [v.requires_grad_() if k in grad else v for k, v in t.items()]


@pytest.mark.parametrize("grad", [(), ("x",), ("b_proj",), ("x", "w_fc", "b_fc", "w_proj", "b_proj")])
def test_no_grad_takes_the_inference_forward(calls, grad):
    args = inputs(grad)
    with torch.no_grad():
        y = mlp_op.mlp(*args)
    assert calls == {"forward_inference": 1}, calls
    assert y.shape == (2, 5, 64) and not y.requires_grad


def test_nothing_requiring_grad_takes_the_inference_forward(calls):
    y = mlp_op.mlp(*inputs())
    assert calls == {"forward_inference": 1}, calls
    assert not y.requires_grad


@pytest.mark.parametrize("grad", [("x",), ("b_proj",), ("w_fc",)])
def test_any_input_requiring_grad_takes_the_training_forward(calls, grad):
    y = mlp_op.mlp(*inputs(grad))
    assert calls == {"forward": 1}, calls
    assert y.requires_grad and type(y.grad_fn.next_functions[0][0]).__name__ == "_MLPEagerBackward"


@pytest.mark.parametrize("value,expect", [("0", "forward"), (" 0 ", "forward"), ("1", "forward_inference"),
                                          ("", "forward_inference")])
def test_env_switch(calls, monkeypatch, value, expect):
    monkeypatch.setenv(mlp_op.INFERENCE_ENV, value)
    with torch.no_grad():
        mlp_op.mlp(*inputs())
    assert calls == {expect: 1}, calls


def test_compiling_keeps_the_custom_op(calls, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        mlp_op.mlp(*inputs())
    assert calls == {"forward": 1}, calls


def test_both_forwards_give_the_same_y(calls, monkeypatch):
    args = inputs()
    y_inf = mlp_op.mlp(*args)
    monkeypatch.setenv(mlp_op.INFERENCE_ENV, "0")
    y_train = mlp_op.mlp(*args)
    assert calls == {"forward_inference": 1, "forward": 1}, calls
    assert torch.equal(y_inf, y_train)

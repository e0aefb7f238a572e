"""CPU checks (CI) of the Hopper attention forward's Python side: it registers itself as the first
attention backend, declines politely where it cannot run, and the ctypes mirror of the launcher's
argument struct (tests/attention_hopper_ctypes.py) has the C++ layout of kernels/attention_params.h."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def test_registers_first_and_declines_without_hopper():
    from kernels import attention_hopper, attention_op as A
    assert list(A.BACKENDS)[0] == "hopper"
    assert A.BACKENDS["hopper"].backward is attention_hopper.backend_backward   # its own (D 64, 128)
    q = torch.empty(1, 1, 4, 64)
    if not torch.cuda.is_available():
        assert "no CUDA" in attention_hopper.backend_why_not(q, True, 0.125)
    elif torch.cuda.get_device_capability() != (9, 0):
        assert "sm_90" in attention_hopper.backend_why_not(q.cuda(), True, 0.125)


def test_why_not_reasons():
    from kernels import attention_hopper
    q = torch.empty(1, 1, 4, 64)
    assert "dropout" in attention_hopper.why_not(q, q, q, dropout_p=0.1)
    assert "CUDA" in attention_hopper.why_not(q, q, q)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_ctypes_struct_matches_the_header(tmp_path):
    src = tmp_path / "layout.cpp"
    src.write_text('#include <cstdio>\n#include <cstddef>\n#include "attention_params.h"\n'
                   'int main() { printf("%zu %zu %zu %zu %zu %zu %zu %zu\\n", sizeof(AttentionForwardParams),'
                   ' offsetof(AttentionForwardParams, q), offsetof(AttentionForwardParams, k),'
                   ' offsetof(AttentionForwardParams, v), offsetof(AttentionForwardParams, o),'
                   ' offsetof(AttentionForwardParams, lse), offsetof(AttentionShape, causal),'
                   ' offsetof(AttentionShape, scale)); }\n')
    exe = tmp_path / "layout"
    subprocess.run(["g++", "-I", os.path.join(REPO, "kernels"), str(src), "-o", str(exe)], check=True)
    c_layout = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    spec = importlib.util.spec_from_file_location("attention_hopper_ctypes",
                                                  os.path.join(REPO, "tests", "attention_hopper_ctypes.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    import ctypes
    P, S = m.AttentionForwardParams, m.AttentionShape
    py_layout = [ctypes.sizeof(P), P.q.offset, P.k.offset, P.v.offset, P.o.offset, P.lse.offset,
                 S.causal.offset, S.scale.offset]
    assert py_layout == c_layout

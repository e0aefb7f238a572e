"""CPU tests of the tk MLP: kernels/mlp.cu compiles for sm_90a with nvcc (no register spills, no
ignored setmaxnreg, no serialized wgmma), and the dispatch rules of kernels/mlp_op.py: what
`why_not` and `preflight` say, 'auto' falling back to the reference, 'tk' refusing clearly.
The compile test skips only when nvcc is absent; nothing here needs a GPU."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from kernels import mlp_op, reference  # noqa: E402

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("source,kernels_expected", [("mlp.cu", 26), ("mlp_pingpong.cu", 28),
                                                        ("mlp_pingpong_gelu_grad.cu", 8), ("mlp_pingpong_gelu_fast.cu", 10),
                                                        ("mlp_finish.cu", 1), ("mlp_dgelu_deferred.cu", 4), ("mlp_fc_deferred.cu", 3)])
def test_mlp_cu_compiles_for_sm90a(tmp_path, source, kernels_expected):
    # mlp.cu: the five epilogues plus dGELU with pre by TMA, and session 5's fast dGELU on both pre
    # paths, on step 4 and on step 4 in 2-CTA clusters; mlp_pingpong.cu: the five on step 5's five
    # configurations plus dGELU with pre by TMA on the three 4-buffer ones;
    # mlp_pingpong_gelu_grad.cu: the fast dGELU on the five, its pre-by-TMA form on the three;
    # mlp_pingpong_gelu_fast.cu: session 6's two fast c_fc epilogues (fcfast=1, 2) on the five (mlp.cu
    # has them on step 4 and step 4 in clusters, and session 6's deferred c_proj/dx and c_fc there:
    # 16 + 4 + 4 + 2);
    # mlp_finish.cu: the tail kernel; mlp_dgelu_deferred.cu: session 7's deferred dGELU (fast=3,
    # fcfast=5's gelu' form) and the gelu' form on the lean k-step (fcfast=10, session 10), also with the
    # packed product (fcfast=11);
    # mlp_fc_deferred.cu: session 7's c_fc in half boxes (fcfast=4, and fcfast=5 saving gelu'(pre)) and
    # fcfast=5's on the lean k-step (fcfast=9, 10 and 11, the default since session 10).
    cmd = [NVCC, "-std=c++20", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-I", str(ROOT),
           "-I", str(ROOT / "kernels"), "-Xptxas", "-v", "-c", str(ROOT / "kernels" / source),
           "-o", str(tmp_path / "mlp.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "C7508" not in r.stderr, "setmaxnreg ignored (no register cap at entry)"
    assert "C7515" not in r.stderr, "wgmma serialized"
    # session 7's kernels keep a wgmma group in flight across the held tile's parts: ptxas must not
    # have had to insert a wait for the accumulators anywhere (C7517)
    assert "C7517" not in r.stderr or "deferred" not in source, "warpgroup.wait injected by ptxas"
    kernels_built = re.findall(r"Compiling entry function '(\w+)'", r.stderr)
    assert len(kernels_built) == kernels_expected, f"expected {kernels_expected} instantiations, got {kernels_built}"
    spills = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores", r.stderr, re.S)
    assert len(spills) == kernels_expected, r.stderr[-3000:]
    # Known exceptions: the per-thread-load dGELU epilogue (pre=0, "14dgelu_epilogue" mangled) spills
    # 8 bytes on the 64x256 ping-pong tile and 16 on step 4 in clusters (the producer's side jobs and
    # the cluster bookkeeping tip it); every other kernel, the pre-by-TMA dGELU included, none.
    bad = [(k, int(n)) for k, n in spills if int(n) and not ("14dgelu_epilogue" in k and int(n) <= 16)]
    assert not bad, f"register spills: {bad}"
    # Session 5: the fast dGELU forms keep their float[16] of column sums in registers (the loop
    # form of the reduce-scatter in dgelu_pre_tma_epilogue put it on a 64-byte stack frame).
    frames = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame", r.stderr, re.S)
    fast_frames = [(k, int(n)) for k, n in frames
                   if "_fast_epilogue" in k and int(n)]
    assert not fast_frames, f"session 5 kernels with a stack frame: {fast_frames}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_session6_policies_stage_their_own_boxes(tmp_path):
    # fcfast=2's policy (bias_gelu_stmatrix) stages through gemm4's STORES_SLAB hook; were the hook
    # gone, the kernel would fall back to the per-value path silently (the policy still has box()
    # and value()) and time fcfast=1 under fcfast=2's name. So: its PTX has stmatrix, fcfast=1's none.
    out = tmp_path / "gelu_fast.ptx"
    cmd = [NVCC, "-std=c++20", "-O3", "-gencode=arch=compute_90a,code=compute_90a", "-I", str(ROOT),
           "-I", str(ROOT / "kernels"), "-ptx", str(ROOT / "kernels" / "mlp_pingpong_gelu_fast.cu"), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    # each kernel's PTX: from its .entry line to the next one
    entries = [(m.group(1), m.group(2)) for m in re.finditer(r"\.entry (\w+)(.*?)(?=\.entry |\Z)", out.read_text(), re.S)]
    stm = [body for name, body in entries if "stmatrix_epilogue" in name]
    fast = [body for name, body in entries if "bias_gelu_fast_epilogue" in name]
    assert len(stm) == 5 and len(fast) == 5, [name for name, _ in entries]
    assert all("stmatrix.sync.aligned" in body for body in stm), "fcfast=2 kernels without stmatrix: is the STORES_SLAB hook there?"
    assert not any("stmatrix.sync" in body for body in fast)
    # ... and the deferred policies (step 4's DEFERS_STORE hook, G's, session 6: defer=1's c_proj/dx,
    # fcfast=3's c_fc) likewise: stmatrix in their six kernels, whenever step 4's kernel has the hook
    # (without it they fall back to the per-value path)
    if "DEFERS_STORE" not in (ROOT / "kernels" / "gemm_4_warp_specialized.cuh").read_text():
        pytest.skip("gemm_4_warp_specialized.cuh has no DEFERS_STORE hook: the deferred policies run the per-value path")
    out = tmp_path / "mlp.ptx"
    r = subprocess.run(cmd[:-4] + ["-ptx", str(ROOT / "kernels" / "mlp.cu"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    entries = [(m.group(1), m.group(2)) for m in re.finditer(r"\.entry (\w+)(.*?)(?=\.entry |\Z)", out.read_text(), re.S)]
    deferred = [body for name, body in entries if any(k in name for k in ("bias_deferred", "gelu_deferred"))]
    assert len(deferred) == 6 and all("stmatrix.sync.aligned" in body for body in deferred), \
        "defer=1 / fcfast=3 kernels without stmatrix: is the DEFERS_STORE hook there?"


def cpu_inputs(M=10, C=64, bias=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)
    return r(M, C), r(4 * C, C), r(4 * C) if bias else None, r(C, 4 * C), r(C) if bias else None


def test_registered_with_the_switch():
    # In a fresh process: `import kernels` alone (as model.py does) must register the tk MLP.
    code = ("import kernels; assert 'mlp' in kernels._tk_impls and 'mlp' in kernels._preflight_checks; "
            "assert callable(kernels.mlp), 'kernels.mlp must stay the function model.py calls'; "
            "assert 'mlp_op' not in kernels._import_errors, kernels._import_errors")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert kernels._tk_impls["mlp"][1] is mlp_op.why_not


def test_why_not_on_cpu():
    assert "CUDA" in mlp_op.why_not(*cpu_inputs())


def test_auto_falls_back_to_reference_on_cpu(capsys):
    kernels.configure("auto")
    kernels.reset_used()
    args = cpu_inputs(bias=False)
    y = kernels.mlp(*args)
    assert torch.equal(y, reference.mlp(*args))
    assert kernels.used()["mlp"] == "torch"


def test_tk_refuses_on_cpu_with_the_way_out():
    kernels.configure("torch", mlp="tk")
    try:
        with pytest.raises(kernels.KernelUnavailable, match="kernels_mlp=torch"):
            kernels.mlp(*cpu_inputs())
    finally:
        kernels.configure("auto")


@pytest.mark.parametrize("kwargs,expect", [
    (dict(n_embd=768, dtype=torch.bfloat16, device="cpu"), "CUDA"),
    (dict(n_embd=768, dtype=torch.float32, device="cuda"), "bfloat16"),
    (dict(n_embd=100, dtype=torch.bfloat16, device="cuda"), "multiple of 64"),
])
def test_preflight_reasons(kwargs, expect):
    reason = mlp_op.preflight(batch_size=8, block_size=64, n_head=4, attn_dropout=0.0, bias=True, **kwargs)
    assert reason is not None and expect in reason


def test_preflight_through_the_switch_names_mlp():
    kernels.configure("torch", mlp="tk")
    try:
        with pytest.raises(kernels.KernelUnavailable, match="kernels_mlp=tk"):
            kernels.preflight(8, 64, 768, 12, torch.bfloat16, "cpu")
    finally:
        kernels.configure("auto")

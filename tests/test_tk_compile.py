"""CI compile test for tk/: nvcc builds tests/tk/compile_all.cu, which instantiates every tk type
and op (several sizes, dtypes, both layouts; the Hopper headers through tk/tk.cuh), for sm_90a
and for sm_80. No GPU needed; skipped only where nvcc is absent. The two targets compile in
parallel. PyTorch's extension flags (no implicit bf16/half conversions) are on, as in a real
kernel build."""
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
TORCH_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
TARGETS = {"sm_90a": "-gencode=arch=compute_90a,code=sm_90a", "sm_80": "-gencode=arch=compute_80,code=sm_80"}


def _compile(source, gencode, out_dir):
    out = os.path.join(out_dir, os.path.basename(source) + gencode.split("=")[-1] + ".o")
    cmd = [NVCC, "-std=c++20", "-O1", f"-I{ROOT}", gencode, *TORCH_FLAGS, "-c", source, "-o", out]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_tk_compiles_for_sm90a_and_sm80():
    source = os.path.join(ROOT, "tests", "tk", "compile_all.cu")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(TARGETS)) as pool:
        results = dict(zip(TARGETS, pool.map(lambda g: _compile(source, g, tmp), TARGETS.values())))
    failed = {arch: r for arch, r in results.items() if r.returncode != 0}
    assert not failed, "\n\n".join(f"--- nvcc for {arch} failed ---\n{r.stderr[-6000:]}" for arch, r in failed.items())

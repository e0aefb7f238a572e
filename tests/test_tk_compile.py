"""CI compile test for tk/: nvcc builds, for sm_90a and for sm_80, two files that instantiate
every tk type and op: tests/tk/compile_all.cu (the warp-scope core: several sizes, dtypes, both
layouts) and tests/tk/compile_group.cu (the warpgroup half: gl with its TMA descriptors,
mbarriers, fences, named barriers, setmaxnreg, TMA tile and 4-D box copies, wgmma for every N and
operand form). No GPU needed; skipped only where nvcc is absent. The four compiles run in
parallel. PyTorch's extension flags (no implicit bf16/half conversions) are on, as in a real
kernel build. ptxas's "Potential Performance Loss" notes (setmaxnreg ignored, wgmma serialized)
and any warning fail the test too: they mean a pipeline primitive silently stopped working."""
import os
import re
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
SOURCES = [os.path.join(ROOT, "tests", "tk", name) for name in ("compile_all.cu", "compile_group.cu")]
SILENT_FAILURE = re.compile(r"warning|Potential Performance Loss", re.IGNORECASE)


def _compile(source, gencode, out_dir):
    out = os.path.join(out_dir, os.path.basename(source) + gencode.split("=")[-1] + ".o")
    cmd = [NVCC, "-std=c++20", "-O1", f"-I{ROOT}", gencode, *TORCH_FLAGS, "-c", source, "-o", out]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_tk_compiles_for_sm90a_and_sm80():
    jobs = [(source, arch) for source in SOURCES for arch in TARGETS]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: _compile(job[0], TARGETS[job[1]], tmp), jobs))
    problems = []
    for (source, arch), r in zip(jobs, results):
        output = r.stdout + r.stderr
        notes = [line for line in output.splitlines() if SILENT_FAILURE.search(line)]
        if r.returncode != 0 or notes:
            what = "failed" if r.returncode != 0 else "compiled with warnings"
            problems.append(f"--- nvcc {os.path.basename(source)} for {arch} {what} ---\n"
                            + (output[-6000:] if r.returncode != 0 else "\n".join(notes)))
    assert not problems, "\n\n".join(problems)

"""CPU check (CI): kernels/attention_hopper.cu compiles for sm_90a with no register spills, and
ptxas honours setmaxnreg (no C7508) and does not serialise the wgmmas (no C7515).
Skips only where nvcc is missing. Nothing built here runs."""
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_attention_hopper_compiles_for_sm90a(tmp_path):
    cmd = [NVCC, "-gencode=arch=compute_90a,code=sm_90a", "-std=c++20", "-O3", "-Xptxas", "-v",
           "-I", REPO, "-I", os.path.join(REPO, "kernels"), "-c",
           os.path.join(REPO, "kernels", "attention_hopper.cu"), "-o", str(tmp_path / "attention_hopper.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    kernels = re.findall(r"Compiling entry function '(\w*forward_kernel\w*)'", log)
    assert len(kernels) == 3, f"expected 3 forward kernels (variants 2, 4, 5: two consumers at D=64 and 128, one at D=64), got {kernels}"
    persistent = re.findall(r"Compiling entry function '(\w*persistent_kernel\w*)'", log)
    assert len(persistent) == 16, f"expected 16 persistent kernels (variants 8, 11-13, 21, 26, 30, 33, 37), got {persistent}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(a == "0" and b == "0" for a, b in spills), f"register spills: {spills}"
    assert "C7508" not in log, "ptxas ignored setmaxnreg (C7508)"
    for code in ("C7510", "C7511", "C7515", "C7520"):   # the ways ptxas says it serialised the wgmmas
        assert code not in log, f"ptxas serialised the wgmmas ({code}):\n" + log[-2000:]


def test_variant_numbers_agree():
    """The forward variants that the launcher's switch takes, the bindings accept and
    kernels/attention_hopper.py names are the same numbers (removed ones are refused by all three)."""
    from kernels.attention_hopper import VARIANTS
    cu = open(os.path.join(REPO, "kernels", "attention_hopper.cu")).read()
    body = cu[cu.index("int attention_hopper_forward_variant("):]
    body = body[:body.index("default:")]
    cases = [int(n) for n in re.findall(r"\bcase (\d+):", body)]
    bindings = open(os.path.join(REPO, "kernels", "attention_hopper_bindings.cpp")).read()
    accepted = [int(n) for n in re.search(r"constexpr int VARIANTS\[\] = \{([^}]*)\}", bindings).group(1).split(",")]
    assert sorted(VARIANTS) == accepted == [0] + cases, (sorted(VARIANTS), accepted, cases)

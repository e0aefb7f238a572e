"""CPU checks of the portable attention kernel (no GPU needed):
1. nvcc compiles kernels/attention_portable.cu for sm_80 and sm_90a (skips without nvcc), and
   the default forward kernels do not spill registers;
2. its forward and backward, run on the CPU emulation of the warp instructions in
   tests/attention_emu/ (one std::thread per CUDA thread, fragment layouts as in the PTX ISA),
   match a float64 reference (skips without a C++20 g++). This checks every index, mask and
   fragment layout of the kernel; it cannot check timing, races or cp.async waits."""
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "kernels", "attention_portable.cu")
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"])
def test_nvcc_compiles(tmp_path, arch):
    cmd = [NVCC, "-std=c++20", "-O3", arch, "-I", REPO, "-Xptxas", "-v", "-c", SOURCE, "-o", str(tmp_path / "a.o")]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]
    # ptxas -v: "Function properties for <name>", then "<n> bytes stack frame, <n> bytes spill stores".
    spills = dict(re.findall(r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores",
                             out.stderr))
    forward = {name: n for name, n in spills.items() if "forward_kernel" in name}
    assert len(forward) == 14, out.stderr[-2000:]   # D 64/128 x causal/full x 3 block shapes, + 2 for D 64
    default = {name: n for name, n in forward.items() if "Li4ELi1ELi64E" in name}   # 4 warps, 1 row tile, BLOCK_N 64
    assert len(default) == 4 and all(n == "0" for n in default.values()), default
    # Session 7's backward kernels (variants 2, 3: K/V in registers at D = 64; the wide kernels 1
    # and 3 at both D) spill nothing.
    new = {name: n for name, n in spills.items() if re.search(r"backward_kernel.*ELb1EEEv|prep_kernel|dq_wide_kernel", name)}
    assert len(new) == 6 and all(n == "0" for n in new.values()), new
    # Session 7 (P2): forward variants 9, 10 (attention_forward_split_kernel: 64/128-key stages x
    # causal/full, D = 64) spill nothing; they sit at 249-255 registers, so a change can tip them.
    split = {name: n for name, n in spills.items() if "forward_split_kernel" in name}
    assert len(split) == 4 and all(n == "0" for n in split.values()), split


def _emulation_source(tmp_path):
    """The .cu with its <<<>>> launches and dynamic shared memory rewritten for the emulation."""
    src = open(SOURCE).read()
    src = re.sub(r"extern __shared__ __align__\(\d+\) unsigned char (\w+)\[\];",
                 r"unsigned char* \1 = emu::shared_memory();", src)
    src, n = re.subn(r"([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<(.*?)>>>\((.*?)\);", r"emu::launch(\1, \2, \3);", src)
    assert n == 7, "expected 7 kernel launches in attention_portable.cu"
    (tmp_path / "attention_portable_emu.cpp").write_text(src)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    tmp = tmp_path_factory.mktemp("attention_emu")
    _emulation_source(tmp)
    emu = os.path.join(REPO, "tests", "attention_emu")
    cmd = [gxx, "-std=c++20", "-O2", "-pthread", "-I", emu, "-I", os.path.join(REPO, "kernels"), "-I", str(tmp),
           os.path.join(emu, "main.cpp"), "-o", str(tmp / "main")]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0 and "barrier" in out.stderr:
        pytest.skip("this g++ lacks C++20 <barrier>")
    assert out.returncode == 0, out.stderr[-4000:]
    return str(tmp / "main")


@pytest.mark.parametrize("B,H,T,D,causal,variant,bwd_variant", [
    (1, 1, 17, 64, 1, 0, 0), (2, 1, 1, 64, 1, 0, 0), (1, 1, 80, 128, 0, 0, 0), (1, 2, 70, 64, 1, 0, 0),
    (1, 1, 150, 64, 1, 1, 1), (1, 1, 140, 128, 1, 2, 1), (1, 1, 200, 64, 1, 3, 1), (1, 1, 130, 64, 0, 3, 1),
    # session 7's backward variants 2 (K/V in registers) and 3 (+ the prep kernel and the wide dQ
    # conversion: the default)
    (1, 1, 200, 64, 1, 3, 2), (1, 1, 130, 64, 0, 3, 3), (1, 1, 300, 64, 1, 3, 3), (1, 1, 17, 64, 1, 3, 3),
    (2, 1, 1, 64, 1, 3, 3), (1, 2, 257, 64, 1, 3, 3), (1, 1, 140, 128, 1, 0, 3), (1, 1, 150, 128, 0, 0, 3),
    # session 7 (P2): forward 9 (128-key stages) and 10 (64-key stages) with their diagonal code
    # paths, T across the 64/128-row seams, causal and full; D = 128 falls back to variant 0
    (1, 1, 300, 64, 1, 9, 3), (1, 1, 300, 64, 1, 10, 3), (1, 2, 129, 64, 1, 9, 3), (1, 1, 65, 64, 1, 10, 3),
    (1, 1, 250, 64, 1, 9, 3), (1, 1, 191, 64, 0, 9, 3), (1, 1, 127, 64, 0, 10, 3), (2, 1, 1, 64, 1, 9, 3),
    (1, 1, 17, 64, 1, 10, 3), (1, 1, 140, 128, 1, 9, 3)])
def test_emulated_kernel_matches_float64(emulator, B, H, T, D, causal, variant, bwd_variant):
    # The block shapes, as TK_ATTENTION_FWD_VARIANT / TK_ATTENTION_BWD_VARIANT pick them.
    env = dict(os.environ, TK_ATTENTION_FWD_VARIANT=str(variant), TK_ATTENTION_BWD_VARIANT=str(bwd_variant))
    out = subprocess.run([emulator, str(B), str(H), str(T), str(D), str(causal), "5"], capture_output=True, text=True,
                         timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    err = {k: float(v) for k, v in re.findall(r"(\w+)=(\S+)", out.stdout)}
    assert err["o"] < 1e-2 and err["lse"] < 1e-5 and err["dv"] < 1e-2, out.stdout
    if T == 1:   # dq = dk = 0 exactly; only the absolute error means anything
        assert err["dq_abs"] < 1e-3 and err["dk_abs"] < 1e-3, out.stdout
    else:
        assert err["dq"] < 1e-2 and err["dk"] < 1e-2, out.stdout

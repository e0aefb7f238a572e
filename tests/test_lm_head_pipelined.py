"""The pipelined cross-entropy kernels of kernels/cross_entropy.cu (rows_pipelined: persistent
blocks, two row buffers, the next row loading while this one is swept), asked for by name:
"pipelined" (bulk copies on an mbarrier, sm_90), "pipelined_ftz" (the same, exponentials by
ex2.approx.ftz) and "pipelined_cp_async" (per-thread cp.async, sm_80). Opt-in: the op asks for
one when TK_LM_HEAD_KERNEL_WIDE names it; the default stays "shared" (rows_in_shared).

CPU (CI): the names the bindings accept (kernels/cross_entropy.h's table, compiled and run by
g++), nvcc for sm_90 (what the JIT builds on the H200), sm_90a and sm_80 (every variant, no
spills; the bulk copies in the sm_90 code and not in the sm_80 code; no denormal path in the FTZ
variant's exponentials), and the switch: TK_LM_HEAD_KERNEL_WIDE reaches the kernel name the op
passes (fake extension).

GPU (skipped without CUDA): each variant against rows_in_shared BIT FOR BIT (same sweeps, same
thread -> chunk mapping, same block reductions; FTZ differs only below 2^-126, which these rows
never reach) and against float64, on a GPT-2 chunk (4096 x 50304 bf16), 1 / 3 / 4097 rows (4097:
not a multiple of the grid), an awkward aligned width (50264), the narrowest row (8), rows of
fewer chunks than threads, fp32 rows, ignored and out-of-range targets, write_grad False (logits
untouched), loss rows poisoned with NaN first; the fallbacks (plan); a CUDA-graph capture; and
the whole op (kernels.lm_head_loss) with the variant requested vs torch's F.cross_entropy and vs
the op on rows_in_shared. tests/gpu_lm_head_pipelined.sh runs them, then times the kernels.
"""
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, rel_err, use_cpu_checks
from kernels import lm_head_op, reference
from test_lm_head import FakeLMHeadExt, _op_errors, float64_reference, make_inputs

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
ROOT = Path(REPO)
VARIANTS = ("pipelined", "pipelined_ftz", "pipelined_cp_async")
# tests/gpu_lm_head_pipelined.sh drops a variant whose smoke run failed or hung (an mbarrier wait
# that never ends hangs the process): TK_CE_SKIP_KERNELS=name,name. The others still get tested.
SKIPPED = set(filter(None, os.environ.get("TK_CE_SKIP_KERNELS", "").split(",")))
PIPELINED = tuple(k for k in VARIANTS if k not in SKIPPED)
ONE = PIPELINED[0] if PIPELINED else None   # for the tests that need only one variant
needs_one = pytest.mark.skipif(ONE is None, reason="every pipelined variant skipped (TK_CE_SKIP_KERNELS)")
ALL_NAMES = ("auto", "registers", "shared", "pipelined", "pipelined_ftz", "pipelined_cp_async", "streamed", "warp")
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)
CUOBJDUMP = shutil.which("cuobjdump") or ("/usr/local/bin/cuobjdump" if os.path.exists("/usr/local/bin/cuobjdump") else None)


# ---- CPU: the names ---------------------------------------------------------------------------

def _cuda_include():
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", str(Path(NVCC).resolve().parent.parent) if NVCC else None):
        if home and (Path(home) / "include" / "cuda_runtime.h").exists():
            return Path(home) / "include"
    return None


@pytest.mark.skipif(shutil.which("g++") is None or _cuda_include() is None, reason="needs g++ and the CUDA headers")
def test_kernel_names_table(tmp_path):
    """kernel_from_name (the bindings' only parser) takes exactly the documented names, each to a
    different Kernel, refuses anything else, and KERNEL_NAMES (the bindings' error message) lists
    every one of them."""
    names = ", ".join(f'"{n}"' for n in ALL_NAMES)
    probe = tmp_path / "names.cpp"
    probe.write_text(f"""#include <cstdio>
#include "cross_entropy.h"
using namespace tk_cross_entropy;
int main() {{
    const char* names[] = {{{names}}};
    for (const char* n : names) {{
        Kernel k = Kernel::automatic;
        const bool ok = kernel_from_name(n, &k);
        std::printf("%s %d %d\\n", n, int(ok), int(k));
    }}
    for (const char* n : {{"", "Pipelined", "pipelined ", "pipe", "shared_pipelined", "pipelined_ftz2"}}) {{
        Kernel k = Kernel::warp;
        std::printf("refused[%s] %d %d\\n", n, int(kernel_from_name(n, &k)), int(k));
    }}
    std::printf("NAMES %s\\n", KERNEL_NAMES);
}}
""")
    exe = tmp_path / "names"
    build = subprocess.run(["g++", "-std=c++20", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "kernels"),
                            "-isystem", str(_cuda_include()), str(probe), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    accepted = [line.split() for line in out[:len(ALL_NAMES)]]
    assert [a[0] for a in accepted] == list(ALL_NAMES) and all(a[1] == "1" for a in accepted), out
    assert len({a[2] for a in accepted}) == len(ALL_NAMES), out          # all different kernels
    assert accepted[0][2] == "0"                                         # "auto" is Kernel::automatic
    for line in out[len(ALL_NAMES):-1]:
        assert line.endswith(" 0 4"), line                               # refused, kernel left as it was (warp = 4)
    listed = re.findall(r"'([a-z_0-9]+)'", out[-1])
    assert sorted(listed) == sorted(ALL_NAMES), out[-1]
    source = (ROOT / "kernels/lm_head_bindings.cpp").read_text()
    assert "kernel_from_name(" in source and "KERNEL_NAMES" in source   # the bindings use the table


# ---- CPU: the variants compile (what the H200 builds is plain sm_90) --------------------------

def _functions(sass):
    """cuobjdump -sass text -> {function name: its instructions}."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+\S", line):
            out[name].append(line.split("*/", 1)[1].split(";")[0].strip())
    return out


@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="needs nvcc and cuobjdump")
@pytest.mark.parametrize("arch", ["90", "90a", "80"])
def test_pipelined_compiles_without_spills(tmp_path, arch):
    code = f"sm_{arch}"
    cubin = tmp_path / "ce.cubin"
    r = subprocess.run([NVCC, "-std=c++20", "-O3", "-lineinfo", f"-gencode=arch=compute_{arch},code={code}", "-Xptxas", "-v",
                        "-I", str(ROOT), "-cubin", str(ROOT / "kernels/cross_entropy.cu"), "-o", str(cubin)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr, [line for line in r.stderr.splitlines() if "warning" in line]
    # ptxas: each entry's "Compiling entry function" line, then its spill line, then its registers
    entries = re.findall(r"Compiling entry function '(\S+)'.*?(\d+) bytes spill stores, (\d+) bytes spill loads"
                         r".*?Used (\d+) registers", r.stderr, flags=re.S)
    spills = {name: int(stores) + int(loads) for name, stores, loads, _ in entries}
    registers = {name: int(regs) for name, _, _, regs in entries if "rows_pipelined" in name}
    assert len(registers) == 6, sorted(registers)                        # bf16, fp32 x (bulk, bulk + ftz, cp.async)
    assert all(regs <= 64 for regs in registers.values()), registers
    assert len(spills) >= 30 and not any(spills.values()), spills        # every kernel of the file, none spills
    sass = _functions(subprocess.run([CUOBJDUMP, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout)
    kernels = {name: body for name, body in sass.items() if "rows_pipelined" in name}
    assert len(kernels) == 6, sorted(kernels)
    for name, body in kernels.items():
        text = "\n".join(body)
        bulk, ftz = "Lb1ELb" in name, name.endswith("Lb1EEEvNS_4ArgsE")
        # the bulk copies (UBLKCP) and mbarrier waits (SYNCS) exist for sm_90 only; sm_80's bulk
        # variants are a trap the launcher never runs
        assert ("UBLKCP" in text) == ("SYNCS" in text) == (bulk and arch != "80"), (name, arch)
        assert ("LDGSTS" in text) == (not bulk), name                    # cp.async
        assert "STG.E.128" in text or arch == "80" and bulk, name        # the gradient: 16-byte stores
        # exp2f's denormal path compares its argument with -126; ex2.approx.ftz has none
        assert ("-126" in text) == (not ftz) or (arch == "80" and bulk), name


# ---- CPU: the switch reaches the op -----------------------------------------------------------

def test_env_switch_names_the_kernel_the_op_asks_for(monkeypatch):
    for name in VARIANTS:
        out = subprocess.run([sys.executable, "-c", "from kernels import lm_head_op; print(lm_head_op.KERNEL_WIDE, lm_head_op.KERNEL_NARROW)"],
                             cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={**{k: v for k, v in os.environ.items() if k != "TK_LM_HEAD_KERNEL_NARROW"},
                                  "TK_LM_HEAD_KERNEL_WIDE": name})
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == [name, "warp"], out.stdout
    # and the op passes it on for wide rows only (the bindings' stand-in records it)
    fake = FakeLMHeadExt(collections.Counter())
    monkeypatch.setattr(lm_head_op._ext, "_module", fake)
    use_cpu_checks(monkeypatch, lm_head_op, "check_inputs")
    monkeypatch.setattr(lm_head_op, "KERNEL_WIDE", "pipelined")
    monkeypatch.setattr(lm_head_op, "KERNEL_NARROW", "warp")
    x, w, t = make_inputs(3, 8, 1500)
    loss = lm_head_op.lm_head_loss(x, w, t)
    x, w, t = make_inputs(3, 8, 40)
    lm_head_op.lm_head_loss(x, w, t)
    assert fake.kernels == ["pipelined", "warp"], fake.kernels
    assert torch.isfinite(loss)


# ---- GPU: the kernels alone -------------------------------------------------------------------

def _ext():
    reason = lm_head_op._ext.why_not()
    assert reason is None, reason
    return lm_head_op._ext.module


def same_bits(a, b):
    """Equal bit for bit (NaNs included: a NaN loss row must be NaN in both)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def rows_of(N, V, dtype, seed, scale=3.0):
    """Logits (N, V) of std `scale`, targets with every 7th row ignored, the first and last
    columns and a chunk edge among the targets (the target's column is special in the gradient)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    source = (torch.randn(N, V, device="cuda", generator=gen) * scale).to(dtype)
    targets = torch.randint(0, V, (N,), device="cuda", generator=gen)
    targets[1::7] = -1
    for i, col in enumerate((0, V - 1, min(V - 1, 8), min(V - 1, 7))):
        if 2 + 7 * i < N:
            targets[2 + 7 * i] = col
    if N == 1:
        targets[0] = V - 1
    return source, targets


def reference_rows(source, targets, grad_scale):
    """float64 loss rows (0 where ignored) and gradient ((softmax - onehot) * grad_scale, 0 where ignored)."""
    l64 = source.double()
    valid = targets != -1
    lse = torch.logsumexp(l64, 1)
    loss = torch.where(valid, lse - l64.gather(1, targets.clamp_min(0)[:, None])[:, 0], 0.0)
    grad = torch.softmax(l64, 1)
    grad[valid.nonzero()[:, 0], targets[valid]] -= 1
    return loss, grad * valid[:, None] * grad_scale


def run_kernel(ext, source, targets, grad_scale, write_grad, kernel):
    """(loss rows, logits after) of one call on a copy of source, loss rows poisoned with NaN."""
    logits = source.clone()
    loss_rows = torch.full((source.shape[0],), float("nan"), device="cuda")
    ext.cross_entropy_(logits, targets, loss_rows, grad_scale, write_grad, kernel)
    torch.cuda.synchronize()
    return loss_rows, logits


def expected_plan(V, dtype, kernel):
    """What a request for a pipelined kernel runs (cross_entropy.cu's resolve_pipelined on an
    sm_90 device with 227 KB of opt-in shared memory): itself where two 16-byte aligned rows fit
    (bf16 up to ~57800 columns, fp32 up to ~28900), else rows_in_shared where one row fits, else
    the automatic choice (rows_in_registers where it fits, else rows_streamed)."""
    size = 2 if dtype == torch.bfloat16 else 4
    aligned = V % (16 // size) == 0
    if aligned and 2 * V * size <= 232448 - 1024:
        return kernel
    if aligned and V * size <= 232448 - 64:
        return "shared"
    chunks = -(-V * size // 16)
    return next((f"registers(VECS={v})" for v in (1, 2, 4, 8, 16) if aligned and chunks <= 512 * v), "streamed")


@gpu
def test_plans():
    ext = _ext()
    assert torch.cuda.get_device_capability()[0] >= 9, "these expectations are sm_90's (bulk copies)"
    for V, dtype in ((50304, torch.bfloat16), (50264, torch.bfloat16), (8, torch.bfloat16), (1000, torch.bfloat16),
                     (57344, torch.bfloat16), (60000, torch.bfloat16), (120000, torch.bfloat16), (50257, torch.bfloat16),
                     (28672, torch.float32), (30000, torch.float32), (50304, torch.float32), (1003, torch.float32)):
        z = torch.zeros(4, V, device="cuda", dtype=dtype)
        for kernel in VARIANTS:   # plan launches nothing: the skipped ones too
            assert ext.plan(z, kernel) == expected_plan(V, dtype, kernel), (V, dtype, kernel, ext.plan(z, kernel))
    assert ext.plan(torch.zeros(4, 50304, device="cuda", dtype=torch.bfloat16)) == "registers(VECS=16)"   # auto unchanged
    with pytest.raises(ValueError, match="kernel must be 'auto'.*'pipelined'.*'pipelined_ftz'.*'pipelined_cp_async'"):
        ext.plan(torch.zeros(4, 10, device="cuda"), "pipelined_tma")


# (rows, V, dtype): a GPT-2 chunk; 1 and 3 rows (fewer rows than SMs: fewer blocks); 4097 (31 rows
# a block and 5 blocks with a 32nd); an awkward aligned width (6283 chunks: not a multiple of 512);
# the narrowest row (one chunk); rows of fewer chunks than threads (several blocks an SM); fp32
# rows (two of 4104 and of 28672 fit; fp32 GPT-2 falls back to rows_in_shared, checked in plans).
SHAPES = [(4096, 50304, torch.bfloat16), (1, 50304, torch.bfloat16), (3, 50304, torch.bfloat16),
          (4097, 50304, torch.bfloat16), (265, 50264, torch.bfloat16), (133, 8, torch.bfloat16),
          (1000, 1000, torch.bfloat16), (17, 4104, torch.float32), (300, 28672, torch.float32)]


@gpu
@pytest.mark.parametrize("kernel", PIPELINED)
@pytest.mark.parametrize("N,V,dtype", SHAPES, ids=lambda v: str(v).replace("torch.", ""))
def test_kernel_vs_rows_in_shared_and_float64(N, V, dtype, kernel):
    ext = _ext()
    source, targets = rows_of(N, V, dtype, seed=N * 7 + V)
    n_valid = int((targets != -1).sum())
    grad_scale = torch.tensor([1.0 / n_valid], device="cuda")
    assert ext.plan(source, kernel) == kernel
    assert ext.plan(source, "shared") == "shared"
    for write_grad in (True, False):
        loss, logits = run_kernel(ext, source, targets, grad_scale, write_grad, kernel)
        base_loss, base_logits = run_kernel(ext, source, targets, grad_scale, write_grad, "shared")
        assert same_bits(loss, base_loss), (write_grad, (loss - base_loss).abs().max())
        assert same_bits(logits, base_logits), write_grad
        if not write_grad:
            assert same_bits(logits, source)                              # loss only: logits untouched
    ref_loss, ref_grad = reference_rows(source, targets, 1.0 / n_valid)
    valid = targets != -1
    assert rel_err(loss, ref_loss) < 1e-5 and (loss[~valid] == 0).all()
    loss, logits = run_kernel(ext, source, targets, grad_scale, True, kernel)
    tol = 8e-3 if dtype == torch.bfloat16 else 1e-5                      # one rounding of each element
    assert rel_err(logits, ref_grad) < tol
    assert not logits[~valid].any()
    # each element within about one rounding of its float64 value (test_lm_head.py explains the floor)
    floor = 1e-9 if dtype == torch.bfloat16 else 1e-6
    slack = ref_grad.abs() * (2**-7 if dtype == torch.bfloat16 else 1e-5) + floor / n_valid
    worst = ((logits.double() - ref_grad).abs() - slack).max().item()
    assert worst <= 0, worst


@gpu
@pytest.mark.parametrize("kernel", PIPELINED)
def test_bad_targets_and_grad_scale(kernel):
    """Targets V and -2 give NaN loss rows and zero gradients (as rows_in_shared); the kernel
    reads grad_scale from device memory (any value, here 0.37)."""
    ext = _ext()
    V = 50304
    source = (torch.randn(6, V, device="cuda") * 3).bfloat16()
    targets = torch.tensor([0, -1, V - 1, V, -2, 5], device="cuda")
    grad_scale = torch.tensor([0.37], device="cuda")
    assert ext.plan(source, kernel) == kernel
    loss, logits = run_kernel(ext, source, targets, grad_scale, True, kernel)
    base_loss, base_logits = run_kernel(ext, source, targets, grad_scale, True, "shared")
    assert same_bits(loss, base_loss) and same_bits(logits, base_logits)
    assert torch.isnan(loss[[3, 4]]).all() and loss[1] == 0 and torch.isfinite(loss[[0, 2, 5]]).all()
    assert not logits[[1, 3, 4]].any()                                   # ignored and invalid rows: zero gradient
    ref_loss, ref_grad = reference_rows(source[[0, 2, 5]], targets[[0, 2, 5]], 0.37)
    assert rel_err(loss[[0, 2, 5]], ref_loss) < 1e-5 and rel_err(logits[[0, 2, 5]], ref_grad) < 8e-3


@gpu
@pytest.mark.parametrize("kernel", PIPELINED)
def test_sizes_in_turn_and_under_cuda_graph(kernel):
    """The launcher remembers the grid for the last row size: sizes in turn (50304, 1000, 50304)
    each match rows_in_shared; then a capture whose FIRST call of a new size (2056) happens inside
    the capture (the grid and shared-memory queries run during capture), replayed on new data."""
    ext = _ext()
    for N, V in ((300, 50304), (300, 1000), (300, 50304)):
        source, targets = rows_of(N, V, torch.bfloat16, seed=V)
        gs = torch.tensor([1.0 / int((targets != -1).sum())], device="cuda")
        a = run_kernel(ext, source, targets, gs, True, kernel)
        b = run_kernel(ext, source, targets, gs, True, "shared")
        assert same_bits(a[0], b[0]) and same_bits(a[1], b[1]), (N, V)

    N, V = 777, 2056
    source, targets = rows_of(N, V, torch.bfloat16, seed=1)
    logits = source.clone()
    loss_rows = torch.full((N,), float("nan"), device="cuda")
    gs = torch.tensor([1.0 / int((targets != -1).sum())], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):                                        # the binding launches on the capture stream
        ext.cross_entropy_(logits, targets, loss_rows, gs, True, kernel)
    source2, targets2 = rows_of(N, V, torch.bfloat16, seed=2)
    logits.copy_(source2)
    targets.copy_(targets2)
    gs.fill_(1.0 / int((targets2 != -1).sum()))
    graph.replay()
    torch.cuda.synchronize()
    expected = run_kernel(ext, source2, targets2, gs, True, "shared")
    assert same_bits(loss_rows, expected[0]) and same_bits(logits, expected[1])


# ---- GPU: the whole op with the variant requested ---------------------------------------------

@gpu
@pytest.mark.parametrize("kernel", PIPELINED)
@pytest.mark.parametrize("N", [17, 1000, 4097])
def test_op_vs_float64_and_torch(N, kernel, monkeypatch):
    """kernels.lm_head_loss with KERNEL_WIDE = the variant (what TK_LM_HEAD_KERNEL_WIDE sets at
    import), GPT-2's V, bf16 autocast: loss, dx, dW vs float64 no worse than F.cross_entropy's
    (test_lm_head.py's bounds), and equal to the op on rows_in_shared (same dlogits, same GEMMs)."""
    monkeypatch.setattr(lm_head_op, "KERNEL_WIDE", kernel)
    errors = _op_errors(N, 50304, seed=N)
    for name, e, e_ref in zip(("loss", "dx", "dW"), errors["tk"], errors["torch"]):
        assert e < 2e-2 and e <= 2 * e_ref + 2e-3, (name, errors)

    x, w, t = make_inputs(N, 256, 50304, device="cuda", x_dtype=torch.bfloat16, seed=N + 1)
    got = {}
    for k in (kernel, "shared"):
        monkeypatch.setattr(lm_head_op, "KERNEL_WIDE", k)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm_head_op.lm_head_loss(x, w, t)
        got[k] = (loss.detach(), *torch.autograd.grad(loss, (x, w)))
    assert same_bits(got[kernel][0], got["shared"][0])
    for a, b in zip(got[kernel][1:], got["shared"][1:]):                 # cuBLAS on the same dlogits
        assert rel_err(a, b) < 1e-6


@gpu
@needs_one
def test_op_several_chunks_and_fp32(monkeypatch):
    """16 chunks of 64 rows + a 1-row one (one pipelined launch each), and fp32 without autocast
    (fp32 GPT-2 rows: two do not fit, rows_in_shared runs: still right)."""
    monkeypatch.setattr(lm_head_op, "KERNEL_WIDE", ONE)
    monkeypatch.setattr(lm_head_op, "CHUNK_BYTES", 64 * 50304 * 2)
    errors = _op_errors(1025, 50304)
    assert max(errors["tk"]) < 2e-2 and errors["tk"][2] <= 2 * errors["torch"][2] + 2e-3, errors
    monkeypatch.setattr(lm_head_op, "CHUNK_BYTES", 512 * 2**20)
    errors = _op_errors(300, 50304, C=64, x_dtype=torch.float32, autocast=False)
    assert max(errors["tk"]) < 1e-2, errors                              # tf32 may be on


@gpu
@needs_one
def test_env_switch_in_a_fresh_process():
    """TK_LM_HEAD_KERNEL_WIDE=<variant> in a new process (as tests/gpu_e2e_env_ab.sh sets it): the
    op asks the bindings for it, the plan of a GPT-2 chunk is it, and the loss matches
    F.cross_entropy's."""
    code = """
import torch
from kernels import lm_head_op, reference
asked = []
real = lm_head_op._ext.module
class Spy:
    def cross_entropy_(self, *args):
        asked.append(args[-1]); return real.cross_entropy_(*args)
lm_head_op._ext._module = Spy()
x = torch.randn(600, 128, device="cuda").bfloat16().requires_grad_()
w = (torch.randn(50304, 128, device="cuda") * 0.2).requires_grad_()
t = torch.randint(0, 50304, (600,), device="cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    tk, ref = lm_head_op.lm_head_loss(x, w, t), reference.lm_head_loss(x, w, t)
print("asked", sorted(set(asked)), "plan", real.plan(torch.empty(4096, 50304, device="cuda", dtype=torch.bfloat16), lm_head_op.KERNEL_WIDE))
print("diff", abs(tk.item() - ref.item()) / abs(ref.item()))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TK_LM_HEAD_KERNEL_WIDE": ONE})
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"asked ['{ONE}'] plan {ONE}" in out.stdout, out.stdout
    assert float(out.stdout.split("diff")[1]) < 2e-3, out.stdout

"""The LM head + cross-entropy op (kernels.lm_head_loss): reference, switch, the tk Python half on
CPU with a fake kernel, and (GPU only) the kernel and the whole op against float64.

CPU (CI): the reference is F.linear + F.cross_entropy exactly as model.py did before the op
existed (bit for bit, loss and every gradient); the switch routes and refuses as for the other
ops; kernels/lm_head_op.py's chunk loop, custom op, autograd and eager fast path run on CPU
tensors with the extension replaced by FakeLMHeadExt (plain torch, the bindings' signature), so
its gradient plumbing is checked against float64 with several chunks and a partial last one.

GPU (skipped without CUDA): kernels/cross_entropy.cu alone (loss rows and in-place gradient vs
float64, every kernel: rows in registers, in shared memory, streamed, one warp per row), the op
(loss, dx, dW vs float64 at N in {1, 17, 1000, 4097} x V in {65, 1000, 1003, 50304}, some
targets ignored; and with the kernels requested that are not yet the defaults, and with the logits
on the tk GEMM (the default since session 12) and on cuBLAS (TK_LM_HEAD_LOGITS=cublas)), fp32, no_grad,
CUDA graph capture, torch.compile, and the GPT's loss and gradients with kernels_lm_head=tk vs
torch. tests/gpu_lm_head.sh runs them with the build, compute-sanitizer and the bench row.
"""
import collections
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernels
from conftest import rel_err, use_cpu_checks   # rel_err fails on NaN or inf in the result
from kernels import lm_head_op, reference
from model import GPT, GPTConfig

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def restore_switch():
    saved = kernels.choice()
    yield
    kernels.configure("auto", **saved)
    kernels.reset_used()


def make_inputs(N, C, V, device="cpu", x_dtype=torch.float32, seed=0, ignore_every=5):
    """x (N, C), weight (V, C) fp32 at GPT-2's init scale times 10 (logits of std ~1-2, so the
    softmax is not flat), targets (N,) with every ignore_every-th row -1."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=gen).to(device=device, dtype=x_dtype)
    weight = (torch.randn(V, C, generator=gen) * 0.2 / math.sqrt(C) * 10).to(device)
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[::ignore_every] = -1
    return x.requires_grad_(), weight.requires_grad_(), targets.to(device)


def request_new_kernels(monkeypatch):
    """lm_head_op's KERNEL_WIDE = "shared", KERNEL_NARROW = "warp" (the defaults since session 4),
    set explicitly so that these tests keep testing them if the defaults change."""
    monkeypatch.setattr(lm_head_op, "KERNEL_WIDE", "shared")
    monkeypatch.setattr(lm_head_op, "KERNEL_NARROW", "warp")


def float64_reference(x, weight, targets):
    """loss, dx, dW in float64 from the same (already rounded) inputs."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    loss = F.cross_entropy(x64 @ w64.t(), targets, ignore_index=-1)
    dx, dw = torch.autograd.grad(loss, (x64, w64))
    return loss.detach(), dx, dw


# ---- CPU: reference and switch ----------------------------------------------------------------

def test_reference_is_models_old_formula_bit_for_bit():
    x, w, t = make_inputs(37, 48, 65)
    loss = reference.lm_head_loss(x, w, t)
    dx, dw = torch.autograd.grad(loss, (x, w))
    logits = F.linear(x, w)
    old = F.cross_entropy(logits.view(-1, logits.size(-1)), t.reshape(-1), ignore_index=-1)
    odx, odw = torch.autograd.grad(old, (x, w))
    assert torch.equal(loss, old) and torch.equal(dx, odx) and torch.equal(dw, odw)
    ref, rdx, rdw = float64_reference(x, w, t)
    assert rel_err(loss, ref) < 1e-5 and rel_err(dx, rdx) < 1e-5 and rel_err(dw, rdw) < 1e-5


def test_model_loss_on_torch_path_is_unchanged_bit_for_bit():
    kernels.configure("torch")
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=2, n_embd=64))
    idx, t = torch.randint(65, (3, 32)), torch.randint(65, (3, 32))
    t[0, :5] = -1
    logits, loss = m(idx, t)
    assert logits is None   # training returns no logits: the tk op never holds them
    loss.backward()
    new = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    # model.py's lines before the op existed: lm_head on the final layernorm's output, then cross_entropy
    h, branch = m.drop(m.wte(idx) + m.wpe(torch.arange(32))), None
    for block in m.h:
        h, branch = block(h, branch, None)
    y, _ = m.ln_f.add_norm(h, branch)
    logits = m.lm_head(y)
    old = F.cross_entropy(logits.view(-1, logits.size(-1)), t.reshape(-1), ignore_index=-1)
    old.backward()
    assert torch.equal(loss, old)
    for n, p in m.named_parameters():
        assert torch.equal(new[n], p.grad), n
    assert kernels.used()["lm_head"] == "torch"


def test_switch_routes_and_refuses_on_cpu(capsys, monkeypatch):
    monkeypatch.setattr(kernels, "_logged", set())
    x, w, t = make_inputs(5, 16, 10)
    assert "lm_head" in kernels.OPS
    assert kernels.configure("torch", lm_head="tk")["lm_head"] == "tk"
    with pytest.raises(kernels.KernelUnavailable, match="kernels_lm_head=tk.*cpu"):
        kernels.lm_head_loss(x, w, t)
    kernels.configure("auto")
    kernels.reset_used()
    loss = kernels.lm_head_loss(x, w, t)
    assert torch.equal(loss, reference.lm_head_loss(x, w, t))
    assert kernels.used()["lm_head"] == "torch"
    assert "kernels: lm_head falls back to torch (x is on cpu" in capsys.readouterr().out
    with pytest.raises(ValueError, match="kernels_lm_head"):
        kernels.configure("auto", lm_head="fast")
    kernels.configure("auto", lm_head="tk")
    with pytest.raises(kernels.KernelUnavailable, match="kernels_lm_head=tk"):
        kernels.preflight(2, 8, 16, 2, torch.bfloat16, "cpu")


def test_why_not_names_the_problem(monkeypatch):
    x, w, t = make_inputs(5, 16, 10)
    assert "cpu" in lm_head_op.why_not(x, w, t)
    monkeypatch.setattr(lm_head_op.checks, "on_kernel_device", lambda t: True)
    monkeypatch.setattr(lm_head_op, "_build_reason", lambda: None)
    assert lm_head_op.why_not(x, w, t) is None
    assert "int64" in lm_head_op.why_not(x, w, t.int())
    assert "do not match" in lm_head_op.why_not(x, w[:, :8], t)
    assert "do not match" in lm_head_op.why_not(x, w, t[:4])
    assert "float16" in lm_head_op.why_not(x.half(), w.half(), t)
    assert "cast one" in lm_head_op.why_not(x.bfloat16(), w, t)
    assert "(N, C)" in lm_head_op.why_not(x[None], w, t)


def test_check_inputs_name_the_argument():
    x, w, t = make_inputs(5, 16, 10)
    check = lm_head_op.check_inputs
    with pytest.raises(TypeError, match="tk_lm_head: targets must be int64"):
        check(x, w, t.int(), cuda=False)
    with pytest.raises(ValueError, match=r"tk_lm_head: weight must have shape \(vocab, 16\)"):
        check(x, w[:, :8], t, cuda=False)
    with pytest.raises(ValueError, match="tk_lm_head: targets must have one class per row of x"):
        check(x, w, t[:3], cuda=False)
    with pytest.raises(ValueError, match="tk_lm_head: x must be 2-D"):
        check(x[None], w, t, cuda=False)
    with pytest.raises(ValueError, match="tk_lm_head: x must be a CUDA tensor"):
        check(x, w, t)
    check(x, w, t, cuda=False)


def test_chunk_size_from_the_environment(monkeypatch):
    monkeypatch.setenv(lm_head_op.CHUNK_ENV, "1024")
    assert lm_head_op._chunk_bytes() == 2**30
    for bad in ("0", "-5", "1.5", "big"):
        monkeypatch.setenv(lm_head_op.CHUNK_ENV, bad)
        with pytest.raises(ValueError, match=lm_head_op.CHUNK_ENV):
            lm_head_op._chunk_bytes()
    monkeypatch.delenv(lm_head_op.CHUNK_ENV)
    assert lm_head_op._chunk_bytes() == 512 * 2**20


def test_chunk_rows():
    assert lm_head_op.chunk_rows(32768, 50304, 2) == 4096          # GPT-2: 8 chunks of 412 MB
    assert lm_head_op.chunk_rows(16384, 65, 2) == 16384            # shakespeare-char: one chunk
    assert lm_head_op.chunk_rows(1, 50304, 4) == 1
    rows = lm_head_op.chunk_rows(10**6, 50304, 4)
    assert rows & (rows - 1) == 0 and rows * 50304 * 4 <= lm_head_op.CHUNK_BYTES


# ---- CPU: the C++/CUDA halves compile (nvcc for sm_90a and sm_80, g++ for the bindings) -------

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80"])
def test_kernel_compiles_without_spills(tmp_path, arch):
    r = subprocess.run([NVCC, "-std=c++20", "-O3", "-lineinfo", arch, "-Xptxas", "-v", "-I", str(ROOT), "-c",
                        str(ROOT / "kernels/cross_entropy.cu"), "-o", str(tmp_path / "ce.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    spills = [line for line in r.stderr.splitlines() if "spill" in line and " 0 bytes spill stores" not in line]
    assert not spills and "rows_in_registers" in r.stderr and "rows_streamed" in r.stderr, spills


def test_bindings_compile(tmp_path):
    from test_bindings_compile import GXX, compile_command, cuda_include
    if GXX is None or cuda_include() is None:
        pytest.skip("needs g++ and the CUDA headers")
    unit = tmp_path / "lm_head_bindings_check.cpp"
    unit.write_text('#define TORCH_EXTENSION_NAME lm_head_check\n#include "lm_head_bindings.cpp"\n')
    r = subprocess.run(compile_command(tmp_path, unit), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning:" not in r.stderr, r.stderr[-3000:]
    source = (ROOT / "kernels/lm_head_bindings.cpp").read_text()
    # kernels/bindings_checks.h's rule: no TORCH_CHECK of its own, nothing streamed (bit shifts are fine)
    assert "TORCH_CHECK" not in source and not re.search(r"<<(?!\s*\d)", source)


KERNEL_NAMES = ("auto", "registers", "shared", "streamed", "warp")


def test_kernel_names_table(tmp_path):
    """cross_entropy.h's kernel_from_name (the bindings' only parser of a kernel's name) takes
    exactly these names, each to a different Kernel, refuses anything else, and KERNEL_NAMES (the
    bindings' error message) lists every one (compiled by g++ and run)."""
    from test_bindings_compile import GXX, cuda_include
    if GXX is None or cuda_include() is None:
        pytest.skip("needs g++ and the CUDA headers")
    names = ", ".join(f'"{n}"' for n in KERNEL_NAMES)
    probe = tmp_path / "names.cpp"
    probe.write_text(f"""#include <cstdio>
#include "cross_entropy.h"
using namespace tk_cross_entropy;
int main() {{
    for (const char* n : {{{names}}}) {{
        Kernel k = Kernel::automatic;
        const bool ok = kernel_from_name(n, &k);
        std::printf("%s %d %d\\n", n, int(ok), int(k));
    }}
    for (const char* n : {{"", "Shared", "shared ", "pipelined", "warp2"}}) {{
        Kernel k = Kernel::warp;
        std::printf("refused[%s] %d %d\\n", n, int(kernel_from_name(n, &k)), int(k));
    }}
    std::printf("NAMES %s\\n", KERNEL_NAMES);
}}
""")
    exe = tmp_path / "names"
    build = subprocess.run([GXX, "-std=c++20", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "kernels"),
                            "-isystem", str(cuda_include()), str(probe), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    accepted = [line.split() for line in out[:len(KERNEL_NAMES)]]
    assert [a[0] for a in accepted] == list(KERNEL_NAMES) and all(a[1] == "1" for a in accepted), out
    assert len({a[2] for a in accepted}) == len(KERNEL_NAMES) and accepted[0][2] == "0", out   # "auto": automatic
    warp = next(a[2] for a in accepted if a[0] == "warp")
    for line in out[len(KERNEL_NAMES):-1]:
        assert line.endswith(f" 0 {warp}"), line                 # refused, the kernel left as it was
    assert sorted(re.findall(r"'([a-z_0-9]+)'", out[-1])) == sorted(KERNEL_NAMES), out[-1]


def test_owner_of_op_modules():
    assert kernels._owner("lm_head_op") == "lm_head" and kernels._owner("mlp_op") == "mlp"
    assert kernels._owner("attention_hopper") == "attention" and kernels._owner("gemm") is None


def test_fp32_gemm_fallback_is_decided_by_the_first_call(monkeypatch):
    """_try: a torch that refuses out_dtype is found out once and never asked again; an OOM, or
    any error after out_dtype worked once, propagates instead of switching to the fallback."""
    monkeypatch.setattr(lm_head_op, "_fp32_gemm_ok", {"mm": None, "addmm": None})
    def refused():
        raise RuntimeError("self and mat2 must have the same dtype")
    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    ran = []
    assert lm_head_op._try("mm", refused) is False
    assert lm_head_op._try("mm", lambda: ran.append("mm")) is False and ran == []
    with pytest.raises(torch.cuda.OutOfMemoryError):
        lm_head_op._try("addmm", oom)
    assert lm_head_op._fp32_gemm_ok["addmm"] is None
    assert lm_head_op._try("addmm", lambda: ran.append("addmm")) is True and ran == ["addmm"]
    with pytest.raises(RuntimeError, match="same dtype"):
        lm_head_op._try("addmm", refused)
    assert lm_head_op._fp32_gemm_ok == {"mm": False, "addmm": True}


# ---- CPU: the tk Python half with a fake kernel -----------------------------------------------

class FakeLMHeadExt:
    """lm_head_bindings.cpp's cross_entropy_ in plain torch: loss_rows filled (0 ignored, NaN out of
    range), and with write_grad the logits overwritten by (softmax - onehot) * grad_scale."""

    def __init__(self, calls):
        self.calls = calls
        self.kernels = []   # the kernel each call asked for

    def cross_entropy_(self, logits, targets, loss_rows, grad_scale, write_grad, kernel="auto"):
        self.calls["lm_head.grad" if write_grad else "lm_head.loss_only"] += 1
        self.kernels.append(kernel)
        V = logits.shape[1]
        lf = logits.float()
        valid = (targets >= 0) & (targets < V)
        picked = lf.gather(1, targets.clamp(0, V - 1)[:, None])[:, 0]
        nan = torch.full_like(picked, float("nan"))
        loss_rows.copy_(torch.where(valid, torch.logsumexp(lf, 1) - picked, torch.where(targets == -1, 0.0, nan)))
        if write_grad:
            g = torch.softmax(lf, 1)
            g[valid.nonzero()[:, 0], targets[valid]] -= 1
            logits.copy_(torch.where(valid[:, None], g * grad_scale, 0.0))   # 0 for ignored rows, never inf*0


@pytest.fixture
def fake_ext(monkeypatch):
    calls = collections.Counter()
    monkeypatch.setattr(lm_head_op._ext, "_module", FakeLMHeadExt(calls))
    use_cpu_checks(monkeypatch, lm_head_op, "check_inputs")
    monkeypatch.setattr(lm_head_op, "CHUNK_BYTES", 64 * 40 * 4)   # 64 rows of fp32 V=40: 37/64/1000 rows -> 1..16 chunks
    return calls


@pytest.mark.parametrize("N", [1, 17, 200])
def test_fake_kernel_path_matches_float64(fake_ext, N):
    x, w, t = make_inputs(N, 24, 40)
    if N == 1:
        t[0] = 3
    loss = lm_head_op.lm_head_loss(x, w, t)
    dx, dw = torch.autograd.grad(loss * 3.0, (x, w))   # grad_output 3 scales the saved gradients
    ref, rdx, rdw = float64_reference(x, w, t)
    assert loss.dtype == torch.float32
    assert rel_err(loss, ref) < 1e-5
    assert rel_err(dx, 3 * rdx) < 1e-5 and rel_err(dw, 3 * rdw) < 1e-5
    assert fake_ext["lm_head.grad"] == math.ceil(N / 64) and fake_ext["lm_head.loss_only"] == 0


def test_op_asks_for_the_configured_kernel(fake_ext, monkeypatch):
    fake = lm_head_op._ext._module
    x, w, t = make_inputs(10, 24, 40)
    lm_head_op.lm_head_loss(x, w, t)
    assert fake.kernels == ["warp"]                                   # the defaults: narrow rows on rows_per_warp
    x, w, t = make_inputs(3, 8, 1500)
    lm_head_op.lm_head_loss(x, w, t)
    assert set(fake.kernels[1:]) == {"shared"}                        # wide rows on rows_in_shared (3 one-row chunks)
    monkeypatch.setattr(lm_head_op, "KERNEL_WIDE", "auto")
    monkeypatch.setattr(lm_head_op, "KERNEL_NARROW", "auto")
    lm_head_op.lm_head_loss(x, w, t)
    x, w, t = make_inputs(10, 24, 40)
    lm_head_op.lm_head_loss(x, w, t)
    assert fake.kernels[4:] == ["auto"] * 4                           # what the overrides ask for


def test_fake_kernel_path_bf16_inputs(fake_ext):
    x, w, t = make_inputs(100, 32, 40)
    xb, wb = x.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_()
    loss = lm_head_op.lm_head_loss(xb, wb, t)
    dx, dw = torch.autograd.grad(loss, (xb, wb))
    assert loss.dtype == dx.dtype == dw.dtype == torch.bfloat16   # as F.cross_entropy on bf16 logits
    ref, rdx, rdw = float64_reference(xb, wb, t)
    assert rel_err(loss, ref) < 1e-2 and rel_err(dx, rdx) < 2e-2 and rel_err(dw, rdw) < 2e-2


@pytest.mark.parametrize("V", [48, 40])
def test_logits_on_the_tk_gemm_by_default(fake_ext, monkeypatch, V):
    """By default (TK_LM_HEAD_LOGITS unset: tk, since session 12) each chunk's logits go through
    gemm.matmul (the fake GEMM extension here) where it takes the product (bf16, K and V multiples
    of 16), else cuBLAS; with the opt-out (cublas) never. The loss and gradients are the same."""
    from test_linear import install_fake_gemm
    gemm_calls = collections.Counter()
    fake_gemm = install_fake_gemm(monkeypatch, gemm_calls)
    monkeypatch.setattr(lm_head_op.gemm, "why_not", lambda: None)
    monkeypatch.delenv(lm_head_op.LOGITS_ENV, raising=False)
    default = lm_head_op._logits_gemm()                      # what LOGITS_GEMM is read as at import
    assert default == "tk"
    x, w, t = make_inputs(150, 32, V)                        # 64-row chunks: 3 of them
    xb, wb = x.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_()
    results = {}
    for logits_gemm in ("cublas", default):
        monkeypatch.setattr(lm_head_op, "LOGITS_GEMM", logits_gemm)
        gemm_calls.clear()
        loss = lm_head_op.lm_head_loss(xb, wb, t)
        results[logits_gemm] = (loss, *torch.autograd.grad(loss, (xb, wb)))
        expect = 3 if logits_gemm == "tk" and V % 16 == 0 else 0
        assert gemm_calls["gemm.run"] == expect, dict(gemm_calls)
    if V % 16 == 0:
        assert {shape for *_, shape in fake_gemm.seen} == {(64, 32, V), (150 - 128, 32, V)}
    for a, b in zip(results["cublas"], results["tk"]):
        assert rel_err(a, b) < 1e-2                           # bf16 logits rounded by two GEMMs
    ref, rdx, rdw = float64_reference(xb, wb, t)
    loss, dx, dw = results["tk"]
    assert rel_err(loss, ref) < 1e-2 and rel_err(dx, rdx) < 2e-2 and rel_err(dw, rdw) < 2e-2


def test_logits_gemm_from_the_environment(monkeypatch):
    monkeypatch.delenv(lm_head_op.LOGITS_ENV, raising=False)
    assert lm_head_op._logits_gemm() == "tk"                 # the default since session 12
    for value, want in (("tk", "tk"), ("cublas", "cublas"), (" cublas ", "cublas"), ("", "tk")):
        monkeypatch.setenv(lm_head_op.LOGITS_ENV, value)
        assert lm_head_op._logits_gemm() == want
    monkeypatch.setenv(lm_head_op.LOGITS_ENV, "cutlass")
    with pytest.raises(ValueError, match=lm_head_op.LOGITS_ENV):
        lm_head_op._logits_gemm()


def test_preflight_builds_the_tk_gemm_for_the_logits(monkeypatch):
    """With the logits on the tk GEMM, the start-up check builds its extension too (not mid-step);
    if it cannot build, the logits run on cuBLAS, so its reason is not the LM head's."""
    asked = []
    monkeypatch.setattr(lm_head_op.gemm, "why_not", lambda: asked.append("gemm") or "needs a Hopper GPU")
    monkeypatch.setattr(lm_head_op._ext, "why_not", lambda: None)
    for logits_gemm, expect in (("tk", ["gemm"]), ("cublas", [])):
        monkeypatch.setattr(lm_head_op, "LOGITS_GEMM", logits_gemm)
        asked.clear()
        assert lm_head_op.preflight(dtype=torch.bfloat16, device="cuda") is None
        assert asked == expect, logits_gemm


def test_fake_kernel_path_skips_gradients_without_grad(fake_ext):
    x, w, t = make_inputs(100, 24, 40)
    with torch.no_grad():
        loss = lm_head_op.lm_head_loss(x, w, t)
    assert fake_ext["lm_head.grad"] == 0 and fake_ext["lm_head.loss_only"] == 2
    assert rel_err(loss, float64_reference(x, w, t)[0]) < 1e-5
    loss = lm_head_op.lm_head_loss(x.detach(), w.detach(), t)   # nothing requires grad
    assert fake_ext["lm_head.grad"] == 0 and not loss.requires_grad


def test_fake_kernel_path_all_ignored_and_bad_target(fake_ext):
    x, w, t = make_inputs(10, 24, 40)
    loss = lm_head_op.lm_head_loss(x, w, torch.full_like(t, -1))
    assert torch.isnan(loss)                                   # 0/0, as F.cross_entropy
    dx, dw = torch.autograd.grad(loss, (x, w))
    assert not dx.any() and not dw.any()
    t[3] = 40                                                  # out of range: NaN, not a crash
    assert torch.isnan(lm_head_op.lm_head_loss(x, w, t))


def test_custom_op_path_equals_eager_path_and_compiles(fake_ext):
    x, w, t = make_inputs(150, 24, 40)
    eager = lm_head_op.lm_head_loss(x, w, t)
    e_grads = torch.autograd.grad(eager, (x, w))
    loss, _, _ = lm_head_op.lm_head_loss_op(x, w, t, False, True)
    c_grads = torch.autograd.grad(loss, (x, w))
    assert torch.equal(loss, eager) and all(torch.equal(a, b) for a, b in zip(c_grads, e_grads))

    compiled = torch.compile(lm_head_op.lm_head_loss, backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    try:
        loss = compiled(x, w, t)
        grads = torch.autograd.grad(loss, (x, w))
    finally:
        torch._dynamo.reset()
    assert torch.equal(loss, eager) and all(torch.equal(a, b) for a, b in zip(grads, e_grads))


def test_opcheck(fake_ext):
    x, w, t = make_inputs(70, 24, 40)
    for need_grad in (True, False):
        torch.library.opcheck(lm_head_op.lm_head_loss_op, (x, w, t, False, need_grad),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_model_on_fake_tk_path_matches_torch(fake_ext, monkeypatch):
    monkeypatch.setattr(lm_head_op.checks, "on_kernel_device", lambda t: True)
    monkeypatch.setattr(lm_head_op, "_build_reason", lambda: None)
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=40, n_layer=1, n_head=2, n_embd=32))
    idx, t = torch.randint(40, (3, 32)), torch.randint(40, (3, 32))
    t[1, 3:9] = -1
    results = {}
    for choice in ("torch", "tk"):
        kernels.configure("torch", lm_head=choice)
        m.zero_grad()
        _, loss = m(idx, t)
        loss.backward()
        results[choice] = loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}
    assert rel_err(results["tk"][0], results["torch"][0]) < 1e-5
    for n, g in results["torch"][1].items():
        assert rel_err(results["tk"][1][n], g) < 1e-4, n
    assert kernels.used()["lm_head"] == "tk+torch"


# ---- GPU: the kernel alone --------------------------------------------------------------------

def _ext():
    reason = lm_head_op._ext.why_not()
    assert reason is None, reason
    return lm_head_op._ext.module


KERNELS = ("registers", "shared", "streamed", "warp")


def expected_plan(V, dtype, kernel):
    """What the launcher runs (cross_entropy.cu): rows_in_registers needs 16-byte aligned rows of
    at most 16 chunks a thread, rows_in_shared aligned rows that fit in 227 KB (the H200's
    opt-in shared memory per block, less 64 bytes), rows_per_warp at most 1024 columns,
    rows_streamed anything; "auto" is rows_in_registers where it can, else rows_streamed, and a
    requested kernel that cannot take the rows gives auto's choice."""
    per_chunk = 16 // (2 if dtype == torch.bfloat16 else 4)
    aligned = V % per_chunk == 0
    fits_shared = aligned and V * (16 // per_chunk) <= 232448 - 64
    vecs = next((v for v in (1, 2, 4, 8, 16) if aligned and -(-V // per_chunk) <= 512 * v), None)
    auto = f"registers(VECS={vecs})" if vecs else "streamed"
    if kernel == "streamed":
        return "streamed"
    if kernel == "shared" and fits_shared:
        return "shared"
    if kernel == "warp" and V <= lm_head_op.NARROW_COLS:
        return "warp"
    return auto


@gpu
@pytest.mark.parametrize("V", [5, 65, 300, 1000, 1003, 50304, 70000])   # rows_per_warp: 2, 4, 16, 32 a lane
@pytest.mark.parametrize("N", [1, 17, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_loss_and_gradient_vs_float64(N, V, dtype):
    if N * V > 20_000_000 and dtype == torch.float32:
        pytest.skip("covered by the bf16 case")
    ext = _ext()
    gen = torch.Generator(device="cuda").manual_seed(N * V)
    source = (torch.randn(N, V, device="cuda", generator=gen) * 3).to(dtype)
    targets = torch.randint(0, V, (N,), device="cuda", generator=gen)
    targets[1::7] = -1
    if N == 1:
        targets[0] = V - 1
    n_valid = int((targets != -1).sum())
    grad_scale = torch.tensor([1.0 / n_valid], device="cuda")
    l64 = source.double()
    lse = torch.logsumexp(l64, 1)
    valid = targets != -1
    ref_loss = torch.where(valid, lse - l64.gather(1, targets.clamp_min(0)[:, None])[:, 0], 0.0)
    ref_grad = torch.softmax(l64, 1)
    ref_grad[valid.nonzero()[:, 0], targets[valid]] -= 1
    ref_grad = ref_grad * valid[:, None] / n_valid
    # each element within about one rounding of its own float64 value (bf16: unit roundoff 2^-8;
    # fp32: exp2f and the fp32 lse), not only on the norm. The absolute floor is for the target's
    # element, p - 1 with p near 1: in fp32 it cancels to a few ulps of 1.0 (the H200 measured
    # 3-6 ulps at V=5 in session 3's final call, over the old floor of 1e-9); 1e-6 is ~8 ulps
    floor = 1e-9 if dtype == torch.bfloat16 else 1e-6
    slack = ref_grad.abs() * (2**-7 if dtype == torch.bfloat16 else 1e-5) + floor / n_valid
    assert ext.plan(source) == expected_plan(V, dtype, "auto")

    tested = set()
    for kernel in KERNELS:
        plan = ext.plan(source, kernel)
        assert plan == expected_plan(V, dtype, kernel), kernel
        if plan in tested:   # fell back to a kernel this test already checked
            continue
        tested.add(plan)
        logits = source.clone()
        loss_rows = torch.full((N,), float("nan"), device="cuda")      # poison: every row must be written
        ext.cross_entropy_(logits, targets, loss_rows, grad_scale, True, kernel)
        torch.cuda.synchronize()
        assert rel_err(loss_rows, ref_loss) < 1e-5, plan
        assert (loss_rows[~valid] == 0).all(), plan
        tol = 8e-3 if dtype == torch.bfloat16 else 1e-5                # one rounding of each element
        assert rel_err(logits, ref_grad) < tol, plan
        assert not logits[~valid].any(), plan
        worst = ((logits.double() - ref_grad).abs() - slack).max().item()
        assert worst <= 0, (plan, worst)


@gpu
def test_kernel_plans():
    ext = _ext()
    z = lambda V, dt=torch.bfloat16: torch.zeros(4, V, device="cuda", dtype=dt)
    assert ext.plan(z(50304)) == "registers(VECS=16)" and ext.plan(z(50304), "shared") == "shared"
    assert ext.plan(z(1000), "registers") == "registers(VECS=1)" and ext.plan(z(1000), "warp") == "warp"
    assert ext.plan(z(65)) == "streamed" and ext.plan(z(65), "shared") == "streamed"   # not 16-byte rows
    assert ext.plan(z(65), "warp") == "warp" and ext.plan(z(1025), "warp") == "streamed"
    assert ext.plan(z(1003)) == "streamed"
    assert ext.plan(z(32768, torch.float32), "registers") == "registers(VECS=16)"
    assert ext.plan(z(50304, torch.float32)) == "streamed"
    assert ext.plan(z(50304, torch.float32), "shared") == "shared"      # 196 KB: one block per SM
    assert ext.plan(z(50304, torch.float32), "registers") == "streamed"
    assert ext.plan(z(120000), "shared") == "streamed"                  # 234 KB: too wide for shared
    with pytest.raises(ValueError, match="kernel must be 'auto'"):
        ext.plan(z(10), "fast")


@gpu
def test_kernel_loss_only_leaves_logits_and_marks_bad_targets():
    ext = _ext()
    logits = torch.randn(6, 1000, device="cuda").bfloat16()
    before = logits.clone()
    targets = torch.tensor([0, -1, 999, 1000, -2, 5], device="cuda")
    loss_rows = torch.full((6,), 7.0, device="cuda")
    ext.cross_entropy_(logits, targets, loss_rows, torch.ones(1, device="cuda"), False)
    torch.cuda.synchronize()
    assert torch.equal(logits, before)
    assert loss_rows[1] == 0 and torch.isnan(loss_rows[3]) and torch.isnan(loss_rows[4])
    assert torch.isfinite(loss_rows[[0, 2, 5]]).all()


# ---- GPU: the whole op ------------------------------------------------------------------------

def _op_errors(N, V, C=256, autocast=True, x_dtype=torch.bfloat16, seed=0):
    """(tk errors, torch errors) vs float64 for loss, dx, dW, on the same rounded inputs."""
    x, w, t = make_inputs(N, C, V, device="cuda", x_dtype=x_dtype, seed=seed)
    if N == 1:
        t[0] = 0
    ref = float64_reference(x, w, t)
    errors = {}
    for name, fn in (("tk", lm_head_op.lm_head_loss), ("torch", reference.lm_head_loss)):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = fn(x, w, t)
        dx, dw = torch.autograd.grad(loss, (x, w))
        assert dx.dtype == x.dtype and dw.dtype == w.dtype and loss.dtype == torch.float32
        errors[name] = [rel_err(a, b) for a, b in zip((loss, dx, dw), ref)]
    return errors


@gpu
@pytest.mark.parametrize("V", [65, 1000, 1003, 50304])
@pytest.mark.parametrize("N", [1, 17, 1000, 4097])
def test_op_vs_float64_under_autocast(N, V):
    errors = _op_errors(N, V)
    tk, torch_err = errors["tk"], errors["torch"]
    for name, e, e_ref in zip(("loss", "dx", "dW"), tk, torch_err):
        assert e < 2e-2, (name, errors)
        assert e <= 2 * e_ref + 2e-3, (name, errors)   # no worse than PyTorch's own bf16 path


@gpu
@pytest.mark.parametrize("N,V", [(17, 65), (1000, 65), (1025, 300), (1000, 1000), (4097, 50304)])
def test_op_with_requested_kernels(N, V, monkeypatch):
    """The op vs float64 with request_new_kernels: what a switch of lm_head_op's defaults would run."""
    request_new_kernels(monkeypatch)
    errors = _op_errors(N, V)
    for name, e, e_ref in zip(("loss", "dx", "dW"), errors["tk"], errors["torch"]):
        assert e < 2e-2 and e <= 2 * e_ref + 2e-3, (name, errors)


@gpu
def test_op_fp32_x_under_autocast_and_fp32_without():
    errors = _op_errors(1000, 1000, x_dtype=torch.float32)             # fp32 x (reference layernorm)
    assert max(errors["tk"]) < 2e-2, errors
    errors = _op_errors(1000, 1000, x_dtype=torch.float32, autocast=False)
    assert max(errors["tk"]) < 1e-2, errors                            # tf32 may be on


@gpu
def test_op_several_chunks(monkeypatch):
    monkeypatch.setattr(lm_head_op, "CHUNK_BYTES", 64 * 50304 * 2)     # 64-row chunks: 16 of them + 1 row
    errors = _op_errors(1025, 50304)
    assert max(errors["tk"]) < 2e-2 and errors["tk"][2] <= 2 * errors["torch"][2] + 2e-3, errors


@gpu
@pytest.mark.parametrize("logits_gemm", ["tk", "cublas"])   # the default since session 12, the opt-out
@pytest.mark.parametrize("N,V", [(1, 50304), (4097, 50304), (1000, 1008), (1000, 65)])
def test_op_with_logits_on_the_tk_gemm(N, V, logits_gemm, monkeypatch):
    """TK_LM_HEAD_LOGITS=tk (the default) and cublas: the op vs float64, and no worse than PyTorch's
    bf16 path, with each chunk's logits on the tk GEMM (V = 65: cuBLAS, the tk GEMM does not take
    it) or on cuBLAS."""
    monkeypatch.setattr(lm_head_op, "LOGITS_GEMM", logits_gemm)
    ran = collections.Counter()                                # the tk GEMM ran where it should (review R:
    real_matmul = lm_head_op.gemm.matmul                       # else cuBLAS alone would pass the bounds)
    monkeypatch.setattr(lm_head_op.gemm, "matmul", lambda *a, **k: (ran.update(["tk"]), real_matmul(*a, **k))[1])
    errors = _op_errors(N, V)
    assert (ran["tk"] > 0) == (logits_gemm == "tk" and V % 16 == 0), (V, dict(ran), lm_head_op.gemm.why_not())
    for name, e, e_ref in zip(("loss", "dx", "dW"), errors["tk"], errors["torch"]):
        assert e < 2e-2 and e <= 2 * e_ref + 2e-3, (name, errors)


@gpu
def test_op_no_grad_matches():
    x, w, t = make_inputs(777, 256, 50304, device="cuda", x_dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = lm_head_op.lm_head_loss(x, w, t)
    assert rel_err(loss, float64_reference(x, w, t)[0]) < 5e-3


@gpu
def test_op_under_cuda_graph_and_compile():
    x, w, t = make_inputs(1000, 256, 50304, device="cuda", x_dtype=torch.bfloat16)

    def step(x, w, t):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = lm_head_op.lm_head_loss(x, w, t)
        dx, dw = torch.autograd.grad(loss, (x, w))
        # detached: an autograd graph kept alive from the eager call (made on the default stream)
        # makes the captured backward sync with the default stream, which breaks the capture
        return loss.detach(), dx, dw

    expected = step(x, w, t)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(x, w, t)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(x, w, t)
    x2, w2, t2 = make_inputs(1000, 256, 50304, device="cuda", x_dtype=torch.bfloat16, seed=1)
    with torch.no_grad():
        x.copy_(x2), w.copy_(w2), t.copy_(t2)
    graph.replay()
    torch.cuda.synchronize()
    ref = float64_reference(x, w, t)
    assert all(rel_err(a, b) < 2e-2 for a, b in zip(out, ref))
    assert not torch.equal(out[0], expected[0])                        # the replay saw the new inputs

    def loss_fn(x, w, t):   # torch.compile around the forward; autograd.grad stays outside
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return lm_head_op.lm_head_loss(x, w, t)

    torch._dynamo.reset()
    try:
        loss = torch.compile(loss_fn, fullgraph=True)(x, w, t)
        got = (loss, *torch.autograd.grad(loss, (x, w)))
    finally:
        torch._dynamo.reset()
    assert all(rel_err(a, b) < 2e-2 for a, b in zip(got, ref))


@gpu
@pytest.mark.parametrize("requested", [False, True])   # True: KERNEL_WIDE/NARROW = shared/warp
@pytest.mark.parametrize("vocab", [65, 50304])
def test_model_loss_and_grads_tk_vs_torch(vocab, requested, monkeypatch):
    if requested:
        request_new_kernels(monkeypatch)
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=128, vocab_size=vocab, n_layer=2, n_head=4, n_embd=256)
    model = GPT(cfg).cuda()
    idx = torch.randint(vocab, (4, 128), device="cuda")
    targets = torch.randint(vocab, (4, 128), device="cuda")
    targets[0, :17] = -1
    results = {}
    for choice in ("torch", "tk"):
        kernels.configure("torch", lm_head=choice)
        kernels.reset_used()
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(idx, targets)
        loss.backward()
        assert kernels.used()["lm_head"] == choice
        results[choice] = loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    assert rel_err(results["tk"][0], results["torch"][0]) < 2e-3
    for name, g in results["torch"][1].items():
        assert rel_err(results["tk"][1][name], g) < 3e-2, name


# Last in the file: a C++ error that crashed the process (kernels/bindings_checks.h) would
# then take no other test with it.
@gpu
def test_kernel_bad_arguments_raise():
    ext = _ext()
    logits = torch.randn(4, 10, device="cuda")
    t, lr, gs = torch.zeros(4, dtype=torch.long, device="cuda"), torch.empty(4, device="cuda"), torch.ones(1, device="cuda")
    with pytest.raises(TypeError, match="targets must be Long"):
        ext.cross_entropy_(logits, t.int(), lr, gs, True)
    with pytest.raises(ValueError, match="loss_rows must have 4 elements"):
        ext.cross_entropy_(logits, t, lr[:3], gs, True)
    with pytest.raises(ValueError, match="logits must be a CUDA tensor"):
        ext.cross_entropy_(logits.cpu(), t, lr, gs, True)
    with pytest.raises(ValueError, match="kernel must be 'auto'"):
        ext.cross_entropy_(logits, t, lr, gs, True, "fast")

    assert "grad_scale" in ext.check_cross_entropy(logits, t, lr, torch.ones(2, device="cuda"))

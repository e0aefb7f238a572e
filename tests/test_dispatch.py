"""CPU tests of the kernels switch: choices, per-op overrides, auto's fallback and its one-line log,
tk's clear errors, preflight, import-failure reporting and the build helpers. No GPU needed."""
import os
import re
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import kernels  # noqa: E402
from kernels import build, reference  # noqa: E402


@pytest.fixture(autouse=True)
def clean_switch():
    """Every test starts from kernels=auto with nothing used or logged, and leaves it so."""
    kernels.configure("auto")
    kernels.reset_used()
    kernels._logged.clear()
    yield
    kernels.configure("auto")
    kernels.reset_used()
    kernels._logged.clear()


def ln_inputs(cols=128, rows=6, device="cpu"):
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(rows, cols, generator=g).to(device)
    r = torch.randn(rows, cols, generator=g).to(device)
    w = torch.randn(cols, generator=g).to(device)
    b = torch.randn(cols, generator=g).to(device)
    return x, r, w, b


@pytest.fixture
def fake_tk(monkeypatch):
    """A stand-in tk layernorm that runs on CPU for hidden size 64 only, so dispatch can be tested
    without CUDA. It returns the reference's result scaled by 2 so we can see which one ran."""
    calls = []

    def impl(x, residual, weight, bias, eps=1e-5):
        calls.append(x.shape)
        y, h = reference.add_layernorm(x, residual, weight, bias, eps)
        return 2 * y, h

    def why_not(x, residual, weight, bias, eps=1e-5):
        return None if x.shape[-1] == 64 else f"hidden size {x.shape[-1]} is not 64"

    monkeypatch.setitem(kernels._tk_impls, "layernorm", (impl, why_not))
    return calls


# ---- configure ---------------------------------------------------------------------------

def test_configure_sets_global_and_per_op_choices():
    assert kernels.configure("torch") == {"attention": "torch", "layernorm": "torch", "mlp": "torch", "lm_head": "torch",
                                          "linear": "torch"}
    assert kernels.configure("torch", layernorm="tk") == {"attention": "torch", "layernorm": "tk", "mlp": "torch",
                                                          "lm_head": "torch", "linear": "torch"}
    assert kernels.configure("tk", attention="auto", mlp="torch") == {"attention": "auto", "layernorm": "tk",
                                                                      "mlp": "torch", "lm_head": "tk", "linear": "tk"}
    assert kernels.configure("torch", linear="tk")["linear"] == "tk"
    assert kernels.choice()["mlp"] == "torch"


@pytest.mark.parametrize("kwargs, name", [
    (dict(kernels="gpu"), "kernels='gpu'"),
    (dict(kernels=""), "kernels=''"),
    (dict(layernorm="fast"), "kernels_layernorm='fast'"),
    (dict(attention="TK"), "kernels_attention='TK'"),
])
def test_configure_refuses_bad_values(kwargs, name):
    before = kernels.choice()
    with pytest.raises(ValueError) as e:
        kernels.configure(**kwargs)
    assert name in str(e.value) and "auto | tk | torch" in str(e.value)
    assert kernels.choice() == before   # a refused call changes nothing


# ---- dispatch ----------------------------------------------------------------------------

def test_torch_choice_never_calls_tk(fake_tk):
    kernels.configure("torch")
    x, r, w, b = ln_inputs(64)
    y, h = kernels.add_layernorm(x, r, w, b)
    torch.testing.assert_close(y, reference.add_layernorm(x, r, w, b)[0])
    assert fake_tk == [] and kernels.used()["layernorm"] == "torch"


def test_auto_uses_tk_where_supported_and_falls_back_with_one_line(fake_tk, capsys):
    x64, r64, w64, b64 = ln_inputs(64)
    y, _ = kernels.add_layernorm(x64, r64, w64, b64)
    torch.testing.assert_close(y, 2 * reference.add_layernorm(x64, r64, w64, b64)[0])   # tk ran
    assert kernels.used()["layernorm"] == "tk"
    assert capsys.readouterr().out == ""

    x, r, w, b = ln_inputs(128)
    for _ in range(3):                                   # same reason three times: logged once
        y, _ = kernels.add_layernorm(x, r, w, b)
    torch.testing.assert_close(y, reference.add_layernorm(x, r, w, b)[0])
    out = capsys.readouterr().out.splitlines()
    assert out == ["kernels: layernorm falls back to torch (hidden size 128 is not 64)"]
    assert kernels.used()["layernorm"] == "tk+torch"

    x, r, w, b = ln_inputs(192)                          # a new reason gets its own line
    kernels.add_layernorm(x, r, w, b)
    kernels.add_layernorm(x, r, w, b)
    assert capsys.readouterr().out.splitlines() == ["kernels: layernorm falls back to torch (hidden size 192 is not 64)"]
    kernels.reset_used()
    assert kernels.used() == {"attention": "unused", "layernorm": "unused", "mlp": "unused", "lm_head": "unused",
                              "linear": "unused"}


def test_tk_choice_raises_naming_op_reason_and_fallback(fake_tk):
    kernels.configure("auto", layernorm="tk")
    x, r, w, b = ln_inputs(128)
    with pytest.raises(kernels.KernelUnavailable) as e:
        kernels.add_layernorm(x, r, w, b)
    msg = str(e.value)
    assert "kernels_layernorm=tk" in msg and "hidden size 128 is not 64" in msg and "--kernels_layernorm=torch" in msg
    assert kernels.used()["layernorm"] == "unused"       # nothing ran
    kernels.add_layernorm(*ln_inputs(64))                # a supported call still runs tk
    assert kernels.used()["layernorm"] == "tk"


def test_per_op_override_beats_global(fake_tk, capsys):
    kernels.configure("torch", layernorm="auto")
    kernels.add_layernorm(*ln_inputs(64))
    assert kernels.used()["layernorm"] == "tk"
    kernels.configure("tk", layernorm="torch")
    kernels.add_layernorm(*ln_inputs(64))
    assert len(fake_tk) == 1 and kernels.used()["layernorm"] == "tk+torch"


# ---- the real layernorm module on CPU ------------------------------------------------------

def test_layernorm_module_is_registered_and_imports_without_building():
    from kernels import layernorm
    assert "layernorm" in kernels._tk_impls
    assert kernels._tk_impls["layernorm"][1] is layernorm.why_not
    # In a fresh process: in this one an earlier test on a GPU machine may have loaded it already.
    check = ("import kernels; from kernels import layernorm; "
             "assert layernorm._ext._module is None, 'importing kernels.layernorm loaded the extension'; "
             "print(layernorm._ext.state())")
    run = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    if not torch.cuda.is_available():
        assert run.stdout.strip() in ("not built yet", "built, not loaded yet")


def test_real_tk_layernorm_on_cpu_is_a_clear_error_and_auto_falls_back(capsys):
    from kernels import layernorm
    x, r, w, b = ln_inputs(128)
    kernels.configure("tk")
    with pytest.raises(kernels.KernelUnavailable) as e:
        kernels.add_layernorm(x, r, w, b)
    assert "x is on cpu" in str(e.value) and "--kernels_layernorm=torch" in str(e.value)
    kernels.configure("auto")
    y, h = kernels.add_layernorm(x, r, w, b)
    ry, rh = reference.add_layernorm(x, r, w, b)
    torch.testing.assert_close(y, ry)
    torch.testing.assert_close(h, rh)
    assert "layernorm falls back to torch (x is on cpu" in capsys.readouterr().out
    assert layernorm._ext._error is None   # CPU calls never try to build


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-side reasons")
def test_layernorm_why_not_reasons_on_cpu():
    from kernels.layernorm import why_not
    x, r, w, b = ln_inputs(128)
    assert "x is on cpu" in why_not(x, r, w, b)
    meta = dict(device="meta")
    xm, rm = torch.empty(4, 100, **meta), torch.empty(4, 100, **meta)
    assert why_not(xm, rm, w, b).startswith("x is on meta")


def test_reference_add_layernorm_without_residual_returns_x_itself():
    x, _, w, b = ln_inputs(64)
    y, h = reference.add_layernorm(x, None, w, b)
    assert h is x
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (64,), w, b))


# ---- preflight ---------------------------------------------------------------------------

def test_preflight_on_cpu(capsys):
    plan = kernels.preflight(4, 32, 128, 4, torch.float32, "cpu")
    assert plan == {"attention": "torch", "layernorm": "torch", "mlp": "torch", "lm_head": "torch", "linear": "torch"}
    out = capsys.readouterr().out
    assert "layernorm falls back to torch (device=cpu; the tk kernel needs CUDA)" in out
    kernels.configure("auto", layernorm="tk")
    with pytest.raises(kernels.KernelUnavailable) as e:
        kernels.preflight(4, 32, 128, 4, torch.float32, "cpu")
    assert "kernels_layernorm=tk" in str(e.value) and "device=cpu" in str(e.value)
    kernels.configure("torch")
    assert kernels.preflight(4, 32, 128, 4, torch.float32, "cpu") == {op: "torch" for op in kernels.OPS}


def test_layernorm_preflight_refuses_unsupported_width():
    from kernels.layernorm import preflight
    assert "n_embd=100" in preflight(batch_size=2, block_size=8, n_embd=100, device="cuda")
    assert "n_embd=8192" in preflight(batch_size=2, block_size=8, n_embd=8192, device="cuda")


# ---- import failures of op modules are reported, not swallowed ------------------------------

def test_failed_op_module_import_is_named_in_the_reason(monkeypatch):
    monkeypatch.setitem(kernels._import_errors, "mlp_op", "SyntaxError: invalid syntax (mlp_op.py, line 3)")
    monkeypatch.delitem(kernels._tk_impls, "mlp", raising=False)
    reason = kernels.why_not_tk("mlp")
    assert "kernels/mlp_op.py failed to import (SyntaxError" in reason
    assert "mlp_op.py" not in kernels._missing_reason("attention")   # only the op's own module


def test_broken_op_module_prints_a_warning_and_other_ops_still_work(tmp_path):
    # A copy of the package with a broken mlp_op.py: importing it warns on stderr, names the file
    # and the error, and layernorm still registers.
    import shutil
    pkg = tmp_path / "kernels"
    shutil.copytree(os.path.join(REPO, "kernels"), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "mlp_op.py").write_text("raise ImportError('planted failure')\n")
    code = ("import kernels; print(sorted(kernels._tk_impls)); print(kernels._import_errors);"
            "print(kernels._missing_reason('mlp'))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "kernels/mlp_op.py failed to import" in res.stderr and "planted failure" in res.stderr
    assert "'layernorm'" in res.stdout.splitlines()[0]
    assert "planted failure" in res.stdout.splitlines()[-1]


# ---- build helpers -------------------------------------------------------------------------

NINJA_LOG = """[1/3] c++ -MMD -MF layernorm_bindings.o.d -DTORCH_EXTENSION_NAME=tk_layernorm ... (long)
[2/3] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile ... -c layernorm.cu -o layernorm.cuda.o
FAILED: layernorm.cuda.o
/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -I/a -I/b -I/c ... (very long)
/work/main/kernels/layernorm.cu(120): error: identifier "chunk32" is undefined
          chunk32<T> v;
          ^
1 error detected in the compilation of "/work/main/kernels/layernorm.cu".
ninja: build stopped: subcommand failed.
"""


def test_compiler_errors_keeps_the_error_and_drops_command_lines():
    text = build.compiler_errors(NINJA_LOG)
    assert 'layernorm.cu(120): error: identifier "chunk32" is undefined' in text
    assert "chunk32<T> v;" in text and "FAILED: layernorm.cuda.o" in text
    assert "--generate-dependencies-with-compile" not in text


def test_lazy_extension_without_cuda_does_not_build():
    ext = build.LazyExtension("tk_test_never_built", ["nothing.cu"])
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    assert ext.why_not() == "no CUDA device is available"
    assert ext._error is None and ext.state() == "not built yet"
    with pytest.raises(build.KernelBuildError):
        ext.module


def test_python_m_kernels_prints_a_status_table():
    res = subprocess.run([sys.executable, "-m", "kernels", "--no-build"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "GPU" in out and "layernorm" in out and "attention" in out and "mlp" in out
    if not torch.cuda.is_available():
        assert "no CUDA" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this would really build every extension")
def test_python_m_kernels_build_reports_every_extension():
    # `python -m kernels --build` (what the GPU scripts run first): one process per extension,
    # one line each, a summary, exit 1 when any failed (here: no CUDA device, nothing compiled).
    res = subprocess.run([sys.executable, "-m", "kernels", "--build"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    names = ("tk_attention", "tk_attention_hopper", "tk_gemm", "tk_layernorm", "tk_mlp", "tk_lm_head")
    for name in names:
        assert f"build {name}: FAILED: no CUDA device is available" in res.stdout
    built = re.search(r"built 0 of (\d+) extensions", res.stdout)
    assert built and int(built.group(1)) == res.stdout.count(": FAILED: no CUDA device is available") >= len(names)
    bad = subprocess.run([sys.executable, "-m", "kernels", "--build", "tk_layernorm", "tk_nope"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown extension tk_nope" in bad.stderr and "Traceback" not in bad.stderr


def test_prepare_for_compile_registers_a_fallback_for_every_tk_op():
    """torch 2.11's inductor stalls formatting a custom op's arguments before it creates the op's
    fallback itself (kernels.prepare_for_compile's docstring): every tk:: op must be in inductor's
    lowerings afterwards, with the layout constraint inductor would have chosen, and a second
    call registers nothing."""
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag
    kernels.prepare_for_compile()
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("tk::")]
    assert {"tk::attention_qkv_fwd", "tk::add_layernorm_fwd", "tk::mlp_fwd", "tk::lm_head_loss"} <= set(names)
    for name in names:
        op = getattr(torch.ops.tk, name[len("tk::"):]).default
        assert op in lowering.lowerings, name
        expected = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        assert lowering.maybe_layout_constraints(op) is expected, name
    assert kernels.prepare_for_compile() == []

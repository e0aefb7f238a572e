"""bench.py's attention rows (kernels/attention_bench.py) on the CPU: the registry entry, the shapes
and counted flops, the inputs as model.py makes them, implementations that cannot run here left
out with their reason, bad names refused, and the ratio report. The H200 figures themselves are
not tested here (no timing in pytest): tests/gpu_attention_bench.sh runs them."""
import json
import math

import pytest
import torch

import bench
import kernels
from conftest import rel_err, run_script
from kernels import attention_bench as ab


def png_ok(path):
    with open(path, "rb") as f:
        data = f.read()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_registry_lists_attention():
    assert "attention" in bench.REGISTRY
    assert bench.REGISTRY["attention"] is bench.attention_cases


def test_bad_op_name_is_refused_with_attention_listed(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # reach the op-name check on the CPU
    assert bench.main(["--ops", "attn", "--json", ""]) == 2
    err = capsys.readouterr().err
    assert "unknown op(s) ['attn']" in err and "'attention'" in err


def test_issue_shapes_and_flops():
    assert ab.SHAPES["gpt2"] == (16, 12, 1024, 64)
    assert ab.SHAPES["shakespeare-char"] == (64, 6, 256, 64)
    assert ab.SHAPES["t4096-d128"] == (4, 16, 4096, 128)
    # 4·B·H·T²·D / 2 for a causal forward, worked out by hand; forward+backward is 3.5x
    assert ab.flops(16, 12, 1024, 64, "fwd") == 25_769_803_776
    assert ab.flops(64, 6, 256, 64, "fwd") == 3_221_225_472
    assert ab.flops(4, 16, 4096, 128, "fwd") == 274_877_906_944
    assert ab.flops(16, 12, 1024, 64, "fwd+bwd") == 3.5 * 25_769_803_776
    # issue 5's cuDNN forward figure at the GPT-2 shape, 195 TFLOP/s, is 0.132 ms per call
    assert ab.flops(*ab.SHAPES["gpt2"], "fwd") / 195e12 * 1e3 == pytest.approx(0.1322, abs=1e-4)
    with pytest.raises(ValueError, match="direction must be one of fwd, fwd[+]bwd; got 'bwd'"):
        ab.flops(1, 1, 1, 64, "bwd")


def test_plan_full_and_quick():
    full = ab.plan(quick=False)
    assert [(name, d) for name, _, d in full] == [(s, d) for s in ab.SHAPES for d in ("fwd", "fwd+bwd")]
    quick = ab.plan(quick=True)
    # exactly the rows issue 5's "done when" names
    assert [(name, d) for name, _, d in quick] == [("gpt2", "fwd"), ("gpt2", "fwd+bwd"),
                                                    ("shakespeare-char", "fwd+bwd"), ("t4096-d128", "fwd+bwd")]


def test_environment_narrows_the_run(monkeypatch):
    monkeypatch.setenv("TK_BENCH_ATTENTION_SHAPES", "t4096-d128, gpt2")
    assert [(n, d) for n, _, d in ab.plan(quick=False)] == [("t4096-d128", "fwd"), ("t4096-d128", "fwd+bwd"),
                                                             ("gpt2", "fwd"), ("gpt2", "fwd+bwd")]
    monkeypatch.setenv("TK_BENCH_ATTENTION_IMPLS", "tk,sdpa-cudnn")
    assert ab.selected("TK_BENCH_ATTENTION_IMPLS", ab.IMPLS) == ["tk", "sdpa-cudnn"]


def test_hopper_variant_rows_only_when_named(monkeypatch):
    from kernels import attention_hopper
    assert [f"tk-hopper-v{n}" for n in sorted(attention_hopper.VARIANTS) if n] == list(ab.HOPPER_VARIANT_IMPLS)
    monkeypatch.delenv("TK_BENCH_ATTENTION_IMPLS", raising=False)
    assert ab.selected("TK_BENCH_ATTENTION_IMPLS", ab.IMPLS, ab.HOPPER_VARIANT_IMPLS) == list(ab.IMPLS)
    monkeypatch.setenv("TK_BENCH_ATTENTION_IMPLS", "tk-hopper-v8,sdpa-cudnn")
    assert ab.selected("TK_BENCH_ATTENTION_IMPLS", ab.IMPLS, ab.HOPPER_VARIANT_IMPLS) == ["tk-hopper-v8", "sdpa-cudnn"]
    assert set(ab.HOPPER_VARIANT_IMPLS) <= set(ab.FORWARD_ONLY)
    assert set(ab.HOPPER_VARIANT_IMPLS) <= set(ab.implementations())


def test_hopper_forward_variant_setter():
    from kernels import attention_hopper
    old = attention_hopper.set_forward_variant(8)
    try:
        assert attention_hopper.OP_FORWARD_VARIANT == 8
        with pytest.raises(ValueError, match="variant must be one of"):
            attention_hopper.set_forward_variant(99)
    finally:
        attention_hopper.set_forward_variant(old)
    assert attention_hopper.OP_FORWARD_VARIANT == old


@pytest.mark.parametrize("variable, value, bad", [("TK_BENCH_ATTENTION_SHAPES", "gpt2,gpt3", "'gpt3'"),
                                                  ("TK_BENCH_ATTENTION_IMPLS", "tk,sdpa-fa3", "'sdpa-fa3'")])
def test_bad_names_are_refused(monkeypatch, variable, value, bad):
    monkeypatch.setenv(variable, value)
    before = kernels.choice()   # whatever earlier tests left: the refused call must not change it
    with pytest.raises(ValueError) as e:
        next(ab.cases(bench.Case, quick=False, device="cpu"))
    message = str(e.value)
    assert message.startswith(f"{variable}: unknown name(s) {bad};") and "choose from" in message
    assert ("sdpa-cudnn" if "IMPLS" in variable else "shakespeare-char") in message   # lists the good names
    assert kernels.choice() == before


def test_inputs_as_the_model_makes_them():
    B, H, T, D = 2, 3, 17, 64
    qkv, dy = ab.make_inputs(B, H, T, D, device="cpu")
    assert qkv.shape == (B, T, 3, H, D) and qkv.is_contiguous() and qkv.requires_grad
    assert dy.shape == (B, T, H, D) and dy.is_contiguous() and not dy.requires_grad
    for t in (qkv, dy):
        assert t.dtype == torch.bfloat16
        assert torch.isfinite(t).all() and 0.5 < t.float().std() < 2.0   # random, never zeros
    # the SDPA rows see c_attn's (B, T, 3, H, D) output as (B, H, T, D) views: no copies
    q, k, v = ab.split_qkv(qkv)
    assert q.shape == (B, H, T, D)
    assert q.stride() == k.stride() == v.stride() == (T * 3 * H * D, D, 3 * H * D, 1)
    assert k.data_ptr() - q.data_ptr() == v.data_ptr() - k.data_ptr() == H * D * 2
    assert q.data_ptr() == qkv.data_ptr()
    assert torch.equal(k[1, 2, 5], qkv[1, 5, 1, 2])


def causal_reference(qkv):
    """y (B, T, H, D) in float64 from qkv (B, T, 3, H, D)."""
    q, k, v = (t.double() for t in ab.split_qkv(qkv))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    T = q.shape[2]
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def test_cases_on_cpu_keep_what_runs_and_skip_the_rest_with_reasons(monkeypatch, capsys):
    monkeypatch.setattr(ab, "SHAPES", {"odd": (1, 3, 33, 64), "d128": (2, 2, 17, 128)})
    before = kernels.choice()
    gen = ab.cases(bench.Case, quick=False, device="cpu")
    cases = []
    for case in gen:
        assert kernels.choice()["attention"] == "tk"    # 'tk' measures the model's path with the switch on tk
        cases.append(case)
    assert kernels.choice() == before                  # and the switch is put back afterwards
    assert [c.name for c in cases] == ["fwd 1x3x33x64", "fwd+bwd 1x3x33x64", "fwd 2x2x17x128", "fwd+bwd 2x2x17x128"]
    for case in cases:
        B, H, T, D = map(int, case.name.split()[1].split("x"))
        direction = case.name.split()[0]
        assert case.op == "attention" and case.unit == "TFLOP/s" and case.compile is False
        assert case.work == 4 * B * H * T * T * D / 2 * (3.5 if direction == "fwd+bwd" else 1)
        # on the CPU: SDPA's flash backend and the reference run; tk (all three) and the CUDA-only
        # SDPA backends are left out, each with its reason in the note
        assert list(case.impls) == ["eager", "sdpa-flash"]
        note = case.note
        assert note.startswith(("odd; causal, bf16, d(qkv) of (B,T,3,H,D)", "d128; causal"))
        assert "skipped tk: KernelUnavailable" in note and "CUDA" in note
        assert "skipped sdpa-cudnn: RuntimeError: No viable backend" in note
        assert "skipped sdpa-efficient: RuntimeError" in note
        if torch.cuda.is_available():   # a GPU machine: the CPU tensors are refused by the input checks
            assert "skipped tk-portable: ValueError: tk attention: q must be a CUDA tensor" in note
            if direction == "fwd":   # tk-hopper is a forward-only row (attention_bench.FORWARD_ONLY)
                assert "skipped tk-hopper: ValueError: tk Hopper attention: q must be a CUDA tensor" in note
            else:
                assert "tk-hopper" not in note
        else:                           # no CUDA: the backend's availability check says so first
            assert "skipped tk-portable: RuntimeError: tk attention cannot run here: portable: no CUDA device" in note
            assert ("skipped tk-hopper: RuntimeError" in note) == (direction == "fwd")
        # what runs was checked against eager (sdpa-flash here), and agreed
        checked = "y checked" if direction == "fwd" else "y and d(qkv) checked"
        err = float(note.split(f"; {checked} against eager: max rel err ")[1].split(";")[0])
        assert 0 <= err < ab.MISMATCH and "MISMATCH" not in note   # on the CPU both are the flash kernel
        # the implementations left in compute causal attention on the inputs as made, y (B, T, H, D)
        qkv, dy = case.make_inputs()
        expected = causal_reference(qkv)
        for name, attend in case.impls.items():
            assert rel_err(attend(qkv), expected) < 1e-2, name
        full = torch.nn.functional.scaled_dot_product_attention(*(t.double() for t in ab.split_qkv(qkv)))
        assert rel_err(full.transpose(1, 2), expected) > 0.1   # so the check above can tell causal from not
        # fwd+bwd: the gradient of qkv, as the SDPA reference gives it
        y = causal_reference(qkv)
        (expected_grad,) = torch.autograd.grad(y, qkv, dy.double())
        for name, attend in case.impls.items():
            case.step(attend, (qkv, dy))
            (grad,) = torch.autograd.grad(attend(qkv), qkv, dy)
            assert grad.shape == qkv.shape and rel_err(grad, expected_grad) < 2e-2, name
        assert qkv.grad is None                         # gradients returned, never accumulated
    printed = capsys.readouterr().out
    assert "  attention fwd 1x3x33x64: sdpa-cudnn skipped: RuntimeError: No viable backend" in printed


def test_why_not_run_reports_error_and_warnings():
    import warnings

    def refuses(qkv):
        warnings.warn("Flash attention requires q, k, v to be on CUDA\nsecond line not kept")
        warnings.warn("Flash attention requires q, k, v to be on CUDA")   # repeated: once
        raise RuntimeError("No available kernel. Aborting execution.\nmore")

    inputs = ab.make_inputs(1, 1, 5, 64, device="cpu")
    reason = ab.why_not_run(ab.forward_step, refuses, inputs)
    assert reason == ("RuntimeError: No available kernel. Aborting execution. | "
                      "Flash attention requires q, k, v to be on CUDA")
    assert ab.why_not_run(ab.forward_backward_step, lambda qkv: qkv.sum(2) * 2, inputs) is None


def fake_row(case, ms, ms_no_graph=None, note="gpt2; causal, bf16", errors=None, work=2.576e10):
    row = {"op": "attention", "case": case, "unit": "TFLOP/s", "work": work, "note": note,
           "ms": ms, "ms_no_graph": ms_no_graph or dict(ms)}
    if errors:
        row["errors"] = errors
    return row


def test_ratios_to_cudnn_and_best_sdpa():
    row = fake_row("fwd 16x12x1024x64", {"tk": 0.10, "sdpa-flash": 0.20, "sdpa-cudnn": 0.125,
                                         "sdpa-efficient": 0.40, "eager": 0.11})
    by_impl, best = ab.ratios(row)
    assert best == "sdpa-cudnn"                          # 'eager' is not a forced backend
    rate, vs_cudnn, vs_best = by_impl["tk"]
    assert rate == pytest.approx(257.6) and vs_cudnn == pytest.approx(1.25) and vs_best == pytest.approx(1.25)
    assert by_impl["sdpa-flash"][1] == pytest.approx(0.625)
    assert list(by_impl) == ["tk", "eager", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]
    # cuDNN refused this shape: no ratio to it, the best of the others instead
    row = fake_row("fwd+bwd 4x16x4096x128", {"tk-portable": 2.0, "sdpa-flash": 1.0, "sdpa-efficient": 4.0})
    by_impl, best = ab.ratios(row)
    assert best == "sdpa-flash" and by_impl["tk-portable"][1] is None
    assert by_impl["tk-portable"][2] == pytest.approx(0.5)
    assert ab.ratios(fake_row("fwd 1x1x1x64", {"tk": 1.0}))[0]["tk"][1:] == (None, None)


def test_report_and_png_from_bench_json(tmp_path):
    note = ("gpt2; causal, bf16, d(qkv) of (B,T,3,H,D); tk = kernels.attention_qkv, hopper fwd + portable bwd"
            "; y checked against eager: max rel err 3.0e-03; MISMATCH tk-hopper: rel err 5.0e-01"
            "; skipped sdpa-efficient: RuntimeError: No available kernel. | head_dim; too big")
    rows = [fake_row("fwd 16x12x1024x64", {"tk": 0.10, "tk-hopper": 0.1, "sdpa-cudnn": 0.125}, note=note),
            fake_row("fwd+bwd 16x12x1024x64", {"tk": 0.5, "sdpa-flash": 0.4}, {"tk": 0.6, "sdpa-flash": 0.5},
                     errors={"sdpa-cudnn (ms)": "RuntimeError: capture failed"}),
            {"op": "layernorm", "case": "fwd 16384x768 bf16", "unit": "TB/s", "work": 1e8, "note": "",
             "ms": {"tk": 0.05}, "ms_no_graph": {"tk": 0.06}}]
    path = tmp_path / "attention.json"
    path.write_text(json.dumps({"environment": {"gpu": "test GPU", "torch": "x"}, "args": {}, "results": rows}))
    png = tmp_path / "bars.png"
    result = run_script("-m", "kernels.attention_bench", str(path), "--png", str(png), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.startswith("test GPU, torch x")
    graph = out[out.index("CUDA-graph replay"):out.index("launched from Python")]
    assert "fwd 16x12x1024x64      gpt2              best SDPA: sdpa-cudnn" in graph
    tk_line = next(line for line in graph.splitlines() if line.strip().startswith("tk "))
    assert tk_line.split() == ["tk", "0.1000", "ms", "257.6", "TFLOP/s", "1.25x", "cudnn", "1.25x", "best"]
    assert "(tk = kernels.attention_qkv, hopper fwd + portable bwd)" in graph
    assert "(y checked against eager: max rel err 3.0e-03)" in graph
    assert "(MISMATCH tk-hopper: rel err 5.0e-01)" in graph
    assert "(skipped sdpa-efficient: RuntimeError: No available kernel. | head_dim; too big)" in graph
    assert "! sdpa-cudnn (ms): RuntimeError: capture failed" in graph
    assert "layernorm" not in out and "16384x768" not in out
    no_graph = out[out.index("launched from Python"):]
    line = next(l for l in no_graph.splitlines() if l.strip().startswith("tk ") and "0.6000" in l)
    assert line.split()[3:] == ["42.9", "TFLOP/s", "-", "cudnn", "0.83x", "best"]   # 2.576e10 / 0.6 ms; 0.5 / 0.6
    assert png_ok(png)


def test_report_refuses_a_missing_file(tmp_path):
    result = run_script("-m", "kernels.attention_bench", str(tmp_path / "none.json"), timeout=120)
    assert result.returncode == 1 and "error: cannot read" in result.stderr and "Traceback" not in result.stderr


def test_gpu_script_parses():
    import os
    import subprocess
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_attention_bench.sh")
    assert subprocess.run(["bash", "-n", script], capture_output=True).returncode == 0
    text = open(script).read()
    assert "bench.py --ops attention" in text and 'TORCH_EXTENSIONS_DIR' in text and "set -u" in text


def test_issue_targets_from_the_graph_figures():
    gpt2 = "gpt2; causal, bf16"
    rows = [fake_row("fwd 16x12x1024x64", {"tk-hopper": 0.10, "tk-portable": 0.21, "sdpa-cudnn": 0.12,
                                           "sdpa-flash": 0.20}, {"tk-hopper": 9.0, "sdpa-cudnn": 0.1}, note=gpt2),
            fake_row("fwd+bwd 16x12x1024x64", {"tk": 1.0, "sdpa-flash": 0.7}, note=gpt2),   # cuDNN refused
            fake_row("fwd+bwd 64x6x256x64", {"tk": 0.5, "sdpa-flash": 0.5, "sdpa-efficient": 0.6},
                     note="shakespeare-char; causal")]
    lines = ab.check_targets(rows)
    assert len(lines) == len(ab.TARGETS)
    status = {" ".join(l.split()[:5]): l.split()[5:] for l in lines}
    assert status["gpt2 fwd: tk-hopper >= 1.10x"] == ["sdpa-cudnn", "1.20x", "met"]   # 0.12 / 0.10, graph table
    assert status["gpt2 fwd: tk-hopper >= 1.35x"] == ["sdpa-cudnn", "1.20x", "NOT", "met",
                                                      "(stretch:", "FA3's", "level)"]
    assert status["gpt2 fwd: tk-portable >= 1.00x"] == ["sdpa-flash", "0.95x", "NOT", "met"]
    assert status["gpt2 fwd+bwd: tk >= 1.10x"] == ["sdpa-cudnn", "not", "measured", "(missing", "sdpa-cudnn)"]
    assert status["gpt2 fwd+bwd: tk-portable >= 1.00x"][2:] == ["measured", "(missing", "tk-portable)"]
    assert status["shakespeare-char fwd+bwd: tk >= 1.00x"] == ["best", "SDPA", "1.00x", "met"]   # best = flash
    assert status["t4096-d128 fwd+bwd: tk >= 0.90x"] == ["sdpa-cudnn", "not", "measured", "(no", "such", "row)"]


def test_tk_goes_through_the_entry_model_py_uses(monkeypatch):
    calls = []
    qkv, _ = ab.make_inputs(1, 2, 5, 64, device="cpu")
    # the packed entry (kernels.attention_qkv: qkv in, y (B, T, H, D) out) where it exists
    monkeypatch.setattr(kernels, "attention_qkv", lambda qkv, causal: calls.append(("qkv", causal)) or qkv.sum(2),
                        raising=False)
    assert ab.tk_entry() == "attention_qkv"
    assert ab.implementations()["tk"](qkv).shape == (1, 5, 2, 64) and calls == [("qkv", True)]
    # else kernels.attention on the (B, H, T, D) views, its output turned back to (B, T, H, D)
    monkeypatch.delattr(kernels, "attention_qkv")
    monkeypatch.setattr(kernels, "attention", lambda q, k, v, causal: calls.append(("views", q.stride(), causal)) or q)
    assert ab.tk_entry() == "attention"
    y = ab.implementations()["tk"](qkv)
    assert calls[-1] == ("views", (5 * 3 * 2 * 64, 64, 3 * 2 * 64, 1), True)
    assert y.shape == (1, 5, 2, 64) and torch.equal(y, qkv[:, :, 0])


def test_a_wrong_implementation_is_flagged_not_hidden(monkeypatch, capsys):
    monkeypatch.setattr(ab, "SHAPES", {"odd": (1, 2, 33, 64)})
    real = ab.implementations

    def with_a_wrong_one():   # 'sdpa-flash' planted without the causal mask
        table = real()
        table["sdpa-flash"] = ab.on_views(lambda q, k, v, causal:
                                          torch.nn.functional.scaled_dot_product_attention(q, k, v))
        return table
    monkeypatch.setattr(ab, "implementations", with_a_wrong_one)
    cases = list(ab.cases(bench.Case, quick=False, device="cpu"))
    assert len(cases) == 2
    for case in cases:
        assert "; MISMATCH sdpa-flash: rel err " in case.note
        assert "sdpa-flash" in case.impls                  # still timed, and flagged
    assert "attention fwd 1x2x33x64: MISMATCH against eager: sdpa-flash: rel err" in capsys.readouterr().out


def test_relative_error_refuses_non_finite():
    ref = [torch.ones(4)]
    assert ab.relative_error([torch.ones(4) * 1.01], ref) == pytest.approx(0.01, rel=1e-3)
    assert ab.relative_error([torch.tensor([1.0, float("nan"), 1.0, 1.0])], ref) == math.inf

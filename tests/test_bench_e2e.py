"""bench.py --e2e / --profile / --plot on the CPU (CI has no GPU): the tiny model, a few steps,
no torch.compile. The whole path runs as a user runs it (variant processes, table, JSON, PNG);
the H200 figures themselves are not tested here (no timing in pytest)."""
import json
import math

import pytest

from conftest import run_script
from kernels import e2e_bench


def png_ok(path):
    with open(path, "rb") as f:
        data = f.read()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_e2e_on_cpu_table_json_png(tmp_path):
    out = tmp_path / "e2e.json"
    result = run_script("bench.py", "--e2e", "--device", "cpu", "--models", "tiny", "--variants", "torch,tk",
                        "--reps", "3", "--warmup", "1", "--json", str(out), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    env = data["environment"]
    for key in ("gpu", "torch", "python", "git_commit", "date_utc"):
        assert env[key], key
    rows = {r["variant"]: r for r in data["e2e"]}
    assert list(rows) == ["torch", "tk"]

    torch_row = rows["torch"]
    assert "error" not in torch_row, torch_row
    assert torch_row["model"] == "tiny" and torch_row["tokens_per_step"] == 4 * 32
    assert len(torch_row["ms_steps"]) == 3 and all(t > 0 for t in torch_row["ms_steps"])
    assert math.isfinite(torch_row["tokens_per_s"]) and torch_row["tokens_per_s"] > 0
    assert torch_row["tokens_per_s"] == pytest.approx(128 / (torch_row["ms"] * 1e-3))
    assert torch_row["flops_per_token"] > 6 * torch_row["params"] > 0
    assert torch_row["mfu"] is None                      # no peak figure for a CPU
    assert torch_row["used"] == {"attention": "torch", "layernorm": "torch", "mlp": "torch", "lm_head": "torch",
                                 "linear": "torch"}
    assert math.isfinite(torch_row["loss"]) and torch_row["vs_torch"] == 1.0

    # kernels=tk cannot run on the CPU: recorded as that variant's failure, saying why
    assert "KernelUnavailable" in rows["tk"]["error"] and "CUDA" in rows["tk"]["error"]
    assert "tokens_per_s" not in rows["tk"]

    table = result.stdout[result.stdout.index("model "):]
    line = next(l for l in table.splitlines() if l.startswith("tiny") and " torch " in l)
    assert f"{torch_row['tokens_per_s']:,.0f}" in line
    assert any(l.startswith("tiny") and "FAILED: KernelUnavailable" in l for l in table.splitlines())
    assert png_ok(tmp_path / "e2e_e2e.png")


def test_profile_on_cpu_writes_sorted_table(tmp_path):
    result = run_script("bench.py", "--profile", "--device", "cpu", "--models", "tiny", "--kernels", "torch",
                        "--warmup", "1", "--profile-steps", "2", "--profile-rows", "12",
                        "--json", str(tmp_path / "b.json"), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "b_profile_tiny_torch.txt").read_text()
    assert "kernels=torch" in text and "2 steps profiled after 1 warm-up" in text
    assert "sorted by self_cpu_time_total" in text
    assert "aten::mm" in text                 # the linears' matmuls are among the top ops
    table = text[text.index("Self CPU %"):]
    assert len([l for l in table.splitlines() if l.strip() and not l.startswith("-")]) >= 12


def test_kernel_table_totals_per_step():
    launches = [("gemm_a", 100.0), ("gemm_a", 140.0), ("layernorm", 30.0), ("adam", 50.0)] * 2
    text = e2e_bench.kernel_table(launches, steps=2, rows=2)
    lines = text.splitlines()
    assert lines[0].startswith("GPU kernels: 0.320 ms per step in 4 launches per step, 3 distinct")
    assert lines[2].split() == ["0.240", "75.0%", "2.0", "gemm_a"]
    assert lines[3].split() == ["0.050", "15.6%", "1.0", "adam"]
    assert len(lines) == 4                    # only the top 2


def test_ratios_use_eager_and_best_compile_mode():
    rows = [{"model": "m", "variant": "torch", "kernels": "torch", "compile": None, "ms": 10.0},
            {"model": "m", "variant": "torch+compile:default", "kernels": "torch", "compile": "default", "ms": 8.0},
            {"model": "m", "variant": "torch+compile:max", "kernels": "torch", "compile": "max", "ms": 6.0},
            {"model": "m", "variant": "tk", "kernels": "tk", "compile": None, "ms": 5.0},
            {"model": "m", "variant": "tk+compile:default", "kernels": "tk", "compile": "default", "error": "x"}]
    e2e_bench.add_ratios(rows)
    tk = rows[3]
    assert tk["vs_torch"] == pytest.approx(2.0) and tk["vs_torch_compile"] == pytest.approx(1.2)
    assert rows[2]["vs_torch_compile"] == pytest.approx(1.0)
    assert "vs_torch" not in rows[4]


def test_table_shows_host_issue_time_and_marks_a_lower_bound():
    """The host ms column (session 10): '-' where not measured (the CPU), the figure otherwise, and
    '+' when the step waited for the GPU (a figure near HOLD_MS is only a lower bound)."""
    base = {"model": "m", "kernels": "tk", "compile": None, "ms": 50.0, "tokens_per_s": 1.0, "mfu": None}
    rows = [dict(base, variant="cpu"), dict(base, variant="gpu", host_ms=20.84),
            dict(base, variant="waited", host_ms=0.95 * e2e_bench.HOLD_MS)]
    lines = e2e_bench.format_table(rows).splitlines()
    assert lines[0].split()[-2:] == ["host", "ms"]
    cells = {line.split()[1]: line.split()[-1] for line in lines[1:4]}
    assert cells == {"cpu": "-", "gpu": "20.8", "waited": f"{0.95 * e2e_bench.HOLD_MS:.1f}+"}


def test_variant_that_times_out_is_recorded():
    spec = next(e2e_bench.variant_specs(["tiny"], ["torch"], [], "cpu", "auto", 1, 3))
    row = e2e_bench.run_child(spec, timeout=0.01)
    assert row["variant"] == "torch" and "timed out" in row["error"]


def test_variant_overrides_reach_the_switch():
    assert e2e_bench.split_variant("tk+graphs/linear=torch/mlp=auto") == ("tk+graphs", {"linear": "torch", "mlp": "auto"})
    spec = next(e2e_bench.variant_specs(["tiny"], ["torch/linear=tk"], [], "cpu", "auto", 1, 2))
    assert spec["kernels"] == "torch" and spec["overrides"] == {"linear": "tk"} and not spec["graphs"]
    row = e2e_bench.measure(spec)        # linear on tk cannot run on a CPU: the override was applied
    assert "KernelUnavailable" in row["error"] and "linear" in row["error"]


@pytest.mark.parametrize("flag, value, message", [("--models", "gpt3", "unknown model 'gpt3'"),
                                                  ("--variants", "tk+cudagraph", "unknown variant 'tk+cudagraph'"),
                                                  ("--variants", "tk/linear=fast", "'linear=fast' is not op=tk|torch|auto"),
                                                  ("--variants", "tk/lineer=tk", "unknown op 'lineer'")])
def test_bad_names_are_one_clear_error(tmp_path, flag, value, message):
    result = run_script("bench.py", "--e2e", "--device", "cpu", flag, value, "--json", str(tmp_path / "x.json"))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_plot_redraws_op_table(tmp_path):
    """--plot on an op-bench JSON (rows shaped as bench.run_case writes them) draws the table."""
    row = {"op": "layernorm", "case": "fwd+bwd 16384x768 bf16", "unit": "TB/s", "work": 2e8, "note": "",
           "ms": {"tk": 0.079, "eager": 0.185}, "ms_no_graph": {"tk": 0.29, "eager": 0.24},
           "throughput": {"tk": 2.55, "eager": 1.09}, "throughput_no_graph": {"tk": 0.7, "eager": 0.8}}
    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"environment": {"gpu": "test"}, "args": {}, "results": [row]}))
    result = run_script("bench.py", "--plot", str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert png_ok(tmp_path / "ops_ops.png") and not (tmp_path / "ops_e2e.png").exists()


class FakeNVML:
    """pynvml's calls that ClockSampler makes, on a scripted sequence of readings."""
    NVML_CLOCK_SM = 1

    def __init__(self, readings, energy_mj=None):
        self.readings, self.i, self.index = list(readings), 0, None
        self.energy_mj = list(energy_mj) if energy_mj else None   # the counter's successive readings

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.energy_mj is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")       # what a GPU without the counter says
        return self.energy_mj.pop(0)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        self.index = index
        return "gpu"

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000                                          # mW

    def _reading(self):
        return self.readings[min(self.i, len(self.readings) - 1)]

    def nvmlDeviceGetClockInfo(self, handle, which):
        assert which == self.NVML_CLOCK_SM
        return self._reading()[0]

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._reading()[1]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        reasons = self._reading()[2]
        self.i += 1
        return reasons


def test_clock_sampler_summary_and_note(monkeypatch):
    import sys
    import time
    fake = FakeNVML([(1980, 650_000, 0), (1755, 700_000, 0x4), (1980, 640_000, 0x1), (1830, 699_000, 0x4 | 0x20)],
                    energy_mj=[5_000_000, 6_895_500])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(e2e_bench.torch.cuda, "_get_nvml_device_index", lambda i: i + 2, raising=False)
    sampler = e2e_bench.ClockSampler(0, period_s=0.001)
    assert fake.index == 2                                      # CUDA_VISIBLE_DEVICES mapped to NVML's index
    with sampler:
        deadline = time.time() + 5                              # the thread takes ~4 ms; never hang
        while fake.i < 4 and time.time() < deadline:
            time.sleep(0.001)
    s = sampler.summary()
    assert s["clock_samples"] >= 4
    first4 = sampler.samples[:4]
    assert first4 == [(1980, 650.0, 0), (1755, 700.0, 4), (1980, 640.0, 1), (1830, 699.0, 36)]
    assert s["sm_mhz_min"] == 1755 and s["power_limit_w"] == 700.0
    assert set(s["clock_limits"]) == {"power cap", "sw thermal"}    # 0x1 (idle) is not a limit on a busy GPU
    assert 0 < s["clock_limits"]["sw thermal"] <= s["clock_limits"]["power cap"] < 1
    assert s["energy_j"] == 1895.5                              # the counter's two readings, mJ -> J
    note = e2e_bench.clock_note(s)
    assert note.startswith(f"; SM {s['sm_mhz']:.0f} MHz (min 1755)") and "of 700" in note and "power cap" in note
    assert "J a step" not in note                               # time_steps divides by the steps first
    note = e2e_bench.clock_note({**s, "energy_j_per_step": 37.91})
    assert "of 700, 37.9 J a step, limited by" in note


def test_clock_sampler_without_an_energy_counter_leaves_energy_out(monkeypatch):
    import sys
    import time
    fake = FakeNVML([(1980, 650_000, 0)] * 3)                   # the counter call raises
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(e2e_bench.torch.cuda, "_get_nvml_device_index", lambda i: i, raising=False)
    with e2e_bench.ClockSampler(0, period_s=0.001) as sampler:
        deadline = time.time() + 5
        while fake.i < 2 and time.time() < deadline:
            time.sleep(0.001)
    s = sampler.summary()
    assert s["clock_samples"] >= 2 and "energy_j" not in s and "J a step" not in e2e_bench.clock_note(s)


def test_clock_sampler_without_nvml_records_nothing(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)            # import fails
    sampler = e2e_bench.ClockSampler(0)
    with sampler:
        pass
    assert sampler.summary() == {} and e2e_bench.clock_note({}) == ""

"""tests/loss_curves.py on the CPU: the running-mean arithmetic by hand, real tiny runs, one
per path in its own process (torch twice one after another; tk and torch at once, where tk must
fail alone on a CPU), the JSON and the PNG, the pass/fail decision at the tolerance, and bad
arguments."""
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import REPO, make_text

sys.path.insert(0, os.path.join(REPO, "tests"))
import loss_curves  # noqa: E402

TINY_FLAGS = ["--device=cpu", "--dtype=float32", "--n_layer=2", "--n_head=2", "--n_embd=32",
              "--block_size=32", "--batch_size=4"]


def hand_running_mean(values, window):
    return [sum(values[end - window:end]) / window for end in range(window, len(values) + 1)]


def test_running_mean_by_hand():
    assert loss_curves.running_mean([1, 2, 3, 4, 5], 3) == [2, 3, 4]
    assert loss_curves.running_mean([4.0, 2.0], 1) == [4.0, 2.0]
    assert loss_curves.running_mean([1.0, 2.0], 3) == []
    values = [math.sin(i) + 3 for i in range(37)]
    assert loss_curves.running_mean(values, 10) == pytest.approx(hand_running_mean(values, 10), rel=1e-12)
    with pytest.raises(loss_curves.CurvesError, match="--window"):
        loss_curves.running_mean(values, 0)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """torch, torch: 20 iterations of a tiny model on the CPU, each run in its own process; the
    second with an environment setting of its own (as a bisect gives one)."""
    root = tmp_path_factory.mktemp("curves")
    text = root / "input.txt"
    text.write_text(make_text())
    out = root / "out"
    result = subprocess.run([sys.executable, "tests/loss_curves.py", "--out", str(out), "--text", str(text),
                             "--iters", "20", "--paths", "torch,torch@TK_CURVES_PROBE=on", *TINY_FLAGS],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    with open(out / "loss_curves.json") as f:
        return result, json.load(f), out


def test_tiny_run_json_and_arithmetic(tiny_run):
    result, report, out = tiny_run
    torch_a, torch_b = report["runs"]
    assert [r["name"] for r in report["runs"]] == ["torch", "torch+TK_CURVES_PROBE=on"]
    assert torch_a["env"] == {} and torch_a["env_seen"] == {}
    assert torch_b["env"] == {"TK_CURVES_PROBE": "on"} and torch_b["env_seen"] == {"TK_CURVES_PROBE": "on"}
    for run in (torch_a, torch_b):
        assert run["status"] == "ok" and run["losses_from"] == "train() history"
        assert run["train_iters"] == list(range(1, 21))
        assert len(run["losses"]) == 20 and all(math.isfinite(x) for x in run["losses"])
        assert run["used"] == {"attention": "torch", "layernorm": "torch", "mlp": "torch", "lm_head": "torch",
                               "linear": "torch"}
        assert run["tokens_per_s"] > 0 and run["wall_s"] > 0 and run["params_M"] > 0
        assert run["running_mean"] == pytest.approx(hand_running_mean(run["losses"], 10), rel=1e-12)
    assert sum(torch_a["losses"][-5:]) < sum(torch_a["losses"][:5])   # it did train
    # same seed, same data, same ops, float32 on one CPU: the same numbers
    assert torch_a["losses"] == torch_b["losses"]
    first = report["comparisons"][0]
    assert (first["reference"], first["other"]) == ("torch", "torch+TK_CURVES_PROBE=on")
    assert first["running_mean_iters"] == list(range(10, 21))
    hand_rel = [(b - a) / a for a, b in zip(hand_running_mean(torch_a["losses"], 10),
                                            hand_running_mean(torch_b["losses"], 10))]
    assert first["rel_diff"] == pytest.approx(hand_rel, abs=1e-15)
    assert first["max_abs_rel_diff"] == 0 and first["within_tolerance"] and first["mean_rel_diff_second_half"] == 0
    assert report["verdict"] == "PASS" and report["passed"] and report["complete"]
    assert report["max_abs_rel_diff"] == 0 and report["concurrent_gpus"] is None
    assert result.returncode == 0, result.stderr[-2000:]
    verdict = [line for line in result.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(verdict) == 1 and "torch+TK_CURVES_PROBE=on vs torch: max |rel diff| of 10-iter running means 0.000%" in verdict[0]
    # the settings that make the runs comparable, and the schedule scaled to the run
    config = report["config"]
    assert config["dropout"] == 0 and config["attn_dropout"] == 0 and config["log_interval"] == 1
    assert config["max_iters"] == 20 and config["lr_decay_iters"] == 20 and config["warmup_iters"] == 2
    assert config["eval_interval"] > 20 and config["compile"] is False and config["seed"] == 1337
    assert "vocab 45 characters (shakespeare_char), not GPT-2's 50304" in report["model"]
    # only logs, JSON and PNG in the output folder; no checkpoint anywhere in it
    assert sorted(os.listdir(out)) == ["loss_curves.json", "loss_curves.png", "torch+TK_CURVES_PROBE=on.log", "torch.log"]
    png = (out / "loss_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def fake_run(name, kernels, losses):
    return {"name": name, "kernels": kernels, "status": "ok", "losses": losses, "tokens_per_s": 1.0,
            "used": {"attention": "tk", "layernorm": "tk", "mlp": "torch" if kernels == "auto" else "tk"}}


@pytest.mark.parametrize("scale, bump, passes", [(1.005, 1.0, True), (0.995, 1.0, True), (1.0, 1.03, False)])
def test_pass_and_fail_at_the_tolerance(tmp_path, scale, bump, passes):
    ref = [4.0 * math.exp(-i / 30) + 1.0 + 0.05 * math.sin(i) for i in range(60)]
    # 0.5% off everywhere passes; 3% off on iterations 31..35 puts the running means that hold all
    # five (those ending at iterations 35..40) ~1.5% off
    other = [x * scale * (bump if 30 <= i < 35 else 1.0) for i, x in enumerate(ref)]
    args = SimpleNamespace(window=10, tolerance=0.01, iters=60)
    config = dict(loss_curves.build_config(SimpleNamespace(iters=60), []), data_dir=str(tmp_path))
    passed, line = loss_curves.report([fake_run("torch", "torch", ref), fake_run("auto", "auto", other)],
                                      config, args, str(tmp_path))
    report = json.loads((tmp_path / "loss_curves.json").read_text())
    worst = report["comparisons"][0]
    assert passed is passes and report["verdict"] == ("PASS" if passes else "FAIL")
    assert line.startswith(report["verdict"]) and "NOT all-tk: auto ran mlp=torch" in line
    if passes:
        assert worst["max_abs_rel_diff"] == pytest.approx(0.005, rel=1e-9)
    else:
        assert 0.012 < worst["max_abs_rel_diff"] < 0.016 and 35 <= worst["max_abs_rel_diff_iter"] <= 40
    assert report["tk_paths_not_all_tk"] == {"auto": {"mlp": "torch"}} and not report["tk_paths_all_tk"]
    assert (tmp_path / "loss_curves.png").stat().st_size > 20_000


def test_a_partial_log_still_gives_a_curve(tmp_path):
    log = tmp_path / "tk.log"
    log.write_text("kernels: attention=tk\niter 1: loss 4.1800, lr 1e-5, 9 ms/iter, 1 tok/s\n"
                   "iter 2: loss 4.0500, lr 2e-5, 9 ms/iter, 1 tok/s\nTraceback: illegal memory access\n")
    assert loss_curves.losses_from_log(str(log)) == [4.18, 4.05]


@pytest.mark.parametrize("flags, fragment", [
    (["--dropout=0.1"], "needs dropout=0.0"),
    (["--kernels=tk"], "use --paths"),
    (["--max_iters=5"], "use --iters"),
    (["--n_layr=2"], "did you mean n_layer"),
    (["--paths=torch"], "--paths=torch"),
    (["--paths=torch,cuda"], "'cuda' starts with 'cuda'"),
    (["--paths=torch,auto@fcfast=4"], "'fcfast=4' in 'auto@fcfast=4' is not an environment setting"),
    (["--paths=torch,auto@TK_X"], "'TK_X' in 'auto@TK_X' is not an environment setting"),
    (["--text=/nonexistent/input.txt"], "--text"),
    (["--iters=0"], "--iters=0"),
])
def test_bad_arguments_are_one_clear_line(tmp_path, capsys, flags, fragment):
    assert loss_curves.main(["--out", str(tmp_path / "o"), *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err


def test_gpu_script_parses():
    subprocess.run(["bash", "-n", os.path.join(REPO, "tests", "gpu_loss_curves.sh")], check=True)


def test_gpu_slots_follow_cuda_visible_devices(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert loss_curves.gpu_slots(2, wanted=True) == ["0", "1"]
    assert loss_curves.gpu_slots(2, wanted=False) is None
    assert loss_curves.gpu_slots(5, wanted=True) == ["0", "1", "0", "1", "0"]   # shared round robin
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,3")
    assert loss_curves.gpu_slots(2, wanted=True) == ["5", "3"]      # the i-th visible GPU, as named
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert loss_curves.gpu_slots(2, wanted=True) == ["5", "5"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert loss_curves.gpu_slots(2, wanted=True) is None            # no GPU: one after another


def test_paths_carry_their_own_environment():
    assert loss_curves.parse_path("auto") == ("auto", {})
    assert loss_curves.parse_path("auto@TK_MLP_SCHEDULE=fcfast=4@TK_X=") == (
        "auto", {"TK_MLP_SCHEDULE": "fcfast=4", "TK_X": ""})
    assert loss_curves.run_names(["torch", "auto", "auto", "auto@TK_A=1,2"]) == [
        "torch", "auto", "auto_2", "auto+TK_A=1_2"]
    # two settings that only a file name's characters tell apart still get two logs
    assert loss_curves.run_names(["auto@TK_A=1 2", "auto@TK_A=1/2"]) == ["auto+TK_A=1_2", "auto+TK_A=1_2_2"]


def test_concurrent_runs_on_the_cpu(tmp_path, monkeypatch, capsys):
    """The --gpu-per-path branch (both runs at once, one CUDA_VISIBLE_DEVICES each), on the CPU:
    a run that finishes first waits for the other; a failing run does not stop the other."""
    text = tmp_path / "input.txt"
    text.write_text(make_text())
    monkeypatch.setattr(loss_curves, "gpu_slots", lambda n, wanted: ["", ""] if wanted else None)
    rc = loss_curves.main(["--out", str(tmp_path / "o"), "--text", str(text), "--iters", "12",
                           "--paths", "tk,torch", "--gpu-per-path", *TINY_FLAGS])
    report = json.loads((tmp_path / "o" / "loss_curves.json").read_text())
    assert rc == 1 and report["concurrent_gpus"] == ["", ""]
    tk, torch_run = report["runs"]
    assert torch_run["status"] == "ok" and len(torch_run["losses"]) == 12
    # tk cannot run on a CPU: that run fails alone and the verdict says so
    assert tk["status"] == "exit code 1" and tk["losses"] == [] and "KernelUnavailable" in tk["log_tail"]
    assert not report["passed"] and not report["complete"] and not report["tk_paths_all_tk"]
    assert report["comparisons"][0]["max_abs_rel_diff"] is None   # nothing to compare against
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("FAIL") and "tk exit code 1" in verdict and "a run did not complete" in verdict

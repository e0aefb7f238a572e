"""CPU checks (CI) of kernels/attention_bench.py's interleaved timing (--interleave): the order of
the turns, what is skipped and why, the report, and the argument checks. The GPU parts (CUDA
graphs, events) are replaced by stand-ins that record what would run; the real run is in
tests/gpu_attention_forward_default.sh."""
import json
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from kernels import attention_bench as AB  # noqa: E402


class FakeGraph:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def replay(self):
        self.log.append(self.name)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Graphs that log their replays; each timing returns a fixed figure per implementation."""
    log, timed = [], []
    fixed = {"eager": 2.0, "sdpa-flash": 1.0}
    monkeypatch.setattr(AB, "_graph_of", lambda step, attend, inputs: FakeGraph(getattr(attend, "name", "?"), log))

    def replay_median(graphs, reps):
        timed.append(graphs[0].name)
        return fixed[graphs[0].name]
    monkeypatch.setattr(AB, "_replay_median_ms", replay_median)

    class Props:
        L2_cache_size = 1 << 10
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    table = AB.implementations()
    for name, attend in table.items():
        attend.name = name
    monkeypatch.setattr(AB, "implementations", lambda: table)
    monkeypatch.setattr(AB, "SHAPES", dict(AB.SHAPES, tiny=(1, 2, 16, 64)))
    return log, timed


def test_turns_rotate_and_refusals_are_skipped(fake_gpu, capsys):
    log, timed = fake_gpu
    # on CPU: tk refuses (no CUDA), eager runs, SDPA's flash backend refuses CPU tensors or runs:
    # whichever, the report must have exactly the ones that ran, each timed once per round
    results = AB.interleaved(["tiny"], ["tk", "eager", "sdpa-flash"], "fwd", rounds=4, reps=3, device="cpu")
    ran = list(results["tiny"])
    assert "tk" not in ran and "eager" in ran
    assert "tk skipped" in capsys.readouterr().out
    assert all(len(results["tiny"][name]) == 4 for name in ran)
    # round r starts with the r-th implementation (mod the number that ran)
    rounds = [timed[i * len(ran):(i + 1) * len(ran)] for i in range(4)]
    for r, order in enumerate(rounds):
        assert order == ran[r % len(ran):] + ran[:r % len(ran)]
    text = AB.format_interleaved(results)
    assert "fwd tiny 1x2x16x64, interleaved, 4 rounds" in text
    assert "eager" in text and " 2.0000 ms" in text


def test_cudnn_ratio_when_present(fake_gpu):
    results = {"tiny": {"sdpa-cudnn": [1.0, 1.2, 1.1], "tk": [0.5, 0.55, 0.6]}}
    text = AB.format_interleaved(results)
    assert "2.000x cudnn" in text.splitlines()[2]   # tk: 1.1 / 0.55


def test_bad_names_are_refused(fake_gpu):
    with pytest.raises(ValueError, match="--impls: unknown name"):
        AB.interleaved(["tiny"], ["tk", "nope"], device="cpu")
    with pytest.raises(ValueError, match="--interleave: unknown shape"):
        AB.interleaved(["gpt3"], ["tk"], device="cpu")


def test_command_line_checks(capsys):
    with pytest.raises(SystemExit):
        AB.main(["--interleave", "gpt2", "--rounds", "0"])
    with pytest.raises(SystemExit):
        AB.main([])
    with pytest.raises(SystemExit):
        AB.main(["--interleave", "gpt2", "a.json", "b.json"])
    if not torch.cuda.is_available():
        assert AB.main(["--interleave", "gpt2", "--impls", "tk,tk-hopper-v21,sdpa-cudnn"]) == 1
        assert "needs a CUDA device" in capsys.readouterr().err


def test_command_line_writes_the_json(fake_gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    orig = AB.interleaved
    monkeypatch.setattr(AB, "interleaved", lambda s, n, d, r, k: orig(s, n, d, r, k, device="cpu"))
    out = tmp_path / "x.json"
    assert AB.main(["--interleave", "tiny", "--impls", "eager", "--rounds", "2", "--reps", "3", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["direction"] == "fwd" and data["round_medians_ms"]["tiny"]["eager"] == [2.0, 2.0]
    assert "interleaved, 2 rounds" in capsys.readouterr().out
    assert AB.main(["--interleave", "tiny", "--impls", "nope"]) == 2


def test_host_mode_needs_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU refusal")
    assert AB.main(["--host", "gpt2"]) == 1
    assert "needs a CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        AB.main(["--host", "gpt9"])

"""Shared pieces for the tests: the repo on sys.path, a small
text corpus made here (the tests need no download), a tiny model config, and the relative
error the kernel tests compare with."""
import os
import random
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def make_text(n_chars=60_000, seed=0):
    """Pseudo-English with enough structure for a tiny model's loss to fall quickly."""
    rng = random.Random(seed)
    words = ("the king queen lord my good sir thou art not what i say to her his of and come "
             "go love death night day sweet speak hath doth well").split()
    lines = []
    while sum(len(line) + 1 for line in lines) < n_chars:
        speaker = rng.choice(["KING", "QUEEN", "ROMEO", "JULIET"])
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 10)))
        lines.append(f"{speaker}:\n{sentence.capitalize()}.\n")
    return "\n".join(lines)[:n_chars]


# The smallest model the tests train: fast on two CPU cores, big enough for the loss to move.
TINY = dict(dataset="shakespeare_char", n_layer=2, n_head=2, n_embd=32, block_size=32,
            batch_size=8, gradient_accumulation_steps=1, max_iters=20, eval_interval=10,
            eval_iters=4, log_interval=1, learning_rate=3e-3, warmup_iters=2, lr_decay_iters=20,
            min_lr=3e-4, dropout=0.0, device="cpu", dtype="float32", compile=False, kernels="auto")


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """A data_dir holding shakespeare_char/{train,val}.bin and meta.pkl made from make_text()."""
    sys.path.insert(0, os.path.join(REPO, "data", "shakespeare_char"))
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "char_prepare", os.path.join(REPO, "data", "shakespeare_char", "prepare.py"))
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    root = tmp_path_factory.mktemp("data")
    folder = root / "shakespeare_char"
    folder.mkdir()
    (folder / "input.txt").write_text(make_text())
    prepare.prepare(str(folder), url="http://127.0.0.1:9/unused")
    return str(root)


def tiny_config(data_dir, out_dir, **overrides):
    """train.py's DEFAULTS with the tiny model, a data_dir and an out_dir."""
    import train
    config = dict(train.DEFAULTS)
    config.update(TINY, data_dir=str(data_dir), out_dir=str(out_dir))
    config.update(overrides)
    return config


def run_script(*args, timeout=300, env=None):
    """Run a script of the repo as a user would; returns the CompletedProcess."""
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_one_line_error(result, *fragments):
    """A bad input ends with exit code 1 and one clear line on stderr, not a traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def mlp_training_inputs(M, seed, bias=False, C=768, H=3072):
    """GPT-2-sized MLP inputs as training sees them under autocast, on the GPU: x and dy bf16 (M, C),
    fp32 weights that require grad (w_fc (H, C), w_proj (C, H)), fp32 biases or None. Returns
    (x, w_fc, b_fc, w_proj, b_proj, dy)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, C, device="cuda", generator=g).bfloat16()
    w_fc = (torch.randn(H, C, device="cuda", generator=g) * 0.02).requires_grad_()
    w_proj = (torch.randn(C, H, device="cuda", generator=g) * 0.02).requires_grad_()
    b = [(torch.randn(n, device="cuda", generator=g) * 0.02).requires_grad_() if bias else None for n in (H, C)]
    dy = torch.randn(M, C, device="cuda", generator=g).bfloat16()
    return x, w_fc, b[0], w_proj, b[1], dy


def rel_err(out, ref):
    """Relative norm error of a kernel's output against a (float64) reference. Fails on any
    non-finite output: outputs are poisoned with NaN first, so an unwritten element shows here."""
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite values (unwritten or NaN) in the output"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def use_cpu_checks(monkeypatch, module, *names):
    """Replace each module.<name> input check by the real one called with cuda=False: the CPU tests
    run the real argument checks on CPU tensors (with a fake extension behind them)."""
    for name in names:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **k: _real(*a, **{**k, "cuda": False}))

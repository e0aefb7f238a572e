"""train.py on the CPU: the loss falls, resume is exact, checkpoints are safe, bad input is
one clear line."""
import hashlib
import math
import os
import sys

import pytest
import torch

import train
from conftest import REPO, assert_one_line_error, make_text, run_script, tiny_config
from model import CheckpointError


def train_losses(result):
    return [loss for _, kind, loss in result["history"] if kind == "train"]


def test_short_run_loss_falls(char_data, tmp_path, capsys):
    result = train.train(tiny_config(char_data, tmp_path, max_iters=40, lr_decay_iters=40))
    losses = train_losses(result)
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses   # from ~ln(vocab) downwards
    out = capsys.readouterr().out
    assert "ms/iter" in out and "tok/s" in out and "mfu" not in out   # no MFU figure for a CPU
    assert "kernels: attention=torch, layernorm=torch, mlp=torch" in out


def test_resume_is_bit_exact(char_data, tmp_path):
    # dropout on, so that the RNG state matters too
    common = dict(max_iters=16, eval_interval=8, lr_decay_iters=16, dropout=0.1)
    straight = train.train(tiny_config(char_data, tmp_path / "a", **common))
    first = train.train(tiny_config(char_data, tmp_path / "b", **{**common, "max_iters": 8}))
    second = train.train(tiny_config(char_data, tmp_path / "b", **common, init_from="resume"))
    assert train_losses(first) + train_losses(second) == train_losses(straight)
    a = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_holds_everything_for_resume(char_data, tmp_path):
    import kernels
    kernels._record_use("layernorm", "tk")   # as if an earlier run in this process ran tk (the GPU suite does)
    train.train(tiny_config(char_data, tmp_path, max_iters=10))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    for key in ("model", "optimizer", "scaler", "model_args", "config", "iter_num", "best_val_loss",
                "rng", "sampler", "vocab", "kernels"):
        assert key in ckpt, key
    assert set(ckpt["rng"]) == {"torch", "cuda", "numpy", "python"}
    assert ckpt["iter_num"] == 10 and ckpt["vocab"]["vocab_size"] == ckpt["model_args"]["vocab_size"]
    assert ckpt["kernels"]["used"] == {"attention": "torch", "layernorm": "torch", "mlp": "torch", "lm_head": "torch",
                                       "linear": "torch"}
    assert not os.path.exists(tmp_path / "ckpt.pt.tmp")   # written aside, then renamed


def test_grad_accumulation_equals_one_big_batch(char_data, tmp_path):
    one = train.train(tiny_config(char_data, tmp_path / "one", batch_size=8, max_iters=3))
    two = train.train(tiny_config(char_data, tmp_path / "two", batch_size=4,
                                  gradient_accumulation_steps=2, max_iters=3))
    assert train_losses(one) == pytest.approx(train_losses(two), rel=1e-5)


def test_truncated_and_foreign_checkpoints_are_refused(char_data, tmp_path):
    train.train(tiny_config(char_data, tmp_path / "good", max_iters=10))
    data = (tmp_path / "good" / "ckpt.pt").read_bytes()
    cases = {"truncated": (data[:len(data) // 2], "truncated or corrupt"),
             "foreign": (None, "not a nanogpt-tk checkpoint"),
             "mismatch": (None, "does not match the model")}
    for name, (content, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        if name == "foreign":
            torch.save({"state_dict": {"w": torch.ones(2)}}, folder / "ckpt.pt")
        elif name == "mismatch":   # our tag, but weights of another shape
            ckpt = torch.load(tmp_path / "good" / "ckpt.pt", weights_only=False)
            ckpt["model"]["wte.weight"] = torch.zeros(3, 3)
            torch.save(ckpt, folder / "ckpt.pt")
        else:
            (folder / "ckpt.pt").write_bytes(content)
        with pytest.raises(CheckpointError, match=message):
            train.train(tiny_config(char_data, folder, init_from="resume"))
    result = run_script("train.py", f"--out_dir={tmp_path / 'truncated'}", "--init_from=resume",
                        f"--data_dir={char_data}", "--dataset=shakespeare_char", "--device=cpu")
    assert_one_line_error(result, "truncated or corrupt")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(char_data, tmp_path, monkeypatch):
    real = torch.nn.functional.cross_entropy
    ckpt = tmp_path / "ckpt.pt"

    def poisoned(*args, **kwargs):   # once a checkpoint exists, the loss turns NaN
        loss = real(*args, **kwargs)
        return loss * float("nan") if ckpt.exists() else loss
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", poisoned)
    with pytest.raises(train.TrainingStopped) as e:
        train.train(tiny_config(char_data, tmp_path, max_iters=20, eval_interval=5))
    assert "loss is nan at iter 6" in str(e.value) and "iter 5) is kept" in str(e.value)
    assert torch.load(ckpt, weights_only=False)["iter_num"] == 5


def test_missing_shakespeare_char_data_is_prepared(tmp_path, capsys):
    folder = tmp_path / "shakespeare_char"
    folder.mkdir()
    (folder / "input.txt").write_text(make_text(20_000, seed=3))
    train.train(tiny_config(tmp_path, tmp_path / "out", max_iters=2))
    assert (folder / "train.bin").exists() and (folder / "meta.pkl").exists()
    assert "running its prepare.py" in capsys.readouterr().out


def test_synthetic_data_needs_no_files(tmp_path):
    result = train.train(tiny_config(tmp_path / "nothing", tmp_path, dataset="synthetic", vocab_size=300,
                                     max_iters=2, eval_interval=100))
    assert abs(train_losses(result)[0] - math.log(300)) < 0.2


def test_bfloat16_autocast_on_cpu(char_data, tmp_path):
    result = train.train(tiny_config(char_data, tmp_path, dtype="bfloat16", max_iters=3))
    assert all(math.isfinite(x) for x in train_losses(result))


def test_wandb_missing_is_a_clear_error(char_data, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)   # makes `import wandb` fail
    with pytest.raises(train.ConfigError, match="wandb is not installed: pip install wandb"):
        train.train(tiny_config(char_data, tmp_path, wandb_log=True, max_iters=1))


def test_bad_ddp_bucket_size_is_a_clear_error_even_on_one_process(char_data, tmp_path):
    # refused before anything starts (under torchrun: before the process group)
    with pytest.raises(train.ConfigError, match=r"ddp_bucket_cap_mb=0: give a bucket size in MB > 0"):
        train.train(tiny_config(char_data, tmp_path, ddp_bucket_cap_mb=0, max_iters=1))

def test_lr_schedule_warmup_then_cosine():
    c = type("C", (), dict(decay_lr=True, learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110))
    assert train.get_lr(0, c) == pytest.approx(1 / 11)
    assert train.get_lr(9, c) == pytest.approx(10 / 11)
    assert train.get_lr(10, c) == pytest.approx(1.0)
    assert train.get_lr(60, c) == pytest.approx(0.55)
    assert train.get_lr(500, c) == pytest.approx(0.1)


def test_cli_bad_inputs_are_one_line(tmp_path):
    # Each case must fail before any training, with exit code 1 and one line.
    assert_one_line_error(run_script("train.py", "--dataset=nope", f"--data_dir={tmp_path}", "--device=cpu"),
                          f"{tmp_path}/nope/train.bin not found", "prepare.py")
    # tk asked for on a CPU: the kernels package refuses, train.py reports it in one line
    assert_one_line_error(run_script("train.py", "--dataset=synthetic", "--device=cpu", "--kernels=tk",
                                     "--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=16",
                                     f"--out_dir={tmp_path}"), "tk")


@pytest.mark.parametrize("name,peak", [("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12),
                                       ("NVIDIA H100 PCIe", 756e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                       ("Tesla T4", None)])
def test_mfu_peak_table_gives_no_figure_for_unknown_gpus(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert train.peak_flops("cuda:0") == peak
    assert train.peak_flops("cpu") is None


def test_wandb_logs_offline(char_data, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train.train(tiny_config(char_data, tmp_path, wandb_log=True, max_iters=2, eval_interval=2))
    assert any(p.name.startswith("offline-run") for p in (tmp_path / "wandb").iterdir())


def test_compile_flag_trains_and_saves_plain_weights(tmp_path):
    # torch.compile on the CPU (inductor, gcc): ~20 s. Same losses as eager, and the checkpoint
    # holds the plain module's weights (no compile wrapper prefix), so it loads anywhere.
    settings = dict(dataset="synthetic", vocab_size=64, n_layer=1, block_size=16, batch_size=2,
                    max_iters=3, eval_iters=1)
    eager = train.train(tiny_config(tmp_path / "none", tmp_path / "eager", **settings))
    compiled = train.train(tiny_config(tmp_path / "none", tmp_path / "compiled", compile=True, **settings))
    assert train_losses(compiled) == pytest.approx(train_losses(eager), rel=1e-4)
    ckpt = torch.load(tmp_path / "compiled" / "ckpt.pt", weights_only=False)
    assert not any(k.startswith("_orig_mod") for k in ckpt["model"])


def test_cuda_graphs_are_skipped_with_a_message_where_they_cannot_run(char_data, tmp_path, capsys):
    result = train.train(tiny_config(char_data, tmp_path, device="cpu", cuda_graphs=True, max_iters=2))
    assert result["iter_num"] == 2
    assert "cuda_graphs=True: not used there is no GPU; running without CUDA graphs" in capsys.readouterr().out


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_cuda_graphs_are_skipped_under_compile(char_data, tmp_path, capsys):
    train.train(tiny_config(char_data, tmp_path, device="cuda", cuda_graphs=True, compile=True, max_iters=2))
    assert "not used with compile=True" in capsys.readouterr().out


@needs_cuda
@pytest.mark.parametrize("kernels", ["torch", "auto"])
@pytest.mark.parametrize("accum", [1, 2])
def test_cuda_graphs_train_like_eager(char_data, tmp_path, kernels, accum):
    # Replaying a captured step must compute what the eager step computes: same losses at every
    # iteration (dropout 0, so no random numbers), same evals. Iterations 1-2 run eagerly (the
    # warm-up), capture happens in iteration 3 (or 2 with accumulation), the rest are replays.
    common = dict(device="cuda", dtype="bfloat16", kernels=kernels, max_iters=12, eval_interval=6,
                  eval_iters=4, lr_decay_iters=12, batch_size=4, gradient_accumulation_steps=accum,
                  n_embd=128, n_head=2, block_size=64)
    eager = train.train(tiny_config(char_data, tmp_path / "eager", **common))
    graphed = train.train(tiny_config(char_data, tmp_path / "graphs", cuda_graphs=True, **common))
    a, b = train_losses(eager), train_losses(graphed)
    assert len(a) == len(b) == 12 and all(math.isfinite(x) for x in b)
    assert b == pytest.approx(a, rel=2e-3), (a, b)
    evals = lambda r: [loss for _, kind, loss in r["history"] if kind == "val"]
    assert evals(graphed) == pytest.approx(evals(eager), rel=2e-3)


@needs_cuda
def test_graphed_replays_draw_fresh_dropout_masks_and_copy_inputs():
    # Each replay must draw new random numbers (the graph advances the generator's offset) and
    # read the inputs of this call, not those it was captured with.
    drop = train.Graphed(lambda x: torch.nn.functional.dropout(x, 0.5) * 1.0, "test", warmup=1)
    x = torch.ones(4096, device="cuda")
    masks = [drop(x).clone() for _ in range(4)]   # eager warm-up, capture + replay, 2 replays
    assert all(not torch.equal(masks[i], masks[j]) for i in range(4) for j in range(i))
    assert all(0.4 < (m > 0).float().mean().item() < 0.6 for m in masks)
    assert torch.equal(drop(torch.zeros(4096, device="cuda")), torch.zeros(4096, device="cuda"))


@needs_cuda
@pytest.mark.parametrize("split", ["train", "val"])
def test_gpu_resident_tokens_give_the_memmap_windows(char_data, split):
    # A small token file is kept on the GPU and windows are gathered there; the starts come
    # from the same generator, so training and eval batches must be the memmap path's, exactly.
    resident = train.Batches(os.path.join(char_data, "shakespeare_char"), 65, 8, 33, 1337, "cuda")
    memmap = train.Batches(os.path.join(char_data, "shakespeare_char"), 65, 8, 33, 1337, "cuda")
    memmap.GPU_RESIDENT_MAX_TOKENS = 0   # this instance only: the files are loaded lazily, on first use
    for (xa, ya), (xb, yb) in zip(resident.eval_batches(split, 3), memmap.eval_batches(split, 3)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(xa[:, 1:], ya[:, :-1]) and xa.dtype == torch.int64 and xa.is_contiguous()
    a, b = resident.train_step(2, 1, 1)[0], memmap.train_step(2, 1, 1)[0]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert resident.resident[split] is not None and memmap.resident[split] is None

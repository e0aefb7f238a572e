"""DDP on the CPU: two gloo processes under torchrun train the same model as one process with
the same global batch (each rank keeps batch_size; gradient_accumulation_steps is split)."""
import sys

import pytest
import torch

import train
from conftest import REPO, run_script, tiny_config


def test_two_gloo_ranks_match_one_process(char_data, tmp_path):
    settings = dict(batch_size=4, gradient_accumulation_steps=2, max_iters=4, eval_interval=4)
    single = train.train(tiny_config(char_data, tmp_path / "single", **settings))

    flags = [f"--{k}={v}" for k, v in tiny_config(char_data, tmp_path / "ddp", **settings).items()
             if k in ("data_dir", "out_dir") or k in settings or k in
             ("dataset", "n_layer", "n_head", "n_embd", "block_size", "eval_iters", "log_interval",
              "learning_rate", "warmup_iters", "lr_decay_iters", "min_lr", "dropout", "device", "dtype")]
    result = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "train.py", *flags, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ranks 2" in result.stdout

    one = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=False)
    two = torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=False)
    assert one["iter_num"] == two["iter_num"] == 4
    for name, weight in one["model"].items():
        # same data, same steps: only the order of floating-point sums differs
        torch.testing.assert_close(two["model"][name], weight, rtol=1e-4, atol=1e-5, msg=name)
    logged = [float(line.split("loss ")[1].split(",")[0]) for line in result.stdout.splitlines()
              if line.startswith("iter ")]
    expected = [loss for _, kind, loss in single["history"] if kind == "train"]
    assert logged == pytest.approx(expected, abs=2e-4)   # printed to 4 decimals

"""GPU: the tk layernorm inside the real model and training loop.

- test_model_step_*: one forward+backward of a GPT (bf16 autocast, as train.py runs it) with
  kernels_layernorm=tk matches the all-torch run within bf16 tolerance (loss and every gradient).
- test_model_step_under_autocast_casts_no_activations_at_the_layernorms: counts the activation
  dtype casts of that step: 6L + 2 with the torch layernorm, none with tk (the mixed-dtype kernel).
- test_shakespeare_200_iters: the issue's end-to-end check, `train.py config/shakespeare.py`
  for 200 iterations, dropout 0, same seed, layernorm=tk vs torch: losses within 1%. Needs
  data/shakespeare_char/train.bin (python data/shakespeare_char/prepare.py); skipped without it.
"""
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import kernels  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def model_step(layernorm, bias, seed=0):
    from model import GPT, GPTConfig
    kernels.configure("torch", layernorm=layernorm)
    kernels.reset_used()
    try:
        torch.manual_seed(seed)
        m = GPT(GPTConfig(block_size=128, vocab_size=96, n_layer=3, n_head=6, n_embd=384, dropout=0.0,
                          attn_dropout=0.0, bias=bias)).cuda()
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        idx = torch.randint(0, 96, (5, 127), device="cuda", generator=g)   # odd T
        targets = torch.randint(0, 96, (5, 127), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = m(idx, targets)
        loss.backward()
        used = kernels.used()["layernorm"]
    finally:
        kernels.configure("auto")
        kernels.reset_used()
    return loss.item(), {n: p.grad.detach().float().clone() for n, p in m.named_parameters()}, used


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_model_step_tk_matches_torch(bias):
    loss_t, grads_t, used_t = model_step("torch", bias)
    loss_k, grads_k, used_k = model_step("tk", bias)
    assert used_t == "torch" and used_k == "tk"
    assert abs(loss_k - loss_t) / abs(loss_t) < 1e-3, (loss_k, loss_t)
    for name, gt in grads_t.items():
        gk = grads_k[name]
        assert torch.isfinite(gk).all(), name
        err = ((gk - gt).norm() / gt.norm().clamp_min(1e-12)).item()
        assert err < 2e-2, f"{name}: relative gradient error {err:.2e}"


def activation_casts(layernorm, n_layer=3, B=5, T=127, C=384):
    """dtype casts (aten._to_copy) of (B, T, C) activations in one forward+backward of the GPT
    under bf16 autocast, with the given layernorm and the torch reference for everything else."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from model import GPT, GPTConfig

    class CountCasts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].shape[-1] == C and args[0].numel() == B * T * C:
                self.count += 1
            return func(*args, **(kwargs or {}))

    kernels.configure("torch", layernorm=layernorm)
    try:
        torch.manual_seed(0)
        m = GPT(GPTConfig(block_size=128, vocab_size=96, n_layer=n_layer, n_head=6, n_embd=C, dropout=0.0)).cuda()
        idx = torch.randint(0, 96, (B, T), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            m(idx, idx)                                 # warm: build the extension, autocast caches
        casts = CountCasts()
        with casts:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = m(idx, idx)
            loss.backward()
    finally:
        kernels.configure("auto")
    return casts.count


def test_model_step_under_autocast_casts_no_activations_at_the_layernorms():
    """The point of the mixed-dtype kernel (kernels/layernorm.cu, top): with the torch layernorm
    each of the 2L residual adds + LayerNorms with a bf16 branch costs 3 activation casts (y to
    bf16 for the matmul; in the backward dy to fp32 and the branch's gradient to bf16), the first
    one (no branch) 2; with tk none, since the kernel reads and writes each dtype directly.
    (Before session 2 the tk path made 4 per call: it also cast the branch to fp32 first.)"""
    n_layer = 3
    torch_casts, tk_casts = activation_casts("torch", n_layer), activation_casts("tk", n_layer)
    assert (torch_casts, tk_casts) == (6 * n_layer + 2, 0), (
        f"activation casts per step: torch layernorm {torch_casts} (expected {6 * n_layer + 2}; 2L + 1 = "
        f"{2 * n_layer + 1} would mean the backward's casts went unseen), tk {tk_casts} (expected 0)")


DATA = os.path.join(REPO, "data", "shakespeare_char", "train.bin")


@pytest.mark.skipif(not os.path.exists(DATA), reason="needs data/shakespeare_char/train.bin (run its prepare.py)")
def test_shakespeare_200_iters(tmp_path):
    import config
    import train
    argv = ["config/shakespeare.py", "--max_iters=200", "--lr_decay_iters=200", "--dropout=0.0",
            "--eval_interval=100", "--eval_iters=20", "--log_interval=10", "--kernels=torch"]
    runs = {}
    for ln in ("torch", "tk"):
        cfg = config.load(train.DEFAULTS, argv + [f"--kernels_layernorm={ln}", f"--out_dir={tmp_path / ln}"])
        runs[ln] = train.train(cfg)
    hist = {ln: [(it, loss) for it, split, loss in r["history"] if split == "train"] for ln, r in runs.items()}
    assert len(hist["tk"]) == len(hist["torch"]) >= 10
    worst = max(abs(a[1] - b[1]) / b[1] for a, b in zip(hist["tk"], hist["torch"]))
    print(f"layernorm tk vs torch over 200 iterations: worst relative loss difference {worst:.2e}")
    assert worst < 0.01

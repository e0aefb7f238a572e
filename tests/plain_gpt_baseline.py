"""Throughput of our model.py (kernels=torch) against a plain nanoGPT-style GPT, same shapes.

The plain model below is the textbook one, written here for the comparison: nn.LayerNorm,
nn.Linear, SDPA, tanh-GELU, `x = x + attn(ln_1(x))`. Both train one step at a time (forward,
backward, fused AdamW) on random tokens, eager and compiled, and we print tokens/s. The issue's
bar: our torch path within 10% of the plain model, eager and compiled.

    python tests/plain_gpt_baseline.py                       # GPT-2 124M, B=32, T=1024, bf16
    python tests/plain_gpt_baseline.py --device=cpu --n_layer=2 --n_embd=64 --n_head=2 \
        --block_size=64 --batch_size=4 --micro_batch=2 --steps=3 --dtype=float32 --modes=eager
"""
import argparse
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kernels  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


class PlainBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c.n_head
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.attn_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.mlp_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList([PlainBlock(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def tokens_per_s(model, args, device):
    """Time full optimizer steps of batch_size sequences (micro_batch at a time)."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    autocast = nullcontext() if args.dtype == "float32" else torch.autocast(device_type, getattr(torch, args.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device_type == "cuda")
    accum = args.batch_size // args.micro_batch
    g = torch.Generator(device="cpu").manual_seed(0)
    data = torch.randint(args.vocab_size, (accum, args.micro_batch, args.block_size + 1), generator=g)
    xs, ys = data[..., :-1].contiguous().to(device), data[..., 1:].contiguous().to(device)

    def step():
        for i in range(accum):
            with autocast:
                _, loss = model(xs[i], ys[i])
            (loss / accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t0) / args.steps
    assert torch.isfinite(loss).item(), "non-finite loss"
    return args.batch_size * args.block_size / dt


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [("n_layer", 12), ("n_head", 12), ("n_embd", 768), ("block_size", 1024),
                          ("vocab_size", 50304), ("batch_size", 32), ("micro_batch", 32),
                          ("steps", 20), ("warmup", 5)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="eager,compiled", help="comma-separated: eager, compiled")
    args = p.parse_args()
    assert args.batch_size % args.micro_batch == 0, "batch_size must be a multiple of micro_batch"
    torch.backends.cuda.matmul.allow_tf32 = True
    kernels.configure("torch")
    config = GPTConfig(block_size=args.block_size, vocab_size=args.vocab_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=0.0, bias=False)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{name}, torch {torch.__version__}: B={args.batch_size} (micro {args.micro_batch}), "
          f"T={args.block_size}, {args.n_layer}x{args.n_embd}, {args.dtype}, {args.steps} timed steps")
    for mode in args.modes.split(","):
        results = {}
        for label, cls in (("plain nanoGPT-style", PlainGPT), ("ours (kernels=torch)", GPT)):
            torch.manual_seed(0)
            model = cls(config).to(args.device)
            if mode == "compiled":
                model = torch.compile(model)
            results[label] = tokens_per_s(model, args, args.device)
            print(f"{mode:9s} {label:22s} {results[label]:12,.0f} tok/s")
            del model
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
        ratio = results["ours (kernels=torch)"] / results["plain nanoGPT-style"]
        print(f"{mode:9s} ours / plain = {ratio:.3f} ({'within' if ratio >= 0.9 else 'NOT within'} 10%)")


if __name__ == "__main__":
    main()

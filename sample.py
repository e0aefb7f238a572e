"""Generate text from a checkpoint written by train.py.

    python sample.py --out_dir=out-shakespeare-char
    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=1
    python sample.py --out_dir=out --start=FILE:prompt.txt --max_new_tokens=200

A character-level checkpoint carries its vocabulary; any other is decoded with GPT-2's BPE
(tiktoken). Settings work as in train.py: module-level defaults, overridden by config files
and --key=value flags.
"""
import os
import sys
import time
from contextlib import nullcontext
from types import SimpleNamespace

import torch

import kernels as kernel_switch   # (the name `kernels` is a setting below)
from config import ConfigError, defaults_from, run_script
from model import CheckpointError, load_checkpoint

# ----------------------------------------------------------------------------- defaults
out_dir = "out"                  # reads out_dir/ckpt.pt
start = "\n"                     # the prompt, or FILE:path to read it from a file
num_samples = 3
max_new_tokens = 500
temperature = 0.8                # < 1 sharper, > 1 more random
top_k = 200                      # keep only the top_k most likely tokens; 0 keeps all
seed = 1337
device = "auto"
dtype = "auto"
compile = False
use_cache = True                 # KV cache: each new token attends to cached keys/values
kernels = "auto"
kernels_attention = ""
kernels_layernorm = ""
kernels_mlp = ""
kernels_lm_head = ""
kernels_linear = "torch"       # as train.py: off unless asked
DEFAULTS = defaults_from(globals())
# -----------------------------------------------------------------------------


def codec(vocab):
    """(encode, decode) for the checkpoint's char vocabulary, or GPT-2 BPE without one."""
    if vocab is not None:
        stoi, itos = vocab["stoi"], vocab["itos"]

        def encode(text):
            unknown = sorted(set(ch for ch in text if ch not in stoi))
            if unknown:
                raise ConfigError(f"the prompt has characters this model never saw: {unknown!r}")
            return [stoi[ch] for ch in text]
        return encode, lambda ids: "".join(itos[i] for i in ids)
    import tiktoken
    try:
        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise ConfigError(f"tiktoken could not load the GPT-2 encoding (it downloads once, then "
                          f"caches; {type(e).__name__}). Run once with network access.") from None
    return (lambda text: enc.encode(text, allowed_special={"<|endoftext|>"}),
            lambda ids: enc.decode(ids))


def read_prompt(start):
    if start.startswith("FILE:"):
        path = start[len("FILE:"):]
        if not os.path.isfile(path):
            raise ConfigError(f"--start=FILE:{path}: no such file")
        with open(path, encoding="utf-8") as f:
            start = f.read()
        if not start:
            raise ConfigError(f"--start=FILE:{path}: the prompt file is empty; it needs at least one character")
    if not start:
        raise ConfigError("--start is empty; give at least one character (the default is a newline)")
    return start


def sample(config):
    """Returns the list of generated texts (prompt included), and prints them."""
    c = SimpleNamespace(**config)
    dev = c.device if c.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device_type = "cuda" if dev.startswith("cuda") else "cpu"
    dtype_name = c.dtype
    if dtype_name == "auto":
        dtype_name = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if device_type == "cuda" else "float32"
    if dtype_name not in ("bfloat16", "float16", "float32"):
        raise ConfigError(f"dtype={c.dtype!r}: use auto, bfloat16, float16 or float32")
    if c.num_samples < 1 or c.max_new_tokens < 0:
        raise ConfigError("num_samples must be >= 1 and max_new_tokens >= 0")
    ptdtype = getattr(torch, dtype_name)
    try:
        kernel_switch.configure(c.kernels, **{op: getattr(c, f"kernels_{op}") for op in kernel_switch.OPS})
    except ValueError as e:
        raise ConfigError(str(e)) from None

    prompt_text = read_prompt(c.start)   # before the checkpoint and the kernels load: a bad prompt is one line
    ckpt, model = load_checkpoint(os.path.join(c.out_dir, "ckpt.pt"))
    print(f"checkpoint: iter {ckpt['iter_num']}, best val loss {ckpt['best_val_loss']:.4f}, "
          f"trained with kernels {ckpt.get('kernels', {}).get('used')}")
    model.eval().to(dev)
    mc = model.config
    kernel_switch.preflight(c.num_samples, mc.block_size, mc.n_embd, mc.n_head, ptdtype, dev,
                            attn_dropout=0.0, bias=mc.bias)
    if c.compile:
        model = torch.compile(model)
    encode, decode = codec(ckpt.get("vocab"))
    prompt = encode(prompt_text)
    if not prompt:
        raise ConfigError("the prompt encodes to no tokens")
    idx = torch.tensor(prompt, dtype=torch.long, device=dev)[None].repeat(c.num_samples, 1)

    torch.manual_seed(c.seed)
    generator = torch.Generator(device=dev).manual_seed(c.seed)
    autocast = nullcontext() if dtype_name == "float32" else torch.autocast(device_type, dtype=ptdtype)
    t0 = time.time()
    with autocast:
        out = model.generate(idx, c.max_new_tokens, temperature=c.temperature, top_k=c.top_k or None,
                             use_cache=c.use_cache, generator=generator)
    dt = time.time() - t0
    texts = [decode(row.tolist()) for row in out]
    for text in texts:
        print(text)
        print("---------------")
    print(f"{c.num_samples * c.max_new_tokens} tokens in {dt:.2f} s; kernels used: "
          + ", ".join(f"{op}={how}" for op, how in kernel_switch.used().items()))
    return texts


def main(argv):
    return run_script(__doc__, DEFAULTS, argv, sample, (CheckpointError, kernel_switch.KernelUnavailable), __file__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

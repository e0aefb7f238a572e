"""Tiny Shakespeare, tokenized with GPT-2's BPE (tiktoken).

Writes train.bin and val.bin (uint16 token ids, first 90% / last 10% of the text) next to this
file; no meta.pkl, so train.py uses GPT-2's vocabulary and sample.py decodes with tiktoken.
Uses input.txt here if present, else downloads it.

    python data/shakespeare/prepare.py
"""
import importlib.util
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _char_prepare():
    """The character-level script, whose download (or local copy) of the same text we reuse."""
    path = os.path.join(os.path.dirname(HERE), "shakespeare_char", "prepare.py")
    spec = importlib.util.spec_from_file_location("shakespeare_char_prepare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_char = _char_prepare()
URL, fetch = _char.URL, _char.fetch


def prepare(out_dir=HERE, input_path=None, url=URL, encoding=None):
    """encoding: a tiktoken Encoding (default GPT-2's; the tests pass a small one)."""
    os.makedirs(out_dir, exist_ok=True)
    text = fetch(input_path or os.path.join(out_dir, "input.txt"), url)
    if encoding is None:
        import tiktoken
        try:
            encoding = tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise RuntimeError(f"tiktoken could not load the GPT-2 encoding ({type(e).__name__}); "
                               f"it downloads its files once, so run this once with network access") from None
    if encoding.n_vocab > 2 ** 16:
        raise RuntimeError(f"vocabulary of {encoding.n_vocab} does not fit the uint16 .bin format")
    # Split the text, not the tokens, so that no token straddles the boundary.
    split = int(0.9 * len(text))
    for name, part in (("train", text[:split]), ("val", text[split:])):
        ids = np.array(encoding.encode_ordinary(part), dtype=np.uint16)
        ids.tofile(os.path.join(out_dir, f"{name}.bin"))
        print(f"{name}.bin: {len(ids):,} tokens")


if __name__ == "__main__":
    try:
        prepare()
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)

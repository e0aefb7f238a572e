"""Tiny Shakespeare, tokenized with GPT-2's BPE (tiktoken).

Writes train.bin and val.bin (uint16 token ids, first 90% / last 10% of the text) next to this
file; no meta.pkl, so train.py uses GPT-2's vocabulary and sample.py decodes with tiktoken.
Uses input.txt here if present, else downloads it.

    python data/shakespeare/prepare.py
"""
import os
import sys
import urllib.request

import numpy as np

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
HERE = os.path.dirname(os.path.abspath(__file__))


def fetch(input_path, url):
    """The text at input_path, downloading it from url first if the file is not there."""
    if not os.path.exists(input_path):
        print(f"downloading {url}")
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                text = response.read().decode("utf-8")
        except (OSError, ValueError) as e:
            raise RuntimeError(f"could not download {url} ({e}); put the Tiny Shakespeare text "
                               f"at {input_path} and run again") from None
        with open(input_path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(input_path, encoding="utf-8") as f:
        return f.read()


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

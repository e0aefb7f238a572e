"""Tiny Shakespeare, one token per character.

Writes train.bin and val.bin (uint16 token ids, first 90% / last 10% of the text) and meta.pkl
(vocab_size, stoi, itos) next to this file. Uses input.txt here if present, else downloads it.

    python data/shakespeare_char/prepare.py
"""
import os
import pickle
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


def prepare(out_dir=HERE, input_path=None, url=URL):
    os.makedirs(out_dir, exist_ok=True)
    text = fetch(input_path or os.path.join(out_dir, "input.txt"), url)
    if len(text) < 2:
        raise RuntimeError(f"{input_path or out_dir + '/input.txt'} holds {len(text)} characters; "
                           f"it needs text to train on")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    ids = np.array([stoi[ch] for ch in text], dtype=np.uint16)
    split = int(0.9 * len(ids))
    ids[:split].tofile(os.path.join(out_dir, "train.bin"))
    ids[split:].tofile(os.path.join(out_dir, "val.bin"))
    with open(os.path.join(out_dir, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "stoi": stoi, "itos": itos}, f)
    print(f"{len(text):,} characters, vocab of {len(chars)}: {split:,} train tokens, "
          f"{len(ids) - split:,} val tokens, written to {out_dir}")
    return len(chars)


if __name__ == "__main__":
    try:
        prepare()
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)

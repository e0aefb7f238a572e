"""OpenWebText (~9B GPT-2 tokens), for config/gpt2.py.

Downloads the dataset from the Hugging Face hub with `datasets` (about 54 GB of cache), holds
out 0.05% as val, tokenizes with GPT-2's BPE on several processes, and writes train.bin
(~17 GB) and val.bin (uint16 token ids, one <|endoftext|> after each document) next to this
file. A copy saved earlier with `Dataset.save_to_disk` at data/openwebtext/local/ is used
instead of the download.

    python data/openwebtext/prepare.py [num_proc]
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
HUB_NAME = "Skylion007/openwebtext"
LOCAL_COPY = os.path.join(HERE, "local")


def load_splits(num_proc, local_copy=LOCAL_COPY):
    """The train/val DatasetDict: from the local copy if there is one, else from the hub."""
    try:
        import datasets
    except ImportError:
        raise RuntimeError("this script needs the `datasets` package: pip install datasets") from None
    if os.path.isdir(local_copy):
        dataset = datasets.load_from_disk(local_copy)
    else:
        try:
            dataset = datasets.load_dataset(HUB_NAME, num_proc=num_proc)
        except Exception as e:
            raise RuntimeError(f"could not download {HUB_NAME} ({type(e).__name__}: {str(e)[:200]}); "
                               f"save a copy with datasets' save_to_disk at {local_copy} and run again") from None
    if isinstance(dataset, datasets.DatasetDict):
        dataset = dataset["train"]
    splits = dataset.train_test_split(test_size=0.0005, seed=2357, shuffle=True)
    splits["val"] = splits.pop("test")
    return splits


def tokenize_and_write(splits, out_dir, encoding, num_proc, shards=1024):
    """Tokenize each split's 'text' column on num_proc processes; write {split}.bin."""
    from tqdm import tqdm
    eot = encoding.eot_token

    def tokenize(example):
        ids = encoding.encode_ordinary(example["text"]) + [eot]
        return {"ids": ids, "len": len(ids)}

    for split, dataset in splits.items():
        tokenized = dataset.map(tokenize, remove_columns=["text"], desc=f"tokenizing {split}",
                                num_proc=num_proc)
        total = int(np.sum(tokenized["len"], dtype=np.uint64))
        path = os.path.join(out_dir, f"{split}.bin")
        out = np.memmap(path, dtype=np.uint16, mode="w+", shape=(total,))
        pos, shards = 0, max(1, min(shards, len(tokenized)))
        # Write in contiguous shards: one batch of ids in memory at a time.
        for i in tqdm(range(shards), desc=f"writing {path}"):
            batch = tokenized.shard(num_shards=shards, index=i, contiguous=True).with_format("numpy")
            ids = np.concatenate(batch["ids"]) if len(batch) else np.zeros(0, dtype=np.uint16)
            out[pos:pos + len(ids)] = ids
            pos += len(ids)
        out.flush()
        print(f"{path}: {total:,} tokens")


def main():
    num_proc = int(sys.argv[1]) if len(sys.argv) > 1 else max(1, (os.cpu_count() or 2) // 2)
    import tiktoken
    try:   # first, so that a missing encoding fails before a 54 GB download
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise RuntimeError(f"tiktoken could not load the GPT-2 encoding ({type(e).__name__}); "
                           f"it downloads its files once, so run this once with network access") from None
    tokenize_and_write(load_splits(num_proc), HERE, encoding, num_proc)


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)

"""Each data/*/prepare.py on small text made here: no downloads (a local copy is used, and a
failed download names the file to put in place)."""
import importlib.util
import os
import pickle

import numpy as np
import pytest
import tiktoken

from conftest import REPO, make_text

UNREACHABLE = "http://127.0.0.1:9/input.txt"   # refused at once: no network needed to fail


def load_prepare(dataset):
    spec = importlib.util.spec_from_file_location(f"prepare_{dataset}", os.path.join(REPO, "data", dataset, "prepare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_bpe():
    """A byte-level BPE with a few merges, standing in for GPT-2's (whose files would download)."""
    ranks = {bytes([i]): i for i in range(256)}
    for piece in (b"th", b"the", b"in", b"king", b" the", b"ou"):
        ranks[piece] = len(ranks)
    return tiktoken.Encoding(name="small", pat_str=r"""'s|'t| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+""",
                             mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)})


def test_char_prepare_uses_local_copy(tmp_path):
    text = make_text(5_000)
    (tmp_path / "input.txt").write_text(text)
    vocab_size = load_prepare("shakespeare_char").prepare(str(tmp_path), url=UNREACHABLE)
    with open(tmp_path / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    assert vocab_size == meta["vocab_size"] == len(set(text))
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    assert len(train) == int(0.9 * len(text)) and len(train) + len(val) == len(text)
    assert "".join(meta["itos"][int(i)] for i in np.concatenate([train, val])) == text


def test_char_prepare_failed_download_says_where_to_put_the_file(tmp_path):
    with pytest.raises(RuntimeError) as e:
        load_prepare("shakespeare_char").prepare(str(tmp_path), url=UNREACHABLE)
    assert f"put the Tiny Shakespeare text at {tmp_path}/input.txt" in str(e.value)
    assert not (tmp_path / "train.bin").exists()


def test_bpe_prepare_round_trips(tmp_path):
    text = make_text(8_000, seed=1)
    (tmp_path / "input.txt").write_text(text)
    encoding = small_bpe()
    load_prepare("shakespeare").prepare(str(tmp_path), url=UNREACHABLE, encoding=encoding)
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16).tolist()
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16).tolist()
    assert len(train) < 0.9 * len(text)   # the merges did merge
    assert encoding.decode(train) + encoding.decode(val) == text
    assert not (tmp_path / "meta.pkl").exists()   # no char vocab: GPT-2 BPE downstream


def test_bpe_prepare_failed_download(tmp_path):
    with pytest.raises(RuntimeError, match=f"at {tmp_path}/input.txt and run again"):
        load_prepare("shakespeare").prepare(str(tmp_path), url=UNREACHABLE, encoding=small_bpe())


def test_openwebtext_tokenize_and_write_multiprocess(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = [make_text(300 + 37 * i, seed=i) for i in range(12)]
    splits = {"train": datasets.Dataset.from_dict({"text": docs[:9]}),
              "val": datasets.Dataset.from_dict({"text": docs[9:]})}
    encoding = small_bpe()
    load_prepare("openwebtext").tokenize_and_write(splits, str(tmp_path), encoding, num_proc=2, shards=4)
    for split, split_docs in (("train", docs[:9]), ("val", docs[9:])):
        ids = np.fromfile(tmp_path / f"{split}.bin", dtype=np.uint16).tolist()
        expected = [t for doc in split_docs for t in encoding.encode_ordinary(doc) + [encoding.eot_token]]
        assert ids == expected, split


def test_openwebtext_uses_a_local_copy(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = [f"document {i}: " + make_text(200, seed=i) for i in range(40)]
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "local"))
    splits = load_prepare("openwebtext").load_splits(1, local_copy=str(tmp_path / "local"))
    assert set(splits) == {"train", "val"}
    assert len(splits["val"]) == 1 and len(splits["train"]) == 39   # 0.05% held out, at least one
    assert sorted(list(splits["train"]["text"]) + list(splits["val"]["text"])) == sorted(docs)

"""sample.py: deterministic for a seed, cache == no cache, prompts from text or file, char and
BPE decoding, and clear errors."""
import pytest
import tiktoken
import torch

import sample
import train
from conftest import assert_one_line_error, run_script, tiny_config


@pytest.fixture(scope="module")
def trained(char_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    train.train(tiny_config(char_data, out, max_iters=10))
    return str(out)


def sample_config(out_dir, **overrides):
    return {**sample.DEFAULTS, "out_dir": out_dir, "device": "cpu", "num_samples": 2,
            "max_new_tokens": 40, **overrides}


def test_same_seed_same_text_other_seed_other_text(trained, capsys):
    a = sample.sample(sample_config(trained, seed=1))
    b = sample.sample(sample_config(trained, seed=1))
    c = sample.sample(sample_config(trained, seed=2))
    assert a == b and a != c
    assert len(a) == 2 and all(text.startswith("\n") and len(text) == 41 for text in a)
    assert "kernels used: attention=torch" in capsys.readouterr().out


def test_cache_path_matches_no_cache_path(trained):
    # 60 new tokens after a 5-character prompt outgrow block_size=32, so the window slides too
    kwargs = dict(start="KING:", max_new_tokens=60, seed=3)
    assert sample.sample(sample_config(trained, use_cache=True, **kwargs)) == \
        sample.sample(sample_config(trained, use_cache=False, **kwargs))


def test_prompt_from_file(trained, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("QUEEN:\nGood")
    texts = sample.sample(sample_config(trained, start=f"FILE:{prompt}"))
    assert all(text.startswith("QUEEN:\nGood") for text in texts)


def test_unknown_character_is_refused(trained):
    with pytest.raises(sample.ConfigError, match="never saw"):
        sample.sample(sample_config(trained, start="\u00e9t\u00e9"))


def test_bpe_checkpoint_decodes_with_tiktoken(trained, tmp_path, monkeypatch):
    # A checkpoint without a char vocabulary is decoded as GPT-2 BPE. GPT-2's files would be
    # downloaded, so a small byte-level encoding stands in for it here.
    ckpt = torch.load(f"{trained}/ckpt.pt", weights_only=False)
    ckpt["vocab"] = None
    ckpt["model_args"]["vocab_size"] = 256   # one token per byte: any text encodes
    ckpt["model"]["wte.weight"] = torch.randn(256, ckpt["model_args"]["n_embd"]) * 0.02
    ckpt["model"]["lm_head.weight"] = ckpt["model"]["wte.weight"]
    bpe_dir = tmp_path / "bpe"
    bpe_dir.mkdir()
    torch.save(ckpt, bpe_dir / "ckpt.pt")
    small = tiktoken.Encoding(name="bytes", pat_str=r"\S+|\s+",
                              mergeable_ranks={bytes([i]): i for i in range(256)},
                              special_tokens={})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: small)
    texts = sample.sample(sample_config(str(bpe_dir), start="KING", max_new_tokens=20))
    assert all(text.startswith("KING") for text in texts)


def test_checkpoint_recorded_as_tk_loads_on_cpu(trained, tmp_path):
    # The kernel choice is only a record: the weights are plain tensors.
    ckpt = torch.load(f"{trained}/ckpt.pt", weights_only=False)
    ckpt["kernels"] = {"plan": dict.fromkeys(("attention", "layernorm", "mlp"), "tk"),
                       "used": dict.fromkeys(("attention", "layernorm", "mlp"), "tk")}
    (tmp_path / "tk").mkdir()
    torch.save(ckpt, tmp_path / "tk" / "ckpt.pt")
    assert len(sample.sample(sample_config(str(tmp_path / "tk"), kernels="torch"))) == 2


def test_checkpoint_trained_with_dropout_samples_without_it(trained, tmp_path, monkeypatch):
    # A GPU run trains with dropout (the branches' fused into the tk layernorm); its checkpoint
    # records dropout=0.2 and tk. On the CPU it must sample with every dropout off: the text is
    # that of the same weights recorded with dropout 0, and no op is asked for a dropout.
    import kernels
    ckpt = torch.load(f"{trained}/ckpt.pt", weights_only=False)
    ckpt["model_args"].update(dropout=0.2, attn_dropout=0.2)
    ckpt["kernels"] = {"plan": dict.fromkeys(("attention", "layernorm", "mlp", "lm_head"), "tk"),
                       "used": dict.fromkeys(("attention", "layernorm", "mlp", "lm_head"), "tk")}
    (tmp_path / "drop").mkdir()
    torch.save(ckpt, tmp_path / "drop" / "ckpt.pt")
    asked = []   # (op, the dropout_p it was given)

    def spy(op, real):
        def call(*a, **k):
            p = a[5] if op == "add_layernorm" and len(a) > 5 else k.get("dropout_p", 0.0)   # model.py's call forms
            asked.append((op, p))
            return real(*a, **k)
        return call
    for op in ("add_layernorm", "attention", "attention_qkv"):
        monkeypatch.setattr(kernels, op, spy(op, getattr(kernels, op)))
    kwargs = dict(start="KING:", max_new_tokens=30, seed=4)
    with_dropout = sample.sample(sample_config(str(tmp_path / "drop"), **kwargs))
    assert {op for op, _ in asked} >= {"add_layernorm", "attention"}
    assert all(p == 0.0 for _, p in asked), sorted(set(asked))
    assert with_dropout == sample.sample(sample_config(trained, **kwargs))

def test_cli_bad_prompts_are_one_line(trained, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_one_line_error(run_script("sample.py", f"--out_dir={trained}", f"--start=FILE:{empty}"),
                          "prompt file is empty")
    assert_one_line_error(run_script("sample.py", f"--out_dir={tmp_path}"), "no checkpoint at")

"""model.py on the reference path: shapes, initial loss, GPT-2 init, parity with the textbook
pre-LN block, the kernels seam, and the KV cache."""
import math

import pytest
import torch
import torch.nn.functional as F

import kernels
from model import GPT, GPTConfig, KVCache, TokenEmbedding

SMALL = dict(block_size=16, vocab_size=67, n_layer=3, n_head=2, n_embd=24)


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, **overrides}))


@pytest.fixture(autouse=True)
def reference_kernels():
    kernels.configure("torch")
    yield
    kernels.configure("auto")


def test_shapes_and_initial_loss_near_ln_vocab():
    model = make_model(vocab_size=500, n_embd=48)
    idx, targets = torch.randint(500, (2, 4, 16))
    logits, loss = model(idx, targets)
    assert logits is None   # training: the fused LM head + cross-entropy returns the loss alone
    # random init (std 0.02) gives near-uniform predictions: loss close to ln(vocab)
    assert abs(loss.item() - math.log(500)) < 0.1, loss.item()
    logits, loss = model(idx[:, :7])
    assert logits.shape == (4, 1, 500) and loss is None   # generation needs the last position only


def test_too_long_sequence_is_refused():
    with pytest.raises(ValueError, match="longer than block_size=16"):
        make_model()(torch.zeros(1, 17, dtype=torch.long))


def test_tied_head_biases_and_scaled_init():
    model = make_model(n_layer=8, n_embd=64, n_head=4, vocab_size=1000)
    assert model.lm_head.weight is model.wte.weight
    c_proj = model.h[0].mlp.c_proj.weight
    assert abs(c_proj.std().item() - 0.02 / math.sqrt(16)) < 0.001
    assert abs(model.h[0].mlp.c_fc.weight.std().item() - 0.02) < 0.002
    no_bias = make_model(bias=False)
    assert no_bias.h[0].ln_1.bias is None and no_bias.h[0].attn.c_attn.bias is None
    names = {n for n, _ in no_bias.named_parameters()}
    assert not any(n.endswith(".bias") for n in names)


def textbook_forward(model, idx):
    """nanoGPT's pre-LN GPT written out plainly in float64: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))."""
    c = model.config
    p = {n: t.detach().double() for n, t in model.named_parameters()}
    ln = lambda x, name: F.layer_norm(x, (c.n_embd,), p[name + ".weight"], p.get(name + ".bias"), 1e-5)
    B, T = idx.shape
    D = c.n_embd // c.n_head
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(c.n_layer):
        pre = f"h.{i}."
        qkv = F.linear(ln(x, pre + "ln_1"), p[pre + "attn.c_attn.weight"], p.get(pre + "attn.c_attn.bias"))
        q, k, v = (t.view(B, T, c.n_head, D).transpose(1, 2) for t in qkv.split(c.n_embd, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, c.n_embd)
        x = x + F.linear(y, p[pre + "attn.c_proj.weight"], p.get(pre + "attn.c_proj.bias"))
        h = F.gelu(F.linear(ln(x, pre + "ln_2"), p[pre + "mlp.c_fc.weight"], p.get(pre + "mlp.c_fc.bias")),
                   approximate="tanh")
        x = x + F.linear(h, p[pre + "mlp.c_proj.weight"], p.get(pre + "mlp.c_proj.bias"))
    return F.linear(ln(x, "ln_f"), p["wte.weight"])


@pytest.mark.parametrize("bias", [True, False])
def test_fused_residual_matches_textbook_pre_ln(bias):
    model = make_model(bias=bias)
    with torch.no_grad():   # random, non-trivial layernorm gains and biases
        for name, t in model.named_parameters():
            if "ln" in name or name.endswith(".bias"):
                t.copy_(torch.randn_like(t) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    idx, targets = torch.randint(SMALL["vocab_size"], (2, 3, 13))
    expected = textbook_forward(model, idx).double()
    # every position through the loss, the last position's logits exactly (generation's path)
    loss = model(idx, targets)[1].double()
    expected_loss = F.cross_entropy(expected.flatten(0, 1), targets.flatten())
    assert abs(loss - expected_loss) / expected_loss < 1e-5, (loss, expected_loss)
    ours = model(idx)[0].double()
    rel = (ours - expected[:, -1:]).norm() / expected[:, -1:].norm()
    assert rel < 1e-5, rel


def test_ops_go_through_the_kernels_seam(monkeypatch):
    calls = []
    for op in ("attention", "attention_qkv", "add_layernorm", "mlp", "lm_head_loss", "linear"):
        real = getattr(kernels, op)
        monkeypatch.setattr(kernels, op, lambda *a, _real=real, _op=op, **k: calls.append((_op, k)) or _real(*a, **k))
    model = make_model(dropout=0.1, attn_dropout=0.3)
    idx = torch.randint(SMALL["vocab_size"], (2, 9))
    model.train()
    model(idx, idx)
    n = SMALL["n_layer"]
    assert sum(op == "attention_qkv" for op, _ in calls) == n   # training: the packed op
    assert sum(op == "attention" for op, _ in calls) == 0
    assert sum(op == "add_layernorm" for op, _ in calls) == 2 * n + 1
    assert sum(op == "mlp" for op, _ in calls) == n
    assert sum(op == "lm_head_loss" for op, _ in calls) == 1
    assert sum(op == "linear" for op, _ in calls) == 2 * n   # the attention's c_attn and c_proj
    assert all(k["dropout_p"] == 0.3 and k["causal"] for op, k in calls if op == "attention_qkv")
    calls.clear()
    model.eval()
    model(idx, idx)
    assert all(k["dropout_p"] == 0.0 for op, k in calls if op == "attention")
    kernels.reset_used()
    model(idx, idx)
    assert kernels.used() == {"attention": "torch", "layernorm": "torch", "mlp": "torch", "lm_head": "torch",
                              "linear": "torch"}


def test_token_embedding_backward_matches_f_embedding():
    """The scatter-add backward (model.TokenEmbedding) gives F.embedding's gradient, ids repeated."""
    torch.manual_seed(0)
    w = torch.randn(101, 24, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(101, (3, 17))
    idx[0, :5] = 7                       # one row hit six or more times
    g = torch.randn(3, 17, 24, dtype=torch.float64)
    out = TokenEmbedding.apply(idx, w)
    assert torch.equal(out, F.embedding(idx, w))
    (out * g).sum().backward()
    ours, w.grad = w.grad, None
    (F.embedding(idx, w) * g).sum().backward()
    assert ours[7].abs().sum() > 0
    torch.testing.assert_close(ours, w.grad, rtol=1e-12, atol=1e-12)
    w.grad = None
    torch.use_deterministic_algorithms(True)
    try:                                 # the sorted path PyTorch keeps for deterministic runs
        (TokenEmbedding.apply(idx, w) * g).sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(ours, w.grad, rtol=1e-12, atol=1e-12)


def test_optimizer_groups_decay_matrices_only():
    model = make_model()
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_params(non_embedding=False)


def test_kv_cache_logits_match_full_forward():
    model = make_model().eval()
    idx = torch.randint(SMALL["vocab_size"], (2, 11))
    with torch.no_grad():
        full = model.lm_head(model.ln_f.add_norm(*_stream(model, idx))[0])
        cache = KVCache(model.config.n_layer)
        steps = [model(idx[:, :5], cache=cache)[0][:, -1]]      # prefill 5, then one at a time
        for t in range(5, 11):
            steps.append(model(idx[:, t:t + 1], cache=cache)[0][:, -1])
    assert cache.length == 11
    cached = torch.stack(steps, dim=1)
    torch.testing.assert_close(cached, full[:, 4:], rtol=1e-5, atol=1e-5)


def _stream(model, idx):
    h, branch = model.wte(idx) + model.wpe(torch.arange(idx.size(1))), None
    for block in model.h:
        h, branch = block(h, branch)
    return h, branch


@pytest.mark.parametrize("new_tokens", [6, 30])   # 30 outgrows block_size=16: the window slides
def test_generate_with_cache_equals_without(new_tokens):
    model = make_model().eval()
    prompt = torch.randint(SMALL["vocab_size"], (3, 4))
    out = {}
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(7)
        out[use_cache] = model.generate(prompt, new_tokens, temperature=0.9, top_k=20,
                                        use_cache=use_cache, generator=g)
    assert out[True].shape == (3, 4 + new_tokens)
    assert torch.equal(out[True], out[False])
    assert torch.equal(out[True][:, :4], prompt)


def test_top_k_one_is_greedy():
    model = make_model().eval()
    prompt = torch.randint(SMALL["vocab_size"], (1, 3))
    out = model.generate(prompt, 1, top_k=1)
    with torch.no_grad():
        expected = model(prompt)[0][0, -1].argmax()
    assert out[0, -1] == expected

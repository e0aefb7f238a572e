"""The PyTorch reference twin of every tk kernel.

These are the fast PyTorch ops a user would pick anyway (SDPA, F.layer_norm, tanh-GELU), not
slow strawmen: the `torch` switch runs them, the tests compare the kernels against them, and
they run anywhere, CPU included.
"""
import torch
import torch.nn.functional as F


def add_layernorm(x, residual, weight, bias, eps=1e-5, dropout_p=0.0):
    """h = x + residual (or x when residual is None); y = LayerNorm(h). Returns (y, h).
    dropout_p > 0: h = x + F.dropout(residual, dropout_p) (as a training nn.Dropout would)."""
    if residual is not None and dropout_p > 0:
        residual = F.dropout(residual, dropout_p)
    h = x if residual is None else x + residual
    y = F.layer_norm(h, (h.shape[-1],), weight, bias, eps)
    return y, h


def attention(q, k, v, causal=True, dropout_p=0.0, scale=None):
    """Scaled dot-product attention on (B, H, T, D) tensors."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)


def attention_qkv(qkv, causal=True, dropout_p=0.0, scale=None):
    """attention() on the packed c_attn output qkv (B, T, 3, H, D); returns (B, T, H, D)."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return attention(q, k, v, causal, dropout_p, scale).transpose(1, 2)


def mlp(x, w_fc, b_fc, w_proj, b_proj):
    """y = GELU_tanh(x @ w_fc.T + b_fc) @ w_proj.T + b_proj (biases may be None)."""
    h = F.gelu(F.linear(x, w_fc, b_fc), approximate="tanh")
    return F.linear(h, w_proj, b_proj)


def linear(x, weight, bias=None):
    """y = x @ weight.T + bias: F.linear (under autocast: bf16 in and out, as for nn.Linear)."""
    return F.linear(x, weight, bias)


def lm_head_loss(x, weight, targets):
    """Mean cross-entropy of x @ weight.T against targets (-1 = ignored), x (N, C), weight (V, C):
    the (N, V) logits are materialized, exactly as nanoGPT's model does."""
    logits = F.linear(x, weight)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)

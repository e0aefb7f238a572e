"""The GPT-2 model, in one file.

Token + position embeddings, a stack of pre-LN transformer blocks (causal self-attention, GELU
MLP), a final layernorm and a language-model head tied to the token embedding. The hot ops go
only through the `kernels` package, which runs either our tk CUDA kernels or their
PyTorch reference twins (see kernels/__init__.py):

    kernels.add_layernorm(x, residual, w, b)  ->  (LayerNorm(x + residual), x + residual)
    kernels.attention_qkv(qkv, causal, dropout_p)   (qkv: the c_attn output as (B, T, 3, H, D);
                                                    kernels.attention(q, k, v) when sampling)
    kernels.mlp(x, w_fc, b_fc, w_proj, b_proj)     (c_fc -> GELU(tanh) -> c_proj)
    kernels.lm_head_loss(y, wte, targets)          (the LM head and its cross-entropy, in training)
    kernels.linear(x, w, b)                        (the attention's c_attn and c_proj: x·wᵀ + b)

The residual add is fused into the next layernorm, so the residual stream is carried as a pair
(h, branch): the running sum so far, and the latest branch output not yet added to it. That is
the same arithmetic as nanoGPT's `x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`, with one fewer
pass over memory per add. A branch's dropout (nanoGPT's resid_dropout and the MLP's dropout) is
applied there too, when the branch is added: h = h + dropout(branch) inside the same op.
"""
import math
import os
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from kernels import reference


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304      # GPT-2's 50257 rounded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0         # on embeddings and on each residual branch
    attn_dropout: float = -1.0   # on attention probabilities; -1 means "same as dropout"
    bias: bool = True            # biases in Linears and LayerNorms, as GPT-2 has

    def __post_init__(self):
        if self.attn_dropout < 0:
            self.attn_dropout = self.dropout
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")


class LayerNorm(nn.Module):
    """Holds a layernorm's weight and optional bias; the op itself is kernels.add_layernorm.
    dropout: of the residual branch it adds (in training)."""

    def __init__(self, ndim, bias, dropout=0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.dropout = dropout

    def add_norm(self, x, residual):
        """(LayerNorm(x + dropout(residual)), x + dropout(residual)); residual may be None."""
        p = self.dropout if self.training else 0.0
        return kernels.add_layernorm(x, residual, self.weight, self.bias, 1e-5, p)


class KVCache:
    """Keys and values of the tokens seen so far, per layer, so that each new token costs one
    query against the cache instead of a forward pass over the whole sequence."""

    def __init__(self, n_layer):
        self.k = [None] * n_layer
        self.v = [None] * n_layer
        self.length = 0          # tokens already in the cache (the next token's position)

    def append(self, layer, k, v):
        """Store this step's (B, H, T, D) keys/values; return all keys/values so far."""
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        return self.k[layer], self.v[layer]


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.attn_dropout = config.attn_dropout
        self.layer = layer

    def forward(self, x, cache=None):
        B, T, C = x.shape
        # c_attn and c_proj go through the switch (kernels.linear: the tk GEMM or F.linear); the
        # nn.Linear modules only hold the parameters, so checkpoints and init are unchanged.
        qkv = kernels.linear(x, self.c_attn.weight, self.c_attn.bias)
        qkv = qkv.view(B, T, 3, self.n_head, C // self.n_head)
        dropout_p = self.attn_dropout if self.training else 0.0
        if cache is None:
            # Training and evaluation: the packed op reads q, k, v in place from the c_attn
            # output, and the tk kernel writes their gradient back as one (B, T, 3, H, D) tensor.
            y = kernels.attention_qkv(qkv, causal=True, dropout_p=dropout_p)   # (B, T, H, D)
        else:
            # (B, T, 3, H, D) -> (3, B, H, T, D): q, k, v as strided views, no copy.
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            if cache.length == 0:
                cache.append(self.layer, k, v)
                y = kernels.attention(q, k, v, causal=True, dropout_p=dropout_p)
            else:
                # One new query against all cached keys: every key is in the past, so no mask.
                # The tk kernels are written for training shapes (T_q == T_k); this
                # matrix-vector step goes to the reference op directly.
                if T != 1:
                    raise ValueError(f"a cached step takes one token at a time, got {T}")
                k_all, v_all = cache.append(self.layer, k, v)
                y = reference.attention(q, k_all, v_all, causal=False)
            y = y.transpose(1, 2)
        y = y.reshape(B, T, C)
        # its dropout is applied where it is added (LayerNorm.add_norm)
        return kernels.linear(y, self.c_proj.weight, self.c_proj.bias)


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):   # its dropout is applied where it is added (LayerNorm.add_norm)
        return kernels.mlp(x, self.c_fc.weight, self.c_fc.bias, self.c_proj.weight, self.c_proj.bias)


class Block(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, config.bias, config.dropout)   # drops the previous MLP's output
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = LayerNorm(config.n_embd, config.bias, config.dropout)   # drops the attention output
        self.mlp = MLP(config)

    def forward(self, h, branch, cache=None):
        """h: residual stream so far; branch: previous block's MLP output, not yet added."""
        y, h = self.ln_1.add_norm(h, branch)
        a = self.attn(y, cache)
        y, h = self.ln_2.add_norm(h, a)
        return h, self.mlp(y)


class TokenEmbedding(torch.autograd.Function):
    """F.embedding(idx, weight) with a cheaper backward. PyTorch's eager embedding backward sorts
    the token ids to sum each row's gradients in a fixed order (about 0.5 ms of the GPT-2 step on
    the H200: 32768 ids into a 50304 x 768 table). Here each position's gradient is added into
    its row with atomic adds (index_add_), as the kernel torch.compile generates does: the
    summation order varies from run to run, in the last bits of fp32. Under
    torch.use_deterministic_algorithms(True) it keeps PyTorch's sorted backward."""

    @staticmethod
    def forward(ctx, idx, weight):
        ctx.save_for_backward(idx)
        ctx.rows = weight.shape[0]
        return F.embedding(idx, weight)

    @staticmethod
    def backward(ctx, grad):
        idx, = ctx.saved_tensors
        if torch.are_deterministic_algorithms_enabled():
            return None, torch.ops.aten.embedding_dense_backward(grad, idx, ctx.rows, -1, False)
        grad = grad.reshape(-1, grad.shape[-1])
        return None, grad.new_zeros(ctx.rows, grad.shape[1]).index_add_(0, idx.reshape(-1), grad)


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd, config.bias, config.dropout)   # drops the last MLP's output
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight   # tied: one matrix embeds and un-embeds tokens
        self.apply(self._init_weights)
        # GPT-2: scale the init of each residual branch's output projection by 1/sqrt(2 * n_layer),
        # so the residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=True):
        """Parameter count; position embeddings left out by default (token ones are tied to
        the head, so they do count)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None, cache=None):
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size="
                             f"{self.config.block_size}")
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        h, branch = self.drop(TokenEmbedding.apply(idx, self.wte.weight) + self.wpe(pos)), None
        for block in self.h:
            h, branch = block(h, branch, cache)
        if cache is not None:
            cache.length += T
        y, _ = self.ln_f.add_norm(h, branch)
        if targets is None:   # generation needs only the last position's logits
            return self.lm_head(y[:, [-1], :]), None
        # LM head + cross-entropy as one op: the tk version never holds the (B*T, vocab) logits
        # in full (kernels/lm_head_op.py), so none are returned while training
        loss = kernels.lm_head_loss(y.reshape(-1, y.size(-1)), self.lm_head.weight, targets.reshape(-1))
        return None, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # Decay the matrices (Linear weights, embeddings); leave biases and layernorm gains alone.
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        # The fused CUDA AdamW does the whole update in a few kernels instead of one per tensor.
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=(device_type == "cuda"))

    def flops_per_token(self):
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12 L H Q T."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """Extend idx (B, T) by max_new_tokens sampled tokens. With use_cache each step feeds
        only the newest token; once the sequence outgrows block_size the window slides and the
        cache is rebuilt from the last block_size tokens each step (the same result as without
        the cache, at the no-cache cost)."""
        block_size = self.config.block_size
        cache = None
        for _ in range(max_new_tokens):
            if use_cache and cache is not None and idx.size(1) <= block_size:
                logits, _ = self(idx[:, -1:], cache=cache)
            else:
                cache = KVCache(self.config.n_layer) if use_cache else None
                logits, _ = self(idx[:, -block_size:], cache=cache)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None and top_k > 0:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits.float(), dim=-1)
            next_token = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, next_token), dim=1)
        return idx


# ----------------------------------------------------------------------------- checkpoints

CHECKPOINT_FORMAT = "nanogpt-tk checkpoint v1"


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, or not one of ours; the message says which."""


def load_checkpoint(path, **overrides):
    """Read and validate a checkpoint written by train.py (always onto the CPU first; the
    caller moves the model). Returns the checkpoint dict and a GPT built from it; overrides
    replace model_args that do not change the weights' shapes (dropout, attn_dropout)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path} (train one with train.py, or pass "
                              f"--out_dir=DIR where DIR/ckpt.pt exists)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:   # truncated zip, not a torch file, ...
        raise CheckpointError(f"{path} cannot be read as a checkpoint (truncated or corrupt? "
                              f"{type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a nanogpt-tk checkpoint (no '{CHECKPOINT_FORMAT}' "
                              f"tag); it was written by some other program")
    try:
        model = GPT(GPTConfig(**{**ckpt["model_args"], **overrides}))
        model.load_state_dict(ckpt["model"])
    except (KeyError, TypeError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0][:200]
        raise CheckpointError(f"{path} does not match the model it describes ({first})") from None
    return ckpt, model


def model_args(config):
    return asdict(config)

"""Train a GPT: on one GPU, on the CPU, or on several GPUs with DDP.

    python train.py config/shakespeare_cpu.py                 # CPU, a few minutes
    python train.py config/shakespeare.py --kernels=torch     # one GPU, PyTorch reference ops
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py

Settings are the module-level names below; a config file (plain Python) overrides some, and
--key=value flags override the rest (see config/__init__.py). Under torchrun each rank runs
batch_size sequences per micro-step, and gradient_accumulation_steps (a global count) is
split among the ranks, so the global batch does not depend on the number of GPUs.
"""
import math
import os
import pickle
import random
import socket
import sys
import time
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kernels as kernel_switch   # (the name `kernels` is a setting below)
from config import ConfigError, defaults_from, run_script
from model import GPT, GPTConfig, CHECKPOINT_FORMAT, CheckpointError, load_checkpoint, model_args

# ----------------------------------------------------------------------------- defaults
# I/O
out_dir = "out"
eval_interval = 2000
eval_iters = 200
log_interval = 10
eval_only = False
always_save_checkpoint = True    # else save only when val loss improves
init_from = "scratch"            # 'scratch' or 'resume' (from out_dir/ckpt.pt)
# wandb
wandb_log = False
wandb_project = "nanogpt-tk"
wandb_run_name = "run"
# data
dataset = "openwebtext"          # a folder under data_dir with train.bin/val.bin, or 'synthetic'
data_dir = ""                    # '' = the data/ folder beside this file
gradient_accumulation_steps = 40  # global: split among DDP ranks
batch_size = 12                  # sequences per micro-step, per rank
block_size = 1024
vocab_size = 0                   # 0 = from the dataset's meta.pkl, else GPT-2's (padded)
# model
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0                    # embeddings and residual branches
attn_dropout = -1.0              # attention probabilities; -1 = same as dropout
bias = False
# AdamW
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0                  # 0 disables clipping
# learning rate schedule: linear warmup, then cosine down to min_lr
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 600000
min_lr = 6e-5
# system
device = "auto"                  # 'auto' (cuda if present, else cpu), 'cpu', 'cuda', 'cuda:1'
dtype = "auto"                   # 'auto', 'bfloat16', 'float16' (with GradScaler), 'float32'
compile = False                  # torch.compile the model
cuda_graphs = False              # replay each micro-step and eval batch from a CUDA graph (1 GPU,
                                 # no DDP or compile; elsewhere it is ignored with a message)
ddp_bucket_cap_mb = 25           # DDP: gradients are all-reduced in buckets of this many MB, each
                                 # as soon as its gradients are ready (overlapping the backward);
                                 # 25 is PyTorch's default, config/gpt2.py sets 100
seed = 1337
# kernels: 'auto' (tk where it can run, else torch), 'tk', 'torch'; per op '' follows kernels
kernels = "auto"
kernels_attention = ""
kernels_layernorm = ""
kernels_mlp = ""
kernels_lm_head = ""              # the LM head + cross-entropy, fused on tk
kernels_linear = "torch"          # the attention's c_attn and c_proj on the tk GEMM: off by default,
                                 # slower end to end (GPT-2 step 59.82 vs 59.03 ms, NOTES session 6)
DEFAULTS = defaults_from(globals())
# -----------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_VOCAB = 50304   # 50257 rounded up to a multiple of 64, for faster matmuls

# Dense bf16 tensor-core peak per GPU, for MFU. An unknown GPU gets no MFU, not a wrong one.
PEAK_BF16_FLOPS = [("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12)]


class Graphed:
    """A function of fixed-shape CUDA tensors, captured once in a CUDA graph, then replayed.

    A small model's step is hundreds of small kernels, and launching them one by one from
    Python can take longer than running them: a graph launches the whole recorded sequence
    with one call. Each call copies its inputs into the buffers the graph was captured with
    and returns the graph's own output tensors, which the next replay overwrites. The first
    `warmup` calls run eagerly on a side stream, as PyTorch asks before a capture, so that
    lazy set-up (cuBLAS workspaces, extension loads, .grad allocation) is not recorded.
    What is recorded is frozen: shapes, the kernels the switch picked, train/eval mode, and
    the addresses of every tensor the function touches (parameters and their .grad)."""

    def __init__(self, fn, name, warmup=2):
        self.fn, self.name, self.warmup = fn, name, warmup
        self.graph, self.inputs, self.outputs = None, None, None

    def __call__(self, *inputs):
        if self.graph is None and self.warmup > 0:
            self.warmup -= 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                outputs = self.fn(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            return outputs
        if self.graph is None:
            self.inputs = [x.clone() for x in inputs]
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    self.outputs = self.fn(*self.inputs)
            except RuntimeError as e:
                raise TrainingStopped(f"CUDA graph capture of the {self.name} failed: "
                                      f"{str(e).splitlines()[0]}; run with --cuda_graphs=False") from e
            self.graph = graph
        for static, x in zip(self.inputs, inputs):
            static.copy_(x, non_blocking=True)
        self.graph.replay()
        return self.outputs


class DataError(RuntimeError):
    pass


class TrainingStopped(RuntimeError):
    pass


class Batches:
    """Random windows of a token file (or random tokens for dataset=synthetic).

    Training windows come from one generator seeded alike on every rank: each iteration draws
    the whole global batch and each rank takes its own slice, so N ranks see exactly the data
    one process would. Its state goes into the checkpoint, so a resumed run sees the same
    batches as an uninterrupted one. Eval windows come from a fresh generator each eval: every
    eval scores the same windows, so successive val losses are comparable."""

    # A token file up to this size is read once and kept on the GPU: cutting windows there is a
    # few small kernels, where cutting them from a memmap costs ~0.4 ms of Python per batch
    # (64 windows of 257) plus two pinned copies, on the same thread that must keep a small
    # model's GPU busy (shakespeare_char: 1M tokens, 8 MB on the GPU).
    GPU_RESIDENT_MAX_TOKENS = 64 * 2**20

    def __init__(self, folder, vocab_size, batch_size, block_size, seed, device):
        self.folder, self.vocab_size = folder, vocab_size
        self.B, self.T, self.seed, self.device = batch_size, block_size, seed, device
        self.generator = torch.Generator().manual_seed(seed)
        self.resident = {}   # split -> the whole token file as int64 on the GPU, or None

    def _open(self, split):
        # A fresh memmap per batch: keeping one open leaks memory (numpy issue, see nanoGPT).
        data = np.memmap(os.path.join(self.folder, f"{split}.bin"), dtype=np.uint16, mode="r")
        if len(data) <= self.T + 1:
            raise DataError(f"{self.folder}/{split}.bin has {len(data)} tokens, too few for "
                            f"block_size={self.T}; use a smaller --block_size")
        return data

    def _resident(self, split):
        if split not in self.resident:
            data = self._open(split)
            small = self.device.startswith("cuda") and len(data) <= self.GPU_RESIDENT_MAX_TOKENS
            self.resident[split] = torch.from_numpy(data.astype(np.int64)).to(self.device) if small else None
        return self.resident[split]

    def _windows(self, split, n, generator):
        if self.folder is None:   # synthetic: uniformly random tokens
            xy = torch.randint(self.vocab_size, (n, self.T + 1), generator=generator)
        elif (tokens := self._resident(split)) is not None:
            # The same starts from the same generator as the memmap path: the same windows.
            starts = torch.randint(len(tokens) - self.T - 1, (n,), generator=generator)
            starts = starts.pin_memory().to(self.device, non_blocking=True)
            xy = tokens[starts[:, None] + torch.arange(self.T + 1, device=self.device)]
            return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
        else:
            data = self._open(split)
            starts = torch.randint(len(data) - self.T - 1, (n,), generator=generator).tolist()
            xy = torch.from_numpy(np.stack([data[s:s + self.T + 1].astype(np.int64) for s in starts]))
        x, y = xy[:, :-1], xy[:, 1:]
        if self.device.startswith("cuda"):   # pinned + non_blocking: the copy overlaps compute
            return (x.contiguous().pin_memory().to(self.device, non_blocking=True),
                    y.contiguous().pin_memory().to(self.device, non_blocking=True))
        return x.contiguous().to(self.device), y.contiguous().to(self.device)

    def train_step(self, total_micro_steps, first, count):
        """This rank's `count` micro-batches, starting at global micro-step `first`."""
        x, y = self._windows("train", total_micro_steps * self.B, self.generator)
        return [(x[i * self.B:(i + 1) * self.B], y[i * self.B:(i + 1) * self.B])
                for i in range(first, first + count)]

    def eval_batches(self, split, n):
        """n batches, drawn one at a time as the loop asks (a generator, not a list): the next
        batch is cut on the CPU while the GPU still runs the previous one."""
        generator = torch.Generator().manual_seed(self.seed + (1 if split == "train" else 2))
        for _ in range(n):
            yield self._windows(split, self.B, generator)


def find_data(c, master):
    """The dataset folder (None for synthetic) and its char vocabulary (None for GPT-2 BPE)."""
    if c.dataset == "synthetic":
        return None, None
    folder = os.path.join(c.data_dir or os.path.join(HERE, "data"), c.dataset)
    if not os.path.exists(os.path.join(folder, "train.bin")) and c.dataset == "shakespeare_char":
        if master:   # small enough to prepare on the spot
            print(f"{folder}/train.bin not found: running its prepare.py")
            import importlib.util
            spec = importlib.util.spec_from_file_location("prepare", os.path.join(HERE, "data", "shakespeare_char", "prepare.py"))
            prepare = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(prepare)
            try:
                prepare.prepare(folder)
            except RuntimeError as e:
                raise DataError(str(e)) from None
        if dist.is_initialized():
            dist.barrier()
    for split in ("train", "val"):
        if not os.path.exists(os.path.join(folder, f"{split}.bin")):
            raise DataError(f"{folder}/{split}.bin not found: run python data/{c.dataset}/prepare.py "
                            f"first (or pick another --dataset; 'synthetic' needs no files)")
    meta_path = os.path.join(folder, "meta.pkl")
    if os.path.exists(meta_path):
        with open(meta_path, "rb") as f:
            return folder, pickle.load(f)
    return folder, None


def get_lr(it, c):
    if not c.decay_lr:
        return c.learning_rate
    if it < c.warmup_iters:
        return c.learning_rate * (it + 1) / (c.warmup_iters + 1)
    if it > c.lr_decay_iters:
        return c.min_lr
    progress = (it - c.warmup_iters) / max(1, c.lr_decay_iters - c.warmup_iters)
    return c.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (c.learning_rate - c.min_lr)


def peak_flops(device):
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in name), None)


def save_checkpoint(path, state):
    """Write to a temporary file, flush it to disk, then rename over the old checkpoint: a
    crash at any moment leaves either the old checkpoint or the new one, never half of one."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_states():
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_states(states):
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if states.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def start_wandb(c, config):
    try:
        import wandb
    except ImportError:
        raise ConfigError("wandb_log=True but wandb is not installed: pip install wandb, "
                          "or run with --wandb_log=False") from None
    mode = os.environ.get("WANDB_MODE")
    if mode is None:
        try:
            socket.create_connection(("api.wandb.ai", 443), timeout=3).close()
            mode = "online"
        except OSError:
            mode = "offline"
            print("wandb: no network, logging offline (upload later with `wandb sync`)")
    return wandb.init(project=c.wandb_project, name=c.wandb_run_name, config=config, mode=mode,
                      dir=c.out_dir)


def train(config):
    """Run training with a config dict (DEFAULTS + overrides). Returns a summary dict."""
    c = SimpleNamespace(**config)   # attribute access: c.batch_size
    t_start = time.time()
    if c.init_from not in ("scratch", "resume"):
        raise ConfigError(f"init_from={c.init_from!r}: use 'scratch' or 'resume'")
    if not c.ddp_bucket_cap_mb > 0:   # (used only under torchrun; refused before any process group)
        raise ConfigError(f"ddp_bucket_cap_mb={c.ddp_bucket_cap_mb}: give a bucket size in MB > 0 (PyTorch's default is 25)")
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank, local_rank, world = 0, 0, 1
    dev = c.device if c.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if ddp:
        rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        if dev.startswith("cuda"):
            dev = f"cuda:{local_rank}"
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.startswith("cuda") else "gloo")
    master = rank == 0
    if c.gradient_accumulation_steps % world:
        raise ConfigError(f"gradient_accumulation_steps={c.gradient_accumulation_steps} must be a "
                          f"multiple of the number of ranks ({world}): it counts micro-steps of the "
                          f"whole global batch, e.g. --gradient_accumulation_steps={world}")
    accum = c.gradient_accumulation_steps // world
    device_type = "cuda" if dev.startswith("cuda") else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={c.device!r} but CUDA is not available here; use --device=cpu")
    dtype_name = c.dtype
    if dtype_name == "auto":
        dtype_name = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if device_type == "cuda" else "float32"
    if dtype_name not in ("bfloat16", "float16", "float32"):
        raise ConfigError(f"dtype={c.dtype!r}: use auto, bfloat16, float16 or float32")
    if dtype_name == "float16" and device_type == "cpu":
        raise ConfigError("dtype=float16 needs a GPU; on the CPU use bfloat16 or float32")
    # CUDA graphs are a speed setting (config/shakespeare.py turns them on): where they cannot
    # be used the run goes on without them and says so once.
    graphs_off = ("there is no GPU" if device_type != "cuda" else "under torchrun/DDP" if ddp
                  else "with compile=True (use compile's mode='reduce-overhead' for graphs)" if c.compile else None)
    if c.cuda_graphs and graphs_off:
        if master:
            print(f"cuda_graphs=True: not used {graphs_off}; running without CUDA graphs")
        c.cuda_graphs = False
    ptdtype = getattr(torch, dtype_name)
    # autocast's cache of bf16 weight copies would be captured into the graph stale; a graph
    # replays the casts instead
    autocast = (nullcontext() if dtype_name == "float32"
                else torch.autocast(device_type, dtype=ptdtype, cache_enabled=not c.cuda_graphs))
    torch.manual_seed(c.seed + rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        kernel_switch.configure(c.kernels, **{op: getattr(c, f"kernels_{op}") for op in kernel_switch.OPS})
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # What this run's ops ran on, for the log and the checkpoint: not what an earlier run (or test)
    # in the same process ran on.
    kernel_switch.reset_used()
    if master:
        os.makedirs(c.out_dir, exist_ok=True)

    folder, vocab = find_data(c, master)
    vocab_size = c.vocab_size or (vocab["vocab_size"] if vocab else GPT2_VOCAB)

    # model, optimizer, and everything a resumed run needs to continue exactly
    ckpt_path = os.path.join(c.out_dir, "ckpt.pt")
    iter_num, best_val_loss, ckpt = 0, float("inf"), None
    if c.init_from == "resume":
        ckpt, model = load_checkpoint(ckpt_path, dropout=c.dropout, attn_dropout=c.attn_dropout)
        for key, value in ckpt["model_args"].items():
            if key in config and key not in ("dropout", "attn_dropout") and config[key] not in (value, 0):
                print(f"resume: keeping the checkpoint's {key}={value} (config says {config[key]})")
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    else:
        model = GPT(GPTConfig(block_size=c.block_size, vocab_size=vocab_size, n_layer=c.n_layer,
                              n_head=c.n_head, n_embd=c.n_embd, dropout=c.dropout,
                              attn_dropout=c.attn_dropout, bias=c.bias))
    mc = model.config
    model.to(dev)
    batches = Batches(folder, mc.vocab_size, c.batch_size, mc.block_size, c.seed, dev)
    tokens_per_iter = c.gradient_accumulation_steps * c.batch_size * mc.block_size
    plan = kernel_switch.preflight(c.batch_size, mc.block_size, mc.n_embd, mc.n_head, ptdtype, dev,
                                   attn_dropout=mc.attn_dropout, bias=mc.bias)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype_name == "float16"))
    optimizer = model.configure_optimizers(c.weight_decay, c.learning_rate, (c.beta1, c.beta2), device_type)
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        set_rng_states(ckpt["rng"])
        if ddp and rank:   # every rank draws its own dropout masks
            torch.manual_seed(c.seed + rank + iter_num)
        batches.generator.set_state(ckpt["sampler"])
        ckpt = None   # free the memory
    raw_model = model
    if c.compile:
        kernel_switch.prepare_for_compile()   # inductor's fallbacks for the tk ops (torch 2.11's compile stalls without)
        model = torch.compile(model)
    eval_model = model   # compiled if asked, but outside DDP: eval needs no gradient sync
    if ddp:
        # gradient_as_bucket_view: .grad tensors are views into the all-reduce buckets, so the
        # gradients are not copied into the buckets and back (two passes over 0.5 GB for GPT-2)
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None,
                    bucket_cap_mb=c.ddp_bucket_cap_mb, gradient_as_bucket_view=True)
    peak = peak_flops(dev) if dtype_name != "float32" else None
    if master:
        print(f"device {dev} ({torch.cuda.get_device_name(dev) if device_type == 'cuda' else 'cpu'}), "
              f"dtype {dtype_name}, ranks {world}, {tokens_per_iter:,} tokens/iter, "
              f"{raw_model.num_params() / 1e6:.2f}M parameters")
        print("kernels: " + ", ".join(f"{op}={how}" for op, how in plan.items()))
    run = start_wandb(c, config) if c.wandb_log and master else None

    def eval_loss(x, y):
        with autocast:
            return eval_model(x, y)[1]

    def micro_step(x, y):   # forward and backward of one micro-batch; gradients add into .grad
        with autocast:
            _, loss = model(x, y)
            loss = loss / accum
        scaler.scale(loss).backward()
        return loss.detach()

    if c.cuda_graphs:   # two graphs: the training micro-step (train mode) and an eval batch
        eval_loss, micro_step = Graphed(eval_loss, "eval forward"), Graphed(micro_step, "training step")

    @torch.no_grad()
    def estimate_loss():
        # Every rank evaluates the same windows with the same weights, so every rank reaches
        # the same decisions (save, stop) without talking to the others.
        eval_model.eval()
        out = {}
        for split in ("train", "val"):
            losses = torch.zeros(c.eval_iters, device=dev)
            for i, (x, y) in enumerate(batches.eval_batches(split, c.eval_iters)):
                losses[i] = eval_loss(x, y)
            out[split] = losses.mean().item()
        eval_model.train()
        return out

    def checkpoint_state():
        return {"format": CHECKPOINT_FORMAT, "model": raw_model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler.is_enabled() else None,
                "model_args": model_args(raw_model.config), "config": dict(config),
                "iter_num": iter_num, "best_val_loss": best_val_loss, "rng": rng_states(),
                "sampler": batches.generator.get_state(), "vocab": vocab,
                "kernels": {"plan": plan, "used": kernel_switch.used()}}

    history, intervals, saved_iter, eval_s = [], [], None, 0.0
    resumed_at = iter_num if c.init_from == "resume" else None
    t_last, iters_since = time.time(), 0
    while True:
        lr = get_lr(iter_num, c)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if (iter_num % c.eval_interval == 0 or iter_num == c.max_iters) and iter_num != resumed_at:
            t_eval = time.time()
            losses = estimate_loss()
            eval_s += time.time() - t_eval
            if master:
                print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if not all(math.isfinite(v) for v in losses.values()):
                stop(f"eval loss is {losses} at iter {iter_num}", c, saved_iter)
            if run:
                run.log({"iter": iter_num, "train/loss": losses["train"], "val/loss": losses["val"], "lr": lr})
            history.append((iter_num, "val", losses["val"]))
            if losses["val"] < best_val_loss or c.always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > 0 and master:
                    save_checkpoint(ckpt_path, checkpoint_state())
                    saved_iter = iter_num
                    print(f"saved {ckpt_path} (iter {iter_num}); kernels used: "
                          + ", ".join(f"{op}={how}" for op, how in kernel_switch.used().items()))
            t_last, iters_since = time.time(), 0   # leave eval time out of ms/iter
        if iter_num >= c.max_iters or c.eval_only:
            break

        # one optimizer step: `accum` micro-steps, gradients synced across ranks on the last
        loss_sum = torch.zeros((), device=dev)
        for i, (x, y) in enumerate(batches.train_step(c.gradient_accumulation_steps, rank * accum, accum)):
            if ddp:
                model.require_backward_grad_sync = i == accum - 1
            loss_sum += micro_step(x, y)
        if c.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        # A graph adds into the .grad tensors it was captured with: zero them in place, keep them.
        optimizer.zero_grad(set_to_none=not c.cuda_graphs)
        iter_num += 1
        iters_since += 1

        if iter_num % c.log_interval == 0 or iter_num == c.max_iters:
            if ddp:
                dist.all_reduce(loss_sum)
                loss_sum /= world
            lossf = loss_sum.item()   # waits for the GPU: only here, every log_interval
            dt = (time.time() - t_last) / iters_since
            t_last, iters_since = time.time(), 0
            if not math.isfinite(lossf):
                stop(f"training loss is {lossf} at iter {iter_num}", c, saved_iter)
            history.append((iter_num, "train", lossf))
            intervals.append(dt)
            if master:
                mfu = ""
                if peak:
                    mfu = f", mfu {100 * raw_model.flops_per_token() * tokens_per_iter / world / dt / peak:.1f}%"
                print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                      f"{tokens_per_iter / dt:,.0f} tok/s{mfu}")
                if run:
                    run.log({"iter": iter_num, "train/step_loss": lossf, "lr": lr, "ms_per_iter": dt * 1000})

    wall = time.time() - t_start
    steady = sorted(intervals[1:] or intervals)   # the first interval holds compile/warm-up
    tok_s = tokens_per_iter / steady[len(steady) // 2] if steady else float("nan")
    if master:
        print(f"summary: {iter_num} iters, wall {wall:.1f} s (evals {eval_s:.1f} s), {tok_s:,.0f} tok/s (median), "
              f"best val loss {best_val_loss:.4f}, kernels used: "
              + ", ".join(f"{op}={how}" for op, how in kernel_switch.used().items()))
    if run:
        run.finish()
    return {"history": history, "best_val_loss": best_val_loss, "iter_num": iter_num,
            "tokens_per_s": tok_s, "wall_s": wall}


def stop(what, c, saved_iter):
    kept = (f"the last good checkpoint ({c.out_dir}/ckpt.pt, iter {saved_iter}) is kept"
            if saved_iter is not None else "no checkpoint was written by this run")
    raise TrainingStopped(f"{what}; stopping: {kept}. Try a lower --learning_rate, "
                          f"--grad_clip=1.0, or --dtype=bfloat16/float32.")


def main(argv):
    try:
        return run_script(__doc__, DEFAULTS, argv, train, (DataError, CheckpointError, TrainingStopped,
                                                            kernel_switch.KernelUnavailable), __file__)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

# GPT-2 124M on OpenWebText, nanoGPT's reproduction recipe: 8 GPUs, about 4 days on A100s.
#   python data/openwebtext/prepare.py
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py
# Global batch: 12 sequences x 1024 tokens x 40 micro-steps = ~491K tokens per iteration, the
# same on any number of GPUs (the 40 micro-steps are split among the ranks).

out_dir = "out-gpt2"
wandb_run_name = "gpt2-124M"

dataset = "openwebtext"
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 40

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False

max_iters = 600000            # 300B tokens
lr_decay_iters = 600000
eval_interval = 1000
eval_iters = 200
log_interval = 10
weight_decay = 1e-1

compile = True
# DDP: buckets of 100 MB instead of PyTorch's 25. Two H200s, GPT-2 on tk, 32x1024 tokens per GPU
# (session 4): 995,949 tok/s with 100 MB, 987,210 with 25 MB, against 532,256 on one GPU.
ddp_bucket_cap_mb = 100

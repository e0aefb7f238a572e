# A small character-level GPT that trains on two CPU cores in a few minutes to val loss < 2.0.
#   python train.py config/shakespeare_cpu.py
#   python sample.py --out_dir=out-shakespeare-char-cpu

out_dir = "out-shakespeare-char-cpu"
eval_interval = 250
eval_iters = 20
log_interval = 50
always_save_checkpoint = False

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0                 # too small and too short a run to overfit

learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100

device = "cpu"
dtype = "float32"
compile = False

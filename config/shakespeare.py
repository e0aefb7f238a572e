# The character-level "baby GPT" on Tiny Shakespeare: nanoGPT's GPU run (about 10M parameters).
#   python train.py config/shakespeare.py                   (tk kernels where they can run)
#   python train.py config/shakespeare.py --kernels=torch   (the PyTorch reference ops)
# nanoGPT's figure for this recipe, with attention dropout, is val loss 1.47 after 5000 iters.

out_dir = "out-shakespeare-char"
eval_interval = 250           # evaluate often: a small model on a small set overfits
eval_iters = 200
log_interval = 10
always_save_checkpoint = False   # keep only the best val loss

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256              # context of up to 256 previous characters

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
attn_dropout = 0.0            # the fused attention kernels do not drop attention probabilities

learning_rate = 1e-3          # a small model can take a high learning rate
max_iters = 5000
# A small model's step is hundreds of small kernels: replaying them from a CUDA graph instead of
# launching each from Python took the torch path's step from 13.3 to 7.4-7.7 ms on an H200 (the
# tk kernels: 5.2 ms in session 3). Ignored, with a message, on the CPU and under torchrun or compile.
cuda_graphs = True
lr_decay_iters = 5000         # usually equal to max_iters
min_lr = 1e-4                 # learning_rate / 10
beta2 = 0.99                  # larger because there are few tokens per iteration
warmup_iters = 100

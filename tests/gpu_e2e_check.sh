#!/usr/bin/env bash
# The end-to-end GPU check on a TWO-GPU machine (kind nvidia-h200-x2), sized for a short lease:
# both GPUs kept busy, at most 8 log files in OUT.
#
#   bash tests/gpu_e2e_check.sh OUT
#
#   GPU 0: train.py config/shakespeare.py --kernels=torch          -> OUT/shakespeare_torch.log
#          (meanwhile every tk extension builds, in parallel)      -> OUT/summary.txt
#   GPU 1: the kernels' GPU tests, 4 pytest workers                -> OUT/pytest.log
#   GPU 0: train.py config/shakespeare.py --kernels=auto (tk), back to back with the torch run
#                                                                  -> OUT/shakespeare_tk.log
#   GPU 1: GPT-2 124M shapes on random tokens: our model on torch and on tk, and the plain
#          nanoGPT-style baseline (eager)                          -> OUT/gpt2.log
#   GPU 0: bench.py --ops layernorm,mlp --quick (no torch.compile rows)  -> OUT/bench.log
#   GPU 0+1: torchrun DDP, GPT-2 124M, 32x1024 tokens per GPU      -> OUT/ddp.log
# Both shakespeare runs use eval_iters=50 (the config says 200) to fit the lease.
# Needs data/shakespeare_char/input.txt (git-ignored) or .gpu_carry/input.txt.
set -uo pipefail
OUT=${1:?usage: bash tests/gpu_e2e_check.sh OUT}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="$OUT/summary.txt"
note() { echo "[$(date -u +%T)] $*" | tee -a "$S"; }
note "gpu_e2e_check $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$S"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$S"

[ -f data/shakespeare_char/input.txt ] || cp .gpu_carry/input.txt data/shakespeare_char/input.txt
python3 data/shakespeare_char/prepare.py > /dev/null || note "prepare failed"
SHK="config/shakespeare.py --eval_iters=50 --always_save_checkpoint=False"

# GPU 0: the reference run starts at once; the tk extensions build beside it on the CPU.
(CUDA_VISIBLE_DEVICES=0 timeout 170 python3 train.py $SHK --kernels=torch --out_dir=/tmp/o_torch \
    > "$OUT/shakespeare_torch.log" 2>&1; echo "rc=$?" >> "$OUT/shakespeare_torch.log") &
TORCH_RUN=$!
t0=$(date +%s)
BUILDS=()
PREBUILD='import importlib, sys, kernels.build as b; m = importlib.import_module("kernels." + sys.argv[1]); [e.module for e in vars(m).values() if isinstance(e, b.LazyExtension)]'
for mod in layernorm attention_op attention_hopper mlp_op gemm; do
    (CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -c "$PREBUILD" $mod 2>&1 |
        sed "s/^/build $mod: /") >> "$S" &
    BUILDS+=($!)
done
wait "${BUILDS[@]}"
note "builds done in $(( $(date +%s) - t0 )) s"

# GPU 1: every kernel's GPU tests (4 workers), while GPU 0 finishes the reference run.
(CUDA_VISIBLE_DEVICES=1 timeout 120 python3 -m pytest -q -n 4 -p no:cacheprovider \
    tests/test_input_checks.py tests/test_fast_path.py tests/test_layernorm.py \
    tests/test_layernorm_model.py tests/test_mlp.py tests/test_attention.py \
    tests/test_attention_hopper.py tests/test_gemm.py > "$OUT/pytest.log" 2>&1;
    echo "rc=$?" >> "$OUT/pytest.log") &
TESTS=$!
wait $TORCH_RUN
note "torch run: $(grep -E '^summary|^rc=' "$OUT/shakespeare_torch.log" | tr '\n' ' ')"

# GPU 0: the tk run, back to back with the reference run on the same GPU.
(CUDA_VISIBLE_DEVICES=0 timeout 170 python3 train.py $SHK --kernels=auto --out_dir=/tmp/o_tk \
    > "$OUT/shakespeare_tk.log" 2>&1; echo "rc=$?" >> "$OUT/shakespeare_tk.log") &
TK_RUN=$!
wait $TESTS
note "pytest: $(tail -2 "$OUT/pytest.log" | tr '\n' ' ')"

# GPU 1: GPT-2 124M shapes: our model on torch and on tk, then the plain baseline (eager).
G2="config/gpt2.py --dataset=synthetic --batch_size=32 --gradient_accumulation_steps=1 --max_iters=30
    --eval_interval=100000 --eval_iters=1 --log_interval=5 --compile=False --always_save_checkpoint=False"
(for k in torch auto; do
    echo "=== kernels=$k" >> "$OUT/gpt2.log"
    CUDA_VISIBLE_DEVICES=1 timeout 60 python3 train.py $G2 --kernels=$k --out_dir=/tmp/o_gpt2_$k >> "$OUT/gpt2.log" 2>&1
 done
 CUDA_VISIBLE_DEVICES=1 timeout 40 python3 tests/plain_gpt_baseline.py --batch_size=32 --micro_batch=32 \
    --block_size=1024 --dtype=bfloat16 --steps=10 --warmup=3 --modes=eager >> "$OUT/gpt2.log" 2>&1) &
GPT2=$!
wait $TK_RUN
note "tk run: $(grep -E '^summary|^rc=' "$OUT/shakespeare_tk.log" | tr '\n' ' ')"

# GPU 0: the op bench, headline shapes, tk vs eager (no torch.compile rows, to save time).
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 bench.py --ops layernorm,mlp --quick --compile-modes "" \
    --json /tmp/bench.json > "$OUT/bench.log" 2>&1
note "bench rc=$?"
wait $GPT2
note "gpt2: $(grep -E '^summary|tok/s' "$OUT/gpt2.log" | tr '\n' ' ')"

# DDP: two GPUs, 32x1024 tokens per GPU per step, gradients all-reduced every step.
timeout 60 python3 -m torch.distributed.run --standalone --nproc_per_node=2 train.py $G2 --gradient_accumulation_steps=2 \
    --kernels=auto --out_dir=/tmp/o_ddp > "$OUT/ddp.log" 2>&1
note "ddp rc=$?: $(grep -E '^summary' "$OUT/ddp.log")"

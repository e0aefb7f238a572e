#!/usr/bin/env bash
# The training repository's GPU check (issue 2), on the PyTorch reference path. Writes logs and
# a summary to the folder it is given.
#
#   bash tests/gpu_train_check.sh OUT [PART ...]
#
# PARTs (default: shakespeare throughput synthetic ddp), with rough H200 times:
#   shakespeare  python train.py config/shakespeare.py --kernels=torch: wall time, tokens/s,
#                best val loss (target <= 1.50). Needs data/shakespeare_char/input.txt (git-
#                ignored: carry it). ~3-4 min.
#   throughput   tests/plain_gpt_baseline.py: GPT-2 124M shapes, B=32, T=1024, bf16, random
#                tokens; our torch path vs a plain nanoGPT-style model, eager and compiled. ~4 min.
#   synthetic    train.py itself at GPT-2 124M shapes on random tokens (tok/s and MFU). ~1 min.
#   ddp          torchrun --nproc_per_node=2 on config/shakespeare.py, per-rank batch unchanged,
#                300 iters; only where there are >= 2 GPUs (kind nvidia-h200-x2). ~1 min.
set -uo pipefail
OUT=${1:?usage: bash tests/gpu_train_check.sh OUT [shakespeare throughput synthetic ddp]}
shift
PARTS=${*:-shakespeare throughput synthetic ddp}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
# Checkpoints (130 MB for the baby GPT, 1.5 GB at GPT-2 size) stay out of OUT.
CKPT=${CKPT_DIR:-/tmp/gpu_train_check}
mkdir -p "$CKPT"
echo "gpu_train_check $(date -u +%FT%TZ) parts: $PARTS" | tee "$SUMMARY"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$SUMMARY"
python -c "import torch; print('torch', torch.__version__)" | tee -a "$SUMMARY"

run_part() {   # name, command...: log to OUT/name.log, record exit code and wall time
    local name=$1; shift
    local t0=$(date +%s)
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "[$name] rc=$rc wall=$(( $(date +%s) - t0 ))s: $*" | tee -a "$SUMMARY"
    return $rc
}

for part in $PARTS; do
    case $part in
    shakespeare)
        if [ ! -f data/shakespeare_char/train.bin ]; then
            run_part prepare python data/shakespeare_char/prepare.py
        fi
        run_part shakespeare python train.py config/shakespeare.py --kernels=torch --out_dir="$CKPT/out-shakespeare"
        grep -E "^(device|kernels|summary)" "$OUT/shakespeare.log" | tee -a "$SUMMARY"
        grep -E "^step " "$OUT/shakespeare.log" | tail -3 | tee -a "$SUMMARY"
        python sample.py --out_dir="$CKPT/out-shakespeare" --num_samples=1 --max_new_tokens=300 \
            --kernels=torch > "$OUT/sample.log" 2>&1
        echo "[sample] rc=$? (text in sample.log)" | tee -a "$SUMMARY"
        ;;
    throughput)
        run_part throughput python tests/plain_gpt_baseline.py --batch_size=32 --micro_batch=32 \
            --block_size=1024 --dtype=bfloat16 --steps=20 --warmup=5
        grep -E "tok/s|ours / plain" "$OUT/throughput.log" | tee -a "$SUMMARY"
        ;;
    synthetic)
        run_part synthetic python train.py config/gpt2.py --dataset=synthetic --kernels=torch \
            --batch_size=32 --gradient_accumulation_steps=1 --max_iters=50 --eval_iters=1 \
            --eval_interval=1000 --log_interval=10 --compile=False --out_dir="$CKPT/out-synthetic"
        grep -E "^(iter 50|summary)" "$OUT/synthetic.log" | tee -a "$SUMMARY"
        ;;
    ddp)
        ngpu=$(nvidia-smi -L | wc -l)
        if [ "$ngpu" -lt 2 ]; then
            echo "[ddp] skipped: $ngpu GPU(s)" | tee -a "$SUMMARY"
            continue
        fi
        [ -f data/shakespeare_char/train.bin ] || python data/shakespeare_char/prepare.py
        # NVLink multicast stays off on these shared machines.
        export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
        # gradient_accumulation_steps is global and split among ranks: 2 here keeps each
        # rank at batch_size=64 per step (global batch 128).
        run_part ddp torchrun --standalone --nproc_per_node=2 train.py config/shakespeare.py \
            --kernels=torch --max_iters=300 --gradient_accumulation_steps=2 --out_dir="$CKPT/out-ddp"
        grep -E "^(device|summary)" "$OUT/ddp.log" | tee -a "$SUMMARY"
        ;;
    *) echo "unknown part $part" | tee -a "$SUMMARY" ;;
    esac
done

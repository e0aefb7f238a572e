#!/usr/bin/env bash
# The lead's measurements of whole training steps between the session's first and final calls:
#
#   bash tests/gpu_e2e_probe.sh OUT [one]  # one GPU (~200 s): GPT-2 on tk, eager vs CUDA graphs
#                                          # (bench.py --e2e); the shakespeare tk step's profile
#                                          # (dropout 0.2, as it trains); the one-GPU baseline of
#                                          # the DDP runs
#   bash tests/gpu_e2e_probe.sh OUT ddp    # both GPUs (~120 s): torchrun --nproc_per_node=2, GPT-2
#                                          # shapes on tk, 32x1024 tokens per GPU, with DDP bucket
#                                          # sizes and NCCL channel limits side by side
# Logs in OUT/logs (packed into OUT/logs.tgz), headlines in OUT/summary.txt. LANE_LIMIT (s, 230).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_e2e_probe.sh OUT [one|ddp]" >&2; exit 2; }
PART=${2:-one}
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-230}
source tests/gpu_lib.sh "$1"
G2="config/gpt2.py --dataset=synthetic --batch_size=32 --gradient_accumulation_steps=1 --max_iters=60
    --eval_interval=100000 --eval_iters=1 --log_interval=10 --compile=False --kernels=tk --out_dir=/tmp/o_gpt2"

case "$PART" in
one)
    note "gpu_e2e_probe one"
    step 150 e2e_gpt2.log python3 bench.py --e2e --models gpt2 --variants tk,tk+graphs --json "$L/e2e_gpt2.json"
    note "e2e gpt2: $(grep -E 'ms/step' "$L/e2e_gpt2.log" | grep -v variant | tr '\n' ' ')"
    step 60 profile_shk.log python3 bench.py --profile --models shakespeare-char --kernels tk --dropout 0.2 \
        --profile-rows 30 --json "$L/profile_shk.json"
    note "shakespeare tk profile: $(grep -E '^GPU kernels' "$L/profile_shk.log" | head -1)"
    step 60 gpt2_1gpu.log python3 train.py $G2
    note "gpt2 tk, one GPU: $(grep -E '^summary' "$L/gpt2_1gpu.log")"
    ;;
ddp)
    note "gpu_e2e_probe ddp"
    for run in "25:" "100:" "25:4"; do
        cap=${run%:*}; channels=${run#*:}
        log=ddp_bucket${cap}_channels${channels:-default}.log
        if [ -n "$channels" ]; then export NCCL_MAX_NCHANNELS=$channels; else unset NCCL_MAX_NCHANNELS; fi
        step 45 "$log" python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
            train.py $G2 --gradient_accumulation_steps=2 --ddp_bucket_cap_mb=$cap
        note "ddp tk, bucket $cap MB, NCCL channels ${channels:-default}: $(grep -E '^summary' "$L/$log")"
    done
    ;;
*) echo "unknown part $PART: use one or ddp" >&2; exit 2 ;;
esac
pack

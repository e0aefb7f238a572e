#!/bin/bash
# tests/gpu_linear_e2e.sh OUT — engineer G, session 9: is the tk linear op (kernels/linear_op.py;
# the attention's c_attn and c_proj on the tk GEMM; since session 9 the fp32 weight is cast once
# inside the op and dW is stored by the GEMM in fp32) a win in the GPT-2 step (issue 7)?
#   1. tests/test_linear.py on the GPU: the op vs float64 at GPT-2's shapes and tails, fp32
#      parameters under autocast at the e2e's 32k tokens (dW on 5v10 and 5v7, stored in fp32),
#      opcheck with bf16 and fp32 weights, the model's loss and gradients vs kernels=torch
#   2. the e2e A/B in ONE process (tests/linear_e2e_ab.py steps): train.py's GPT-2 step (B=32,
#      T=1024, every other op on its default), the switch's linear flipped between rounds:
#      torch (the default) / tk / tk-castout (the op as it was before session 9), order rotated,
#      paired per round
#   3. the op's six GEMMs at M = 32768 vs torch.matmul (CUDA graphs, interleaved), the dW plans
#      side by side, and the whole op fwd+bwd vs F.linear (tests/linear_e2e_ab.py products)
#   4. bench.py --profile of the step with --kernels tk/linear=tk and --kernels tk (kernel sums,
#      launches per step)
# ONE H200, within 190 s (LANE_LIMIT). Results: OUT/summary.txt and OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-190}
source tests/gpu_lib.sh "${1:-/tmp/linear_e2e_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
note "gpu_linear_e2e.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. tests
step 45 tests.log python3 -m pytest -q -p no:cacheprovider --maxfail=8 -rf tests/test_linear.py
note "test_linear: $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"

# 2. the step, A/B/C in one process, with the SM clock and power logged every 50 ms (split by arm
#    afterwards with the 'span ARM START END' lines)
nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
    --format=csv,noheader -lms 50 > "$L/smi.csv" 2>&1 &
SMI=$!
step 55 steps.log python3 tests/linear_e2e_ab.py steps --rounds 14 --per-round 4 --warmup 4
note "e2e A/B (rc=$?):"
kill "$SMI" 2>/dev/null
grep -E "^plan|rounds x|median" "$L/steps.log" | tee -a "$S"
python3 tests/linear_e2e_ab.py clocks "$L/steps.log" "$L/smi.csv" 2>&1 | tee -a "$S"

# 3. the products and the whole op
step 35 products.log python3 tests/linear_e2e_ab.py products --trials 5 --iters 10
note "products at M=32768 (rc=$?):"
grep -E "TFLOP/s|whole op" "$L/products.log" | cut -c1-260 | tee -a "$S"

# 4. profiles
for k in tk/linear=tk tk; do
    tag=${k//\//_}; tag=${tag//=/-}
    step 30 "profile_$tag.log" python3 bench.py --profile --models gpt2 --warmup 6 --profile-steps 3 --profile-rows 40 \
        --kernels "$k" --json "$L/profile_$tag.json"
    note "profile $k (rc=$?): $(grep -E '^GPU kernels:' "$L/profile_$tag.log" | head -1)"
done
pack

#!/usr/bin/env bash
# The closing check of a session on a TWO-GPU machine (kind nvidia-h200-x2), sized for ~6 min:
#
#   bash tests/gpu_final_check.sh OUT
#
#   both:   every tk extension builds (in parallel)
#   GPU 0:  config/shakespeare.py, standard evals, back to back: --kernels=torch, then tk
#   GPU 1:  pytest of the GPU test files other than layernorm's (tests/gpu_layernorm_check.sh
#           runs those), 4 workers
#   both:   tests/gpu_loss_curves.sh (GPT-2 124M shape, 500 iterations, torch on one GPU and tk
#           on the other); then DDP: torchrun --nproc_per_node=2 config/shakespeare.py on the
#           torch path, 300 iterations, per-rank batch unchanged
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 330).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_final_check.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-330}
source tests/gpu_lib.sh "$1"
note "gpu_final_check"
setup_shakespeare
prebuild_all

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    step 100 shk_torch.log python3 train.py config/shakespeare.py --kernels=torch --always_save_checkpoint=False --out_dir=/tmp/o_t
    note "shakespeare torch: $(grep -E '^(summary|cuda_graphs)' "$L/shk_torch.log" | tr '\n' ' ')"
    step 80 shk_tk.log python3 train.py config/shakespeare.py --kernels=tk --always_save_checkpoint=False --out_dir=/tmp/o_k
    note "shakespeare tk: $(grep -E '^(summary|cuda_graphs|error)' "$L/shk_tk.log" | tr '\n' ' ')"
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    step 170 pytest.log python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_fast_path.py tests/test_input_checks.py \
        tests/test_model.py tests/test_train.py tests/test_bindings_bad_inputs.py tests/test_mlp.py tests/test_attention.py \
        tests/test_dispatch.py tests/test_sample.py
    note "pytest: $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
    grep -E "^(FAILED|ERROR)" "$L/pytest.log" | head -20 | tee -a "$S"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
step 110 curves.log bash tests/gpu_loss_curves.sh "$L/curves" --timeout 100
note "loss curves: $(grep -iE 'verdict|PASS|FAIL' "$L/curves/summary.txt" 2>/dev/null | tail -2 | tr '\n' ' ')"
step 60 ddp.log python3 -m torch.distributed.run --standalone --nproc_per_node=2 train.py config/shakespeare.py \
    --kernels=torch --max_iters=300 --gradient_accumulation_steps=2 --always_save_checkpoint=False --out_dir=/tmp/o_ddp
note "ddp torch: $(grep -E '^(summary|cuda_graphs|device)' "$L/ddp.log" | tr '\n' ' ')"
pack

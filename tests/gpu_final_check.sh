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
OUT=${1:?usage: bash tests/gpu_final_check.sh OUT}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
L="$OUT/logs"
mkdir -p "$L"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="$OUT/summary.txt"
START=$(date +%s)
LIMIT=${LANE_LIMIT:-330}
note() { echo "[$(date -u +%T) +$(( $(date +%s) - START ))s] $*" | tee -a "$S"; }
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
step() {   # step SECONDS LOG command...: run under min(SECONDS, time left), append to LOG
    local want=$1 log=$2; shift 2
    local t=$(left); [ "$t" -gt "$want" ] && t=$want
    if [ "$t" -lt 15 ]; then note "skipped (no time left): $*"; return 1; fi
    echo "=== $* (limit ${t}s)" >> "$L/$log"
    timeout -k 5 "$t" "$@" >> "$L/$log" 2>&1
    local rc=$?; echo "rc=$rc" >> "$L/$log"; return $rc
}
note "gpu_final_check"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$S"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$S"
[ -f data/shakespeare_char/input.txt ] || cp .gpu_carry/input.txt data/shakespeare_char/input.txt
python3 data/shakespeare_char/prepare.py > /dev/null || note "prepare failed"

pids=()
PREBUILD='import importlib, sys, kernels.build as b; m = importlib.import_module("kernels." + sys.argv[1]); [e.module for e in vars(m).values() if isinstance(e, b.LazyExtension)]'
for mod in layernorm attention_op attention_hopper mlp_op gemm; do
    (timeout 150 python3 -c "$PREBUILD" $mod > "$L/build_$mod.log" 2>&1 || note "build $mod FAILED") &
    pids+=($!)
done
wait "${pids[@]}"
note "builds done"

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
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
note "packed"

#!/usr/bin/env bash
# Issue 7's speed questions in one call on a TWO-GPU machine (kind nvidia-h200-x2), two lanes
# side by side so that neither GPU waits. Everything lands in OUT/logs, packed into
# OUT/logs.tgz at the end (the device tool returns few files); OUT/summary.txt has the headlines.
#
#   bash tests/gpu_speed_check.sh OUT
#
#   lane 0 (GPU 0): config/shakespeare.py with its standard evals (every 250 iterations, 200
#     batches), back to back: --kernels=torch, then --kernels=auto --cuda_graphs=True, then
#     --kernels=torch --cuda_graphs=True; then the compiled throughput comparison of issue 2
#     (our model on torch vs the plain nanoGPT-style model, both torch.compile'd).
#   lane 1 (GPU 1): every tk extension builds (in parallel), the CUDA-graph tests of
#     test_train.py, bench.py --e2e for shakespeare-char and GPT-2 (eager, compile, graphs; on
#     torch and tk), bench.py --profile of one tk step of each model.
# Needs data/shakespeare_char/input.txt (git-ignored) or .gpu_carry/input.txt.
# LANE_LIMIT (s, default 520) cuts each lane's remaining work so the pack step always runs.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_speed_check.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-520}
source tests/gpu_lib.sh "$1"
note "gpu_speed_check"
setup_shakespeare
SHK="config/shakespeare.py --always_save_checkpoint=False"

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    step 170 shk_torch.log python3 train.py $SHK --kernels=torch --out_dir=/tmp/o_torch
    note "shakespeare torch: $(grep -E '^summary' "$L/shk_torch.log")"
    step 170 shk_tk_graphs.log python3 train.py $SHK --kernels=auto --cuda_graphs=True --out_dir=/tmp/o_tkg
    note "shakespeare tk+graphs: $(grep -E '^(summary|error)' "$L/shk_tk_graphs.log")"
    step 150 shk_torch_graphs.log python3 train.py $SHK --kernels=torch --cuda_graphs=True --out_dir=/tmp/o_tg
    note "shakespeare torch+graphs: $(grep -E '^(summary|error)' "$L/shk_torch_graphs.log")"
    step 200 plain_compiled.log python3 tests/plain_gpt_baseline.py --batch_size=32 --micro_batch=32 \
        --block_size=1024 --dtype=bfloat16 --steps=15 --warmup=5 --modes=compiled
    note "plain vs ours, compiled: $(grep -E 'tok/s|ours / plain' "$L/plain_compiled.log" | tr '\n' ' ')"
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    prebuild_all
    step 120 graphs_tests.log python3 -m pytest -q -p no:cacheprovider tests/test_train.py -k "graph"
    note "graph tests: $(tail -1 "$L/graphs_tests.log")"
    step 200 e2e_shk.log python3 bench.py --e2e --models shakespeare-char --compile-modes default \
        --variants torch,torch+graphs,torch+compile,tk,tk+graphs,tk+compile --reps 30 --warmup 8 \
        --e2e-timeout 100 --json "$L/e2e_shk.json"
    step 260 e2e_gpt2.log python3 bench.py --e2e --models gpt2 --compile-modes default \
        --variants torch,torch+compile,tk,tk+graphs,tk+compile --reps 20 --warmup 6 \
        --e2e-timeout 120 --json "$L/e2e_gpt2.json"
    step 60 profile.log python3 bench.py --profile --models shakespeare-char,gpt2 --kernels tk \
        --warmup 5 --profile-steps 3 --json "$L/prof.json"
    note "lane 1 done"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
grep -hE "^(shakespeare-char|gpt2) " "$L"/e2e_*.log >> "$S" 2>/dev/null
pack

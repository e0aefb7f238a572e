#!/bin/bash
# tests/gpu_mlp_fc_epilogue.sh OUT — engineer M, session 6 (issue 6: the MLP at 1.10x eager AND
# 1.10x torch.compile at M = 16384 and 65536, C = 768, in one mlp_bench run). ONE H200, 150 s.
#   1. build tk_mlp (cached when the combined call prebuilt it)
#   2. GPU tests of the new paths: fcfast=1 (c_fc's epilogue: GELU in 5 operations, the bias of a
#      box without per-column checks) against float64 and the default on every c_fc schedule, pre
#      bit-identical; fcfast=2 (the same values staged by stmatrix, one fence per box, through
#      G's STORES_SLAB hook in gemm_4_warp_specialized.cuh) bit-identical to fcfast=1; fast=2 (the
#      dGELU epilogue deferred under the next tile's k-steps, G's DEFERS_STORE hook, step 4)
#      against float64 and the default, deterministic, without bias gradients; defer=1 (c_proj's
#      and dx's stores deferred the same way) bit-identical to the default; fcfast=3 (c_fc deferred
#      on step 4, h from the bf16 pre) against GELU of its pre and the default; the evaluation
#      forward's y bit-identical to training's; set_schedule's 11 values
#   3. issue 6's table in ONE run: mlp_bench --graphs --compile at M = 16384, 65536: the default
#      against fcfast=1, fcfast=2, fc=4,fcfast=3, fast=2, defer=1, finish=1 and their combinations (dW on schedule 10,
#      dGELU on ping-pong 64x256 with the fast per-thread-load epilogue), 9 interleaved trials of
#      20 CUDA-graph replays, beside torch eager and torch.compile
#   4. per-kernel times (torch.profiler, eager launches) at M = 65536 and 16384
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-145}
source tests/gpu_lib.sh "${1:-/tmp/mlp_fc_epilogue_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_mlp_fc_epilogue.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. build
step 60 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. the new paths' GPU tests, 6 processes on the one GPU (the inference tests' ids carry "fcfast")
note "hooks in gemm_4_warp_specialized.cuh: STORES_SLAB $(grep -c 'STORES_SLAB' kernels/gemm_4_warp_specialized.cuh) lines, DEFERS_STORE $(grep -c 'DEFERS_STORE' kernels/gemm_4_warp_specialized.cuh) (0: fcfast=2 / fast=2 run fcfast=1 / fast=1's path)"
step 50 tests.log python3 -m pytest -q -n 6 -p no:cacheprovider --maxfail=5 tests/test_mlp.py \
    -k "session6 or fast_gelu or stmatrix or refuses or deterministic or opt_ins or no_bias or short_k or deferred or (inference and fcfast)"
note "tests (fcfast=1, 2, fast=2): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -2 | tr '\n' ' ')"

# 3. issue 6's table: the default, the session 6 opt-in and the session 5 opt-ins, one run
SPECS="0;fcfast=1;fcfast=2;fc=4,fcfast=3;defer=1;finish=1;fcfast=2,finish=1;fcfast=2,finish=1,defer=1;fc=4,fcfast=3,finish=1,defer=1;fcfast=2,finish=1,defer=1,dw=10;dgelu=6"   # (call 2 also ran fast=2, since removed)
step 60 mlp_bench_graphs.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 9 --iters 20 \
    --schedules "$SPECS"
{ echo "--- mlp_bench --graphs --compile"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/mlp_bench_graphs.log"; } | tee -a "$S"

# 4. per kernel (eager launches, one trial): where the time went, both sizes
for M in 65536 16384; do
    step 13 mlp_kernels_$M.log python3 -m kernels.mlp_bench --kernels --M $M --trials 1 --iters 5 \
        --schedules "0;fcfast=2;fcfast=2,finish=1,defer=1;fc=4,fcfast=3,finish=1,defer=1"
    { echo "--- mlp_bench --kernels M=$M"; grep -E "^M=|^  tk|kernels of|gemm|reduce|elementwise|finish|Memset|Fill" \
        "$L/mlp_kernels_$M.log" | cut -c1-150; } >> "$S"
done
note "done in $(( $(date +%s) - START )) s"
pack

#!/bin/bash
# tests/gpu_mlp_default_candidates.sh OUT — engineer M, session 6, call 3 (the last helper call): the
# candidates for the MLP's new default, tested and timed against the current default in ONE run.
# ONE H200, 110 s (LANE_LIMIT 100). Call 2 (tests/gpu_mlp_fc_epilogue.sh) had: fcfast=2,finish=1
# -1.5% at M = 16384 and +1.8% at 65536 (graphs; that table drifted ~15% under load), fast=2 (the
# deferred dGELU) far slower; defer=1 and fcfast=3 had not run. G's call 2: the deferred plain
# product on step 4 (4v8) leads at K = 768, the dW shapes run ~8% faster on ping-pong 128x128.
#   1. build tk_mlp (cached when the combined call prebuilt it)
#   2. GPU tests of every session 6 path (fcfast=1/2/3, defer=1, fast=2) against float64 / the
#      default, the evaluation twins, the refusals (8 processes on the one GPU)
#   3. issue 6's table in ONE run, M = 16384 and 65536: the default against fc=4,fcfast=3 (c_fc
#      deferred on step 4), fcfast=2, defer=1 (c_proj and dx deferred), finish=1, dw=5 / dw=6 (the
#      weight gradients on ping-pong), their combination and fast=2 (the deferred dGELU, its pre
#      boxes now prefetched into L1 a box ahead); 7 trials of 20 CUDA-graph replays,
#      each trial starting one place further down the list; torch eager and torch.compile beside
#   4. if time is left: per-kernel times at 16384 of the default and the combination
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-100}
source tests/gpu_lib.sh "${1:-/tmp/mlp_default_candidates_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_mlp_default_candidates.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 40 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. the session 6 paths' GPU tests (the inference tests' ids carry "fcfast")
step 30 tests.log python3 -m pytest -q -n 8 -p no:cacheprovider --maxfail=5 tests/test_mlp.py \
    -k "session6 or deferred or stmatrix or refuses or (inference and fcfast)"
note "tests (session 6 paths): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -2 | tr '\n' ' ')"

# 3. issue 6's table: the default against the candidates, one run
SPECS="0;fcfast=2;fc=4,fcfast=3;defer=1;finish=1;dw=5;dw=6;fc=4,fcfast=3,defer=1,finish=1"
SPECS="$SPECS;fc=4,fcfast=3,defer=1,finish=1,dw=5;fcfast=2,defer=1,finish=1,dw=5"   # (call 3 also ran fast=2, since removed)
step 45 mlp_bench_graphs.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 7 --iters 20 \
    --schedules "$SPECS"
{ echo "--- mlp_bench --graphs --compile"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/mlp_bench_graphs.log"; } | tee -a "$S"

# 4. per kernel at 16384 (eager launches, one trial), if time is left
step 12 mlp_kernels_16384.log python3 -m kernels.mlp_bench --kernels --M 16384 --trials 1 --iters 5 \
    --schedules "0;fc=4,fcfast=3,defer=1,finish=1,dw=5"
{ echo "--- mlp_bench --kernels M=16384"; grep -E "^M=|^  tk|kernels of|gemm|reduce|elementwise|finish|Memset|Fill" \
    "$L/mlp_kernels_16384.log" | cut -c1-150; } >> "$S"
note "done in $(( $(date +%s) - START )) s"
pack

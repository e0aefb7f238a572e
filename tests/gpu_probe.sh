#!/usr/bin/env bash
# A session's first look, on a TWO-GPU machine (kind nvidia-h200-x2), ~4 min:
#
#   bash tests/gpu_probe.sh OUT
#
#   GPU 0:  bench.py --profile of the GPT-2 step on tk (train.py's per-op settings), then the GEMM
#           bench alone on its GPU (issue 3: steps 0 and 4 against torch.matmul, CUDA graphs and
#           kernel-alone timing, GEMM_TRIALS interleaved trials, default 9; session 8's final ran
#           it beside 12 pytest workers and one shape's cuBLAS figure moved 14%)
#   GPU 1:  the same profile for torch.compile (the issue's baseline)
# (Session 7's probe also profiled tk/linear=tk; it was ~0.5 ms slower in its e2e and stays off.)
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 260).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_probe.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-260}
source tests/gpu_lib.sh "$1"
note "gpu_probe"
setup_shakespeare
prebuild_all

profile() {   # $1 log name, then bench.py --profile's arguments
    local log=$1; shift
    step 120 "$log.log" python3 bench.py --profile --models gpt2 --warmup 8 --profile-steps 3 --profile-rows 45 \
        --json "$L/$log.json" "$@"
    note "$log: rc=$?"
    grep -E "^bench.py --profile|^GPU kernels:" "$L/$log.log" | head -8 >> "$S"
}

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    profile profile_tk --kernels tk
    step 150 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,4 --modes graph,kernel \
        --trials "${GEMM_TRIALS:-9}" --json "$L/gemm_bench.json"
    note "gemm bench: rc=$?"
    grep -E "x$" "$L/gemm_bench.log" | tail -12 >> "$S"
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    profile profile_compile --kernels torch --profile-compile default
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
pack

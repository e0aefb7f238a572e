#!/usr/bin/env bash
# A session's first look, on a TWO-GPU machine (kind nvidia-h200-x2), ~8 min (session 9's list for
# session 10, kernels/NOTES.md "Next session", items 0 and 1):
#
#   bash tests/gpu_probe.sh OUT
#
#   GPU 0:  pytest -n 8 tests/test_tk_ops.py with NO ahead-of-time build of its test library, so
#           eight workers meet at build()'s lock (session 9's final saw 18 failures when twelve
#           built it at once, before the lock existed); then the GEMM bench alone on its GPU
#           (issue 3: steps 0 and 4 against torch.matmul, CUDA graphs and kernel-alone timing,
#           GEMM_TRIALS interleaved trials, default 9)
#   GPU 1:  bench.py --profile of the GPT-2 step on tk (train.py's per-op settings), then the same
#           for torch.compile (the issue's baseline)
#   then:   bench.py --e2e on GPT-2 124M alone on the machine: torch.compile, tk, tk under
#           torch.compile (E2E_SECONDS, default 180: compile's warm-ups alone take ~45 s, and
#           session 9's 120 s cut the last row)
# Knobs: GEMM_BENCH=0 / PROFILE_COMPILE=0 leave those out; EXTRA0 / EXTRA1 = "SCRIPT:SECONDS ..."
# run after lane 0's / lane 1's own items on that GPU (an engineer's gpu_*.sh, given OUT/logs/<name>
# and LANE_LIMIT = SECONDS - 10, as tests/gpu_combined.sh runs them).
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 200).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_probe.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-200}
source tests/gpu_lib.sh "$1"
note "gpu_probe"
setup_shakespeare
prebuild_all


profile() {   # $1 log name, then bench.py --profile's arguments
    local log=$1; shift
    step 120 "$log.log" python3 bench.py --profile --models gpt2 --warmup 8 --profile-steps 3 --profile-rows 60 \
        --json "$L/$log.json" "$@"
    note "$log: rc=$?"
    grep -E "^bench.py --profile|^GPU kernels:|^GPU idle" "$L/$log.log" | head -8 >> "$S"
}

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    rm -rf build/tk_test   # the workers must build it themselves, under the lock
    step 90 tk_ops.log python3 -m pytest -v -n 8 -p no:cacheprovider tests/test_tk_ops.py
    note "test_tk_ops: rc=$? $(grep -E '^=+ .*(passed|failed)' "$L/tk_ops.log" | tail -1)"
    grep -E " FAILED|^E .*CUDA error" "$L/tk_ops.log" | sort -u | head -20 | tee -a "$S"
    if [ "${GEMM_BENCH:-1}" != 0 ]; then
        step 100 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,4 --modes graph,kernel \
            --trials "${GEMM_TRIALS:-9}" --json "$L/gemm_bench.json"
        note "gemm bench: rc=$?"
        grep -E "x$" "$L/gemm_bench.log" | tail -12 >> "$S"
    fi
    run_items "${EXTRA0:-}"
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    profile profile_tk --kernels tk
    [ "${PROFILE_COMPILE:-1}" = 0 ] || profile profile_compile --kernels torch --profile-compile default
    run_items "${EXTRA1:-}"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
LIMIT=$((LIMIT + ${E2E_SECONDS:-180} + 10))   # the part after the lanes
CUDA_VISIBLE_DEVICES=0 step ${E2E_SECONDS:-180} e2e_gpt2.log python3 bench.py --e2e --models gpt2 \
    --variants torch+compile,tk,tk+compile --compile-modes default --json "$L/e2e_gpt2.json"
note "e2e: $(grep -E '^  [a-z0-9-]+ .*ms/step' "$L/e2e_gpt2.log" | tr '\n' ' ')"
pack

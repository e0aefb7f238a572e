#!/usr/bin/env bash
# tests/gpu_attention_s5_close.sh OUT_DIR — engineer A's closing script for session 5's final call:
# ONE H200, <= 60 s including a cold build of tk_attention_hopper (~31 s). Forward variant 20
# (variant 12 with LEAN_ITEMS: the O epilogue's row addresses computed once, the items decoded by
# the producer), written after the last helper call and not the default: its first GPU run.
#   1 build tk_attention_hopper (the forward only: the rows below need nothing else)
#   2 smoke of 20 under a hard limit (many items per CTA, T = 256 / 1000 / 300, D 64 / 128)
#   3 bench.py at the GPT-2 shape, forward: 20 against 12 (the default's kernel) and cuDNN, one
#     process (CUDA-graph medians; every row checked against eager)
#   4 the forward tests vs float64 for 20 (awkward T, poisoned outputs, large logits, strided
#     views, 150 heads), then racecheck of 20 with Q-slot reuse, as far as the time goes
# Logs in OUT/logs (packed into OUT/logs.tgz), figures in OUT/summary.txt (tests/gpu_lib.sh).
# Checked here without a GPU: bash -n; LANE_LIMIT=20 runs every step to its failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-58}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_s5_close.sh OUT_DIR}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
note "gpu_attention_s5_close.sh on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"

step 40 build.log python3 -m kernels --build tk_attention_hopper || note "build FAILED (logs/build.log)"
note "$(grep -E '^build |^built' "$L/build.log" | tr '\n' ' ')"

step 10 smoke.log python3 tests/attention_sanitize_case.py items 20
if grep -q "^variant 20 ok" "$L/smoke.log"; then
    note "smoke of variant 20: ok"
    TK_BENCH_ATTENTION_SHAPES=gpt2 TK_BENCH_ATTENTION_IMPLS="tk-hopper-v12,tk-hopper-v20,sdpa-cudnn" \
        step 25 bench.log python3 bench.py --ops attention --compile-modes "" --reps 20 --warmup 3 --json "$L/attention.json"
    python3 -m kernels.attention_bench "$L/attention.json" > "$L/bench_tflops.txt" 2>&1
    grep -E "^fwd|^    (tk|sdpa)|MISMATCH" "$L/bench_tflops.txt" | head -8 | while read -r line; do note "$line"; done
    TK_ATTENTION_HOPPER_VARIANTS="20" step 20 tests.log python3 -m pytest -q -rf --tb=short -p no:cacheprovider $XDIST \
        tests/test_attention_hopper.py -k "causal or full_attention or large_logits or packed or many_query"
    note "tests of variant 20: $(grep -E 'passed|failed|rc=' "$L/tests.log" | tail -2 | tr '\n' ' ')"
    step 15 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py items 20
    note "racecheck of 20: $(grep -E 'RACECHECK SUMMARY|rc=' "$L/racecheck.log" | tr '\n' ' ')"
else
    note "smoke of variant 20 FAILED or hung: $(tail -3 "$L/smoke.log" | tr '\n' ' ')"
fi
pack

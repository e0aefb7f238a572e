#!/bin/bash
# tests/gpu_attention_bwd_check.sh OUT — the Hopper attention backward's check on ONE H200, <= 110 s
# (LANE_LIMIT, default 105 s). First run in session 8's first call as gpu_attention_bwd_next.sh,
# which made variant 15 (12 + a bar.sync after the dQ atomics, closing 12's dS race) D = 64's default
# (kernels/attention_hopper_bwd.cu, DEFAULT_VARIANT_D64; kernels/NOTES.md, session 8, lead):
#   1. build tk_attention_hopper_bwd (a no-op when the call prebuilt this tree)
#   2. compute-sanitizer racecheck, then memcheck, of the small case: 0 (the default), 12, 15
#   3. GPU tests of 4, 12, 15 (D 64; D 128 runs 5 / 5 + prep_kernel): float64 reference, poisoned
#      outputs, T 1..4096, B·H from 1, packed views, non-causal, every variant vs the default
#   4. kernels/attention_bwd_bench.py: 4 vs 12 vs 15 vs cuDNN's backward, interleaved graph
#      replays, at GPT-2 B=32, shakespeare and t4096-d128
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-105}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_check_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_check.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

SANV="0 12 15"
step 22 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_bwd_sanitize_case.py $SANV
note "racecheck ($SANV): $(grep -E 'RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ')"
step 15 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_bwd_sanitize_case.py $SANV
note "memcheck ($SANV): $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

step 40 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="4 12 15" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest (0, 4, 12, 15): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"

step 25 bwd_bench.log python3 -m kernels.attention_bwd_bench --variants 4,12,15 --rounds 5 --reps 10 \
    --json "$OUT/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"
pack

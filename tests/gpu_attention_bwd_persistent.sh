#!/bin/bash
# tests/gpu_attention_bwd_persistent.sh OUT — the Hopper backward's persistent variants on ONE H200,
# <= 150 s (LANE_LIMIT, default 145 s):
#   19  D = 64's default since session 10 (16 + SPLIT_MASK: P's mask tests only in the diagonal and
#       tail blocks); 16 session 9's default (15 on a persistent grid)
# Session 10's call 2 ran this check's steps inside tests/gpu_attention_bwd_fused.sh (with 20-24,
# since removed; script in git history at c2487fe): every step passed for 19.
#   1. build (a no-op when the call prebuilt this tree)
#   2. smoke of 19 (the sanitizer case, no checks)
#   3. tests/test_attention_hopper_bwd.py, all of it, variant 0 = 19, the sweep with 19
#   4. tests/test_attention_hopper_bwd_persistent.py for 16, 19 (float64 at odd T 1..999 with B = 1,
#      dK/dV bitwise equal to 15's, dq within 1e-2 over repeated calls and changing shapes, graphs)
#   5. compute-sanitizer racecheck, then memcheck, of 16 and 19 (more items than SMs)
#   6. kernels/attention_bwd_bench.py: 19, 16 vs cuDNN, interleaved graph replays, GPT-2 B=32 and
#      shakespeare
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-145}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_persistent_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_persistent.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

step 15 smoke.log python3 tests/test_attention_hopper_bwd_persistent.py 19 && note "smoke 19: ok" || note "smoke 19 FAILED (smoke.log)"

step 50 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="19" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest test_attention_hopper_bwd.py (0 = 19, sweep 19): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"

step 25 pytest_persistent.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="16 19" python3 -m pytest -q \
    --tb=short -rf -p no:cacheprovider tests/test_attention_hopper_bwd_persistent.py
note "pytest persistent (16 19): $(grep -E 'passed|failed|error' "$L/pytest_persistent.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_persistent.log" | head -10 | cut -c1-220 >> "$S"

step 18 racecheck.log compute-sanitizer --tool racecheck python3 tests/test_attention_hopper_bwd_persistent.py 16 19
note "racecheck (16 19): $(grep -E 'RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ')"
step 15 memcheck.log compute-sanitizer --tool memcheck python3 tests/test_attention_hopper_bwd_persistent.py 16 19
note "memcheck (16 19): $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

step 40 bwd_bench.log python3 -m kernels.attention_bwd_bench --shapes gpt2,shakespeare --variants 19,16 \
    --rounds 9 --reps 10 --json "$L/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"
pack

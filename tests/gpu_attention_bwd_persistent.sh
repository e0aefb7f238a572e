#!/bin/bash
# tests/gpu_attention_bwd_persistent.sh OUT — session 9 (B): the Hopper backward's new opt-in variants
# on ONE H200, <= 120 s (LANE_LIMIT, default 115 s; NCU=1 adds ~45 s of ncu):
#   16  15 in one persistent CTA per SM (items from a counter that prep_kernel zeroes, the next item's
#       K/V loaded under the current one); ran in session 9's call 2 (this script's first form, with
#       17, since removed): tests passed, 507.6 us vs 15's 529.6 at GPT-2 B=32
#   18  15 with P's mask tests only in the diagonal/tail blocks (SPLIT_MASK); not yet run
#   19  16 + SPLIT_MASK; not yet run
#   1. build tk_attention_hopper_bwd (a no-op when the call prebuilt this tree)
#   2. smoke of 19 (the new synchronization; 18 changes arithmetic code only): left out if it fails
#   3. compute-sanitizer racecheck of 16 and 19, memcheck of 18 and 19 (more items than SMs)
#   4. tests/test_attention_hopper_bwd_persistent.py for 16, 18, 19 (float64, bitwise dK/dV vs 15,
#      repeated calls, graph replays, T 1..1000)
#   5. kernels/attention_bwd_bench.py: 15, 16, 18, 19 vs cuDNN, interleaved graph replays, GPT-2 B=32
#      and shakespeare
#   6. (NCU=1) ncu --set full of 15, 18, 19 (one GPT-2 launch each): details + raw pages
#   7. tests/test_attention_hopper_bwd.py for 15, 16, 18, 19 as far as the time goes
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_persistent_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_persistent.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

NEW="16 18"
if step 20 smoke.log python3 tests/test_attention_hopper_bwd_persistent.py 19; then
    NEW="$NEW 19"; note "smoke 19: ok"
else
    note "smoke 19 FAILED (smoke.log): left out of the rest"; tail -5 "$L/smoke.log" >> "$S"
fi
V="15,${NEW// /,}"
has() { [[ " $NEW " == *" $1 "* ]]; }

step 25 racecheck.log compute-sanitizer --tool racecheck python3 tests/test_attention_hopper_bwd_persistent.py 16 \
    $(has 19 && echo 19)
note "racecheck: $(grep -E 'RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ')"
step 20 memcheck.log compute-sanitizer --tool memcheck python3 tests/test_attention_hopper_bwd_persistent.py 18 \
    $(has 19 && echo 19)
note "memcheck: $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

step 35 pytest_persistent.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="$NEW" python3 -m pytest -q \
    --tb=short -rf -p no:cacheprovider tests/test_attention_hopper_bwd_persistent.py
note "pytest persistent ($NEW): $(grep -E 'passed|failed|error' "$L/pytest_persistent.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_persistent.log" | head -10 | cut -c1-220 >> "$S"

step 35 bwd_bench.log python3 -m kernels.attention_bwd_bench --shapes gpt2,shakespeare --variants $V \
    --rounds 11 --reps 10 --json "$L/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"

if [ "${NCU:-0}" = 1 ]; then
    step 50 ncu.log ncu --set full --import-source no -k regex:backward_kernel -c 3 -f -o /tmp/bwd_ncu \
        python3 -m kernels.attention_bwd_bench --ncu-once "15,18$(has 19 && echo ,19)"
    step 15 ncu_details.log ncu -i /tmp/bwd_ncu.ncu-rep --page details --print-details all
    step 15 ncu_raw.log ncu -i /tmp/bwd_ncu.ncu-rep --page raw --csv
    note "ncu: durations $(grep -E '^ +Duration' "$L/ncu_details.log" | awk '{print $3, $2}' | tr '\n' ' ')"
fi

step 60 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="15 $NEW" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest (0, 15 $NEW): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"
pack

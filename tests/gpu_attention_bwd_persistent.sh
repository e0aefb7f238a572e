#!/bin/bash
# tests/gpu_attention_bwd_persistent.sh OUT — session 9 (B): the Hopper backward's new opt-in
# variants on ONE H200, <= 200 s (LANE_LIMIT, default 190 s): 16 (15 in one persistent CTA per SM,
# the next item's K/V loaded under the current one), 17 (16 + a block's dQ atomics under the next
# block's first products), 18 (15 + P's mask tests only in the blocks that need them), 19 (17 + 18's):
#   1. build tk_attention_hopper_bwd (a no-op when the call prebuilt this tree)
#   2. ncu --set full of the default (15), 18 and 19 at GPT-2 B=32, one launch each: the details
#      page (stall reasons, pipes, L2, occupancy) and the raw metrics (where the time goes)
#   3. compute-sanitizer racecheck of 16, 17, 19 (the new synchronization), memcheck of 16-19, at
#      shapes with more items than SMs
#   4. GPU tests: tests/test_attention_hopper_bwd_persistent.py (float64 reference, bitwise dK/dV
#      vs 15, repeated calls, graph replays)
#   5. kernels/attention_bwd_bench.py: 15-19 vs cuDNN, interleaved graph replays, GPT-2 B=32 and
#      shakespeare
#   6. tests/test_attention_hopper_bwd.py for 15-19 (as far as the time goes)
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-190}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_persistent_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_persistent.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 1b. smoke: 16, 17, 19 (the new synchronization) once each at the sanitizer shapes; one that fails
#     or hangs is left out of the rest (18 changes arithmetic code only: its tests say if it is wrong)
NEW="18"
for v in 16 17 19; do
    if step 20 smoke.log python3 tests/test_attention_hopper_bwd_persistent.py $v; then
        NEW="$NEW $v"; note "smoke $v: ok"
    else
        note "smoke $v FAILED (smoke.log): left out of the rest"; tail -5 "$L/smoke.log" >> "$S"
    fi
done
NEW=${NEW# }
V="15${NEW:+,${NEW// /,}}"
has() { [[ " $NEW " == *" $1 "* ]]; }
NCU_V=15; for v in 18 19; do has $v && NCU_V="$NCU_V,$v"; done
RACE_V=""; for v in 16 17 19; do has $v && RACE_V="$RACE_V $v"; done

# 2. where the time goes: ncu --set full of one launch each (clocks locked at base: durations read
#    longer than in the bench); the details page (stall reasons, pipes, L2) and every raw metric
step 50 ncu.log ncu --set full --import-source no -k regex:backward_kernel -c 3 -f -o /tmp/bwd_ncu \
    python3 -m kernels.attention_bwd_bench --ncu-once $NCU_V
step 15 ncu_details.log ncu -i /tmp/bwd_ncu.ncu-rep --page details --print-details all
step 15 ncu_raw.log ncu -i /tmp/bwd_ncu.ncu-rep --page raw --csv
note "ncu: durations $(grep -E '^ +Duration' "$L/ncu_details.log" | awk '{print $3, $2}' | tr '\n' ' ')"

# 3. sanitizers on the persistent path (more items than SMs) and the default
[ -n "$RACE_V" ] && step 30 racecheck.log compute-sanitizer --tool racecheck \
    python3 tests/test_attention_hopper_bwd_persistent.py $RACE_V
note "racecheck ($RACE_V): $(grep -E 'RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ')"
[ -n "$NEW" ] && step 20 memcheck.log compute-sanitizer --tool memcheck python3 tests/test_attention_hopper_bwd_persistent.py $NEW
note "memcheck ($NEW): $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

# 4. GPU tests: the persistent file (then the bench, then the main file's tests)
[ -n "$NEW" ] && step 40 pytest_persistent.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="$NEW" python3 -m pytest -q \
    --tb=short -rf -p no:cacheprovider tests/test_attention_hopper_bwd_persistent.py
note "pytest persistent: $(grep -E 'passed|failed|error' "$L/pytest_persistent.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_persistent.log" | head -10 | cut -c1-220 >> "$S"

# 5. the bench (before the long test file, so a slow pytest cannot cut it)
step 35 bwd_bench.log python3 -m kernels.attention_bwd_bench --shapes gpt2,shakespeare --variants $V \
    --rounds 11 --reps 10 --json "$L/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"

step 40 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="15 $NEW" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest (0, 15 $NEW): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"
pack

#!/bin/bash
# tests/gpu_attention_bwd_fused.sh OUT — session 10 (B): the Hopper backward on ONE H200, <= 170 s
# (LANE_LIMIT, default 165 s):
#   19  D = 64's default since session 10 (16 + SPLIT_MASK: 501.4 us vs 16's 507.6 in s10call1),
#       on the condition that the whole test_attention_hopper_bwd.py passes with it (step 4)
#   20  19 + FUSED_DQ (opt-in, new): no dQ conversion kernel; each quarter of a dQ block is converted
#       to bf16 by the warp whose atomics arrive last at its counter (block i counted in block i+1's
#       window, its ticket read in block i+2's)
#   21  19 + FUSED_EARLY (opt-in, new): 20 with block i's arrival issued right after block i+1's
#       Sᵀ, dPᵀ wgmmas (the release fence under their run), its ticket read in block i+1's window
#   22, 23  20, 21 + SELF_CLEAN (opt-in, new): the converting warp leaves its quarter and counter
#       zero, so the accumulator is one buffer kept between calls and prep_kernel only computes Di
#   1. build (a no-op when the call prebuilt this tree)
#   2. smoke of 20-23 (the sanitizer case, no checks; one process, each alone if that fails): one
#      that fails is left out of the rest
#   3. tests/test_attention_hopper_bwd_persistent.py for 16, 19 and the new ones (float64 at odd T
#      1..999 with B = 1, dK/dV bitwise equal to 15's, dq within 1e-2 of 15's over repeated calls,
#      shapes changing between calls, CUDA-graph replays)
#   4. tests/test_attention_hopper_bwd.py, all of it, with variants 5 (D = 128), 19, and 22, 23 (20,
#      21 are their code less the cleaning stores) (variant 0 = 19 now: test_after_forward, T = 4096,
#      determinism, the op, bad inputs, nvcc)
#   5. compute-sanitizer racecheck, then memcheck, of 19, 22, 23 (more items than SMs)
#   6. kernels/attention_bwd_bench.py: 16, 19 and the new ones vs cuDNN (the whole backward: prep,
#      main kernel, conversion where there is one), interleaved graph replays, GPT-2 B=32, shakespeare
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-165}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_fused_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_fused.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

NEW="20 21 22 23"
if step 20 smoke.log python3 tests/test_attention_hopper_bwd_persistent.py $NEW; then
    note "smoke $NEW: ok"
else
    NEW=""
    for v in 20 21 22 23; do
        if step 12 smoke.log python3 tests/test_attention_hopper_bwd_persistent.py $v; then
            NEW="$NEW $v"; note "smoke $v: ok"
        else
            note "smoke $v FAILED (smoke.log): left out of the rest"; tail -4 "$L/smoke.log" >> "$S"
        fi
    done
    NEW=${NEW# }
fi
has() { [[ " $NEW " == *" $1 "* ]]; }
CLEAN="$(has 22 && echo 22) $(has 23 && echo 23)"

step 25 pytest_persistent.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="16 19 $NEW" python3 -m pytest -q \
    --tb=short -rf -p no:cacheprovider tests/test_attention_hopper_bwd_persistent.py
note "pytest persistent (16 19 $NEW): $(grep -E 'passed|failed|error' "$L/pytest_persistent.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_persistent.log" | head -10 | cut -c1-220 >> "$S"

step 55 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="5 19 $CLEAN" python3 -m pytest -q --maxfail=10 --tb=short \
    -rf -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest test_attention_hopper_bwd.py (0 = 19, 5, 19 $CLEAN): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"

step 20 racecheck.log compute-sanitizer --tool racecheck python3 tests/test_attention_hopper_bwd_persistent.py 19 $CLEAN
note "racecheck (19 $CLEAN): $(grep -E 'RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ')"
step 15 memcheck.log compute-sanitizer --tool memcheck python3 tests/test_attention_hopper_bwd_persistent.py 19 $CLEAN
note "memcheck (19 $CLEAN): $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

V="19,16${NEW:+,${NEW// /,}}"
step 45 bwd_bench.log python3 -m kernels.attention_bwd_bench --shapes gpt2,shakespeare --variants $V \
    --rounds 9 --reps 10 --json "$L/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"
pack

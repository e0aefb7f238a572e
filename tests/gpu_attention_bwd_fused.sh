#!/bin/bash
# tests/gpu_attention_bwd_fused.sh OUT — session 10 (B): the Hopper backward on ONE H200, <= 170 s
# (LANE_LIMIT, default 165 s):
#   19  D = 64's default since session 10 (16 + SPLIT_MASK: 501.4 us vs 16's 507.6 in s10call1),
#       on the condition that the whole test_attention_hopper_bwd.py passes with it (step 3)
#   20  19 + FUSED_DQ (opt-in, new): no dQ conversion kernel; each quarter of a dQ block is converted
#       to bf16 by the warp whose atomics arrive last at its counter (block i counted in block i+1's
#       window, its ticket read in block i+2's)
#   21  19 + FUSED_EARLY (opt-in, new): 20 with block i's arrival issued right after block i+1's
#       Sᵀ, dPᵀ wgmmas (the release fence under their run), its ticket read in block i+1's window
#   22, 23  20, 21 + SELF_CLEAN (opt-in, new): the converting warp leaves its quarter and counter
#       zero, so the accumulator is one buffer kept between calls and prep_kernel only computes Di
#   24  22 with a warp's arrivals counted an item at a time (FUSED_ITEM; opt-in, new)
#   1. build (a no-op when the call prebuilt this tree)
#   2. smoke of 20-24 (the sanitizer case, no checks; one process, each alone if that fails): one
#      that fails is left out of the rest
#   3. tests/test_attention_hopper_bwd.py, all of it, variant 0 = 19 and the sweep with 19 (D = 128's
#      5 is unchanged: its SASS is identical, and variant 0 still runs at D = 128)
#   4. tests/test_attention_hopper_bwd_persistent.py for 19 and the new ones (float64 at odd T
#      1..999 with B = 1, dK/dV bitwise equal to 15's, dq within 1e-2 of 15's over repeated calls,
#      shapes of every size in turn (T up to 4096), CUDA-graph replays)
#   5. test_attention_hopper_bwd.py's GPU sweep again with 22 and 24 (20, 21, 23 are code of
#      theirs: 20 = 22 less the cleaning stores, 21/23 = 20/22 with the arrival moved)
#   6. compute-sanitizer racecheck, then memcheck, of 19, 22, 23, 24 (more items than SMs)
#   7. kernels/attention_bwd_bench.py: 19, 16, 20, 22, 23, 24 vs cuDNN (the whole backward: prep,
#      main kernel, conversion where there is one), interleaved graph replays, GPT-2 B=32, shakespeare
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-165}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_fused_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_fused.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

NEW="20 21 22 23 24"
if step 15 smoke.log python3 tests/test_attention_hopper_bwd_persistent.py $NEW; then
    note "smoke $NEW: ok"
else
    NEW=""
    for v in 20 21 22 23 24; do
        if step 10 smoke.log python3 tests/test_attention_hopper_bwd_persistent.py $v; then
            NEW="$NEW $v"; note "smoke $v: ok"
        else
            note "smoke $v FAILED (smoke.log): left out of the rest"; tail -4 "$L/smoke.log" >> "$S"
        fi
    done
    NEW=${NEW# }
fi
has() { [[ " $NEW " == *" $1 "* ]]; }
pick() { local out=""; for v in "$@"; do has "$v" && out="$out $v"; done; echo "${out# }"; }

step 50 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="19" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest test_attention_hopper_bwd.py (0 = 19, sweep 19): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"

step 25 pytest_persistent.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="19 $NEW" python3 -m pytest -q \
    --tb=short -rf -p no:cacheprovider tests/test_attention_hopper_bwd_persistent.py
note "pytest persistent (19 $NEW): $(grep -E 'passed|failed|error' "$L/pytest_persistent.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_persistent.log" | head -10 | cut -c1-220 >> "$S"

SWEEP=$(pick 22 24)
if [ -n "$SWEEP" ]; then
    step 30 pytest_sweep.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="$SWEEP" python3 -m pytest -q --maxfail=10 \
        --tb=short -rf -p no:cacheprovider -k "not nvcc and not bindings_parse and not script" \
        tests/test_attention_hopper_bwd.py
    note "pytest test_attention_hopper_bwd.py GPU sweep ($SWEEP): $(grep -E 'passed|failed|error' "$L/pytest_sweep.log" | tail -1)"
    grep -E "^FAILED|^ERROR" "$L/pytest_sweep.log" | head -10 | cut -c1-220 >> "$S"
fi

SAN="19 $(pick 22 23 24)"
step 18 racecheck.log compute-sanitizer --tool racecheck python3 tests/test_attention_hopper_bwd_persistent.py $SAN
note "racecheck ($SAN): $(grep -E 'RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ')"
step 15 memcheck.log compute-sanitizer --tool memcheck python3 tests/test_attention_hopper_bwd_persistent.py $SAN
note "memcheck ($SAN): $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

BENCH=$(pick 20 22 23 24)
V="19,16${BENCH:+,${BENCH// /,}}"
step 60 bwd_bench.log python3 -m kernels.attention_bwd_bench --shapes gpt2,shakespeare --variants $V \
    --rounds 9 --reps 10 --json "$L/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"
pack

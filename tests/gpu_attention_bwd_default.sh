#!/bin/bash
# tests/gpu_attention_bwd_default.sh OUT — engineer B, session 7, call 3 (issue 7). Verifies the
# [as run in call 3 at commit b31b295; variants 15-23 were removed after it (they lost), so their
# smoke now fails by design, and D = 128's default stayed 5]
# Hopper attention backward's proposed defaults (kernels/attention_hopper_bwd.cu: D = 64 -> 12 =
# 4 + dQ by vector atomics + prep_kernel, D = 128 -> 11 = 5 + prep_kernel; the old ones 4 / 5) and
# runs, for the first time, the candidates that may replace 12: 15-18 (dQ conversion by each
# head's last CTA, no kernel 3), 19-22 (those + LAZY_ZERO: no dq_accum zeroing pass), 23 (12 +
# LAZY_ZERO). ONE H200, within 110 s (LANE_LIMIT, default 107 s):
#   1. build tk_attention_hopper_bwd (a no-op when the call prebuilt this tree)
#   2. smoke, per new variant: test_causal at T = 1000, D = 64 (-v: a hang shows where)
#   3. kernels/attention_bwd_bench.py: 4 (old default) vs 12 (proposed) vs the new variants that
#      passed the smoke vs cuDNN's backward, interleaved graph replays, at GPT-2 B=32, shakespeare
#      and t4096-d128 (there every variant but 4 is 5 + prep_kernel = the proposed D = 128 default)
#   4. GPU tests: variant 0 (the proposed defaults), 11, 12 and the smoke-passing new variants
#      (15, 16, 18: smoke only; they combine pieces the others test), D 64
#      and 128: float64 reference, poisoned outputs, T 1..4096, B·H from 1, large logits, packed
#      views, non-causal, after the Hopper forward, L2 groups, every variant vs the default
#   5. compute-sanitizer racecheck, then memcheck, of the small case: 0 and the same variants
# Results: OUT/summary.txt, OUT/bwd_bench.json, OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-107}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

NEWV="19 20 21 22 23 17 15 16 18"
step 25 smoke.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="$NEWV" python3 -m pytest -v --tb=short -p no:cacheprovider \
    tests/test_attention_hopper_bwd.py -k "test_causal and 1000-64"
GOOD=""
for v in $NEWV; do grep -qE "1000-64-$v\] PASSED" "$L/smoke.log" && GOOD="$GOOD $v"; done
note "smoke: $(grep -E 'passed|failed|error' "$L/smoke.log" | tail -1); new variants that passed:$GOOD"
MAIN=$(for v in $GOOD; do [[ " 15 16 18 " == *" $v "* ]] || printf ' %s' "$v"; done)   # 15, 16, 18: smoke only
BENCHV="4,12$(for v in $MAIN; do printf ',%s' "$v"; done)"

step 25 bwd_bench.log python3 -m kernels.attention_bwd_bench --variants "$BENCHV" --rounds 5 --reps 10 \
    --json "$OUT/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"

step 32 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="11 12$MAIN" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest (0 = proposed defaults, 11, 12,$MAIN): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"

SANV="0 12$MAIN"
step 25 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_bwd_sanitize_case.py $SANV
note "racecheck ($SANV): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ') last: $(grep ' ran$' "$L/racecheck.log" | tail -1)"
step 18 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_bwd_sanitize_case.py $SANV
note "memcheck ($SANV): $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ') last: $(grep ' ran$' "$L/memcheck.log" | tail -1)"
pack

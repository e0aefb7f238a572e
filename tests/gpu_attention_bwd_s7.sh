#!/bin/bash
# tests/gpu_attention_bwd_s7.sh OUT — engineer B, session 7, call 2 (issue 7: the attention
# [as run in call 2 at commit 382b4d5; variants 6 and 7 were removed after it, so their smoke and
# tests now fail by design; call 3's script is tests/gpu_attention_bwd_default.sh]
# backward's share of the GPT-2 step). Opt-in variants of kernels/attention_hopper_bwd.cu (D = 64):
#   6 = 4 (the default) with Di = rowsum(dO∘O) inside the main kernel (no kernel 1: -33 us/layer?)
#   7 = 6 with the dQ partials added by red.global.add.v4.f32 from registers (no dQ smem/bar.sync)
#   8 = 4 with those atomics only (separates the two effects)
#   9 = one consumer (64 keys) per CTA, two CTAs per SM (one's start/end under the other's work),
#       dQ by atomics; 10 = 9 with the bulk reduce-add dQ
#   11-14 = 4, 8, 9, 10 with prep_kernel: dq_accum zeroed and Di in one pass (no memset, no kernel 1)
#   15-18 = 13, 14, 12, 11 with the dQ conversion done by each head's last CTA (no kernel 3)
# ONE H200, within 120 s (LANE_LIMIT, default 115 s):
#   1. build tk_attention_hopper_bwd (+ the forward; no-ops when the call prebuilt them)
#   2. smoke: test_causal at T = 1000, D = 64, variants 6-18 (a hung mbarrier dies here, 30 s)
#   3. kernels/attention_bwd_bench.py: the backward alone (memset + kernels), variants 4, 6-18 and
#      cuDNN's backward, interleaved rounds of CUDA-graph replays, at GPT-2 (32, 12, 1024, 64),
#      shakespeare (64, 6, 256, 64) and (4, 16, 4096, 128) (D = 128 runs 5 for every variant)
#   4. ncu of the main kernel at GPT-2's shape: variant 4, then 7 and 9 (SpeedOfLight, WarpStateStats,
#      SchedulerStats, MemoryWorkloadAnalysis, Occupancy; one launch each)
#   5. the GPU tests of variants 6-18 (float64 reference, poisoned outputs, T 1..4096, D 64/128,
#      after the Hopper forward, packed views, non-causal, L2 groups, variants vs the default)
#   6. compute-sanitizer memcheck of the small case (variants 0, 6-18), time permitting
# Results: OUT/summary.txt, OUT/bwd_bench.json, OUT/logs.tgz (every log, ncu's report included).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_s7_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_s7.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 70 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. smoke, per variant (-v: a variant that hangs leaves the ones before it PASSED in the log)
step 30 smoke.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="6 7 8 9 10 11 12 13 14 15 16 17 18" python3 -m pytest -v --tb=short -p no:cacheprovider \
    tests/test_attention_hopper_bwd.py -k "test_causal and 1000-64"
GOOD=4
for v in 6 7 8 9 10 11 12 13 14 15 16 17 18; do grep -qE "1000-64-$v\] PASSED" "$L/smoke.log" && GOOD="$GOOD,$v"; done
note "smoke: $(grep -E 'passed|failed|error' "$L/smoke.log" | tail -1); variants timed: $GOOD"

# 3. interleaved timing of the backward alone, with cuDNN's
step 35 bwd_bench.log python3 -m kernels.attention_bwd_bench --variants "$GOOD" --rounds 7 --reps 10 \
    --json "$OUT/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"

# 4. ncu of the main kernel (variant 4, then 7 and 9 where they passed the smoke)
NCU_VARIANTS=4; NCU_COUNT=1
for v in 7 9; do [[ ",$GOOD," == *",$v,"* ]] && { NCU_VARIANTS=$NCU_VARIANTS,$v; NCU_COUNT=$((NCU_COUNT + 1)); }; done
step 40 ncu.log ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section Occupancy -k regex:backward_kernel -c $NCU_COUNT \
    python3 -m kernels.attention_bwd_bench --ncu-once $NCU_VARIANTS
grep -E "backward_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Achieved Occupancy|Registers Per" \
    "$L/ncu.log" | cut -c1-150 >> "$S"

# 5. GPU tests of the new variants
step 45 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="6 7 8 9 10 11 12 13 14 15 16 17 18" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py
note "pytest (variants 6-18 + the default's own tests): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"

# 6. memcheck on the small case
step 30 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_bwd_sanitize_case.py
note "memcheck: $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"
pack

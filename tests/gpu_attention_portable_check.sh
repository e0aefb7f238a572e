#!/bin/bash
# tests/gpu_attention_portable_check.sh OUT — the portable attention forward's check on ONE H200,
# within 120 s (LANE_LIMIT, default 115 s). First run in session 8's first call as
# gpu_attention_portable_next.sh, which made variant 9 D = 64's default forward
# (kernels/attention_portable.cu, DEFAULT_FWD_VARIANT: GPT-2 1.23x FA2; kernels/NOTES.md, session 8,
# lead). Variants 9 (128-key cp.async stages, the default) and 10 (64-key stages) run
# attention_forward_split_kernel: the diagonal tiles as their own fully unrolled code path, plain
# tiles with no mask code, interleaved row tiles per warp; variant 3 is the default before them.
#   0. in the background: tests/attention_emu/main.cpp built with nvcc (the kernels without torch,
#      for compute-sanitizer)
#   1. build tk_attention (a no-op when the call prebuilt it from this tree)
#   2. GPU tests of 9 and 10: float64 at T 1..4096 and around the 64/128-row seams, D 64 (and 128:
#      the fallback), causal and full, poisoned outputs, vs variant 3's output, the backward on
#      their o and lse, CUDA-graph replays; then the forward block-shape tests (variants 0-3)
#   3. kernels/attention_portable_bench.py: FA2, p-default, p3/3, p9/3, p10/3 interleaved (9 rounds
#      of CUDA-graph replays), fwd and fwd+bwd at gpt2 and shakespeare-char
#   4. compute-sanitizer memcheck and racecheck of 9 and 10 (causal and full, tails)
#   5. ncu (time permitting): one GPT-2 forward each of 3, 9, 10
# Results: OUT/summary.txt, OUT/portable_next.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/attention_portable_check_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_ATTENTION_FWD_VARIANT TK_ATTENTION_BWD_VARIANT
note "gpu_attention_portable_check.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null); defaults: $(grep -E 'constexpr int DEFAULT_(FWD|BWD)_VARIANT' kernels/attention_portable.cu | tr -s ' ' | tr '\n' ' ')"

# 0. the torch-free harness for the sanitizers, built while the tests run
EMU_BIN=/tmp/attention_portable_check_emu_gpu
( timeout 60 nvcc -x cu -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -I. -Ikernels \
    tests/attention_emu/main.cpp -o $EMU_BIN > "$L/harness_build.log" 2>&1; echo "rc=$?" >> "$L/harness_build.log" ) &
HARNESS=$!

# 1. build (no-op when prebuilt)
step 60 build.log python3 -m kernels --build tk_attention
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. GPU tests of the new variants (and the older forward block shapes beside them)
step 40 pytest.log python3 -m pytest -q --maxfail=20 --tb=short -rf -p no:cacheprovider tests/test_attention.py \
    -k "session7_p2 or test_forward_block_shape_variants"
note "pytest (forward 9, 10 + block shapes 0-3): $(grep -E 'passed|failed|error|skipped' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -12 | cut -c1-220 >> "$S"

# 3. interleaved timing vs FA2 and the default (p3/3 = the default's kernels again: noise floor)
step 35 bench.log python3 -m kernels.attention_portable_bench --shapes gpt2,shakespeare-char \
    --fwd 3/3,9/3,10/3 --fwdbwd 9/3,10/3 --rounds 9 --reps 15 --json "$OUT/portable_next.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bench.log" | grep -vE "^\s*$" >> "$S"

# 4. sanitizers on the torch-free harness (args: fwd-variant B H T D causal)
wait $HARNESS
note "harness build: $(tail -1 "$L/harness_build.log")"
if [ -x $EMU_BIN ]; then
    for case in "9 1 2 300 64 1" "10 1 2 300 64 1" "9 1 1 191 64 0" "10 1 1 129 64 0"; do
        set -- $case
        step 15 memcheck.log env TK_ATTENTION_FWD_VARIANT=$1 compute-sanitizer --tool memcheck $EMU_BIN $2 $3 $4 $5 $6 5
        note "memcheck fwd $1 ($2,$3,$4,$5 causal=$6): $(grep -E 'ERROR SUMMARY|^o=' "$L/memcheck.log" | tail -2 | tr '\n' ' ')"
    done
    for case in "9 1 1 250 64 1" "10 1 1 300 64 1" "9 1 1 191 64 0"; do
        set -- $case
        step 20 racecheck.log env TK_ATTENTION_FWD_VARIANT=$1 compute-sanitizer --tool racecheck $EMU_BIN $2 $3 $4 $5 $6 5
        note "racecheck fwd $1 ($2,$3,$4,$5 causal=$6): $(grep -E 'RACECHECK SUMMARY|^o=' "$L/racecheck.log" | tail -2 | tr '\n' ' ')"
    done
fi

# 5. ncu: one GPT-2 forward of 3, 9, 10 (in that order)
step 25 ncu.log ncu --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats -k regex:"attention_forward" -c 3 \
    python3 -m kernels.attention_portable_bench --ncu-once 3/3,9/3,10/3
grep -E "attention_forward|Duration|Compute \(SM\) Throughput|Warp Cycles Per Issued|Achieved Occupancy|Registers Per" \
    "$L/ncu.log" | cut -c1-150 >> "$S"
pack

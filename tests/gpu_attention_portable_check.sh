#!/bin/bash
# tests/gpu_attention_portable_next.sh OUT — engineer P2, session 7 (prepared, NOT run in session 7:
# the session's device budget was spent). Issue 5's last open criterion: the portable forward at
# the GPT-2 shape (B=16, H=12, T=1024, D=64, causal) at least matching FA2 (call 4: 0.991x).
# Opt-in forward variants of kernels/attention_portable.cu (the default stays 3; D = 128 runs 0):
#   9  = attention_forward_split_kernel with 128-key cp.async stages (one barrier per 128 keys,
#        two 64-key tiles of math per stage)
#   10 = the same with 64-key stages (variant 3's shape)
#   both: the diagonal tiles as their own fully unrolled code path (dead 16-key chunks left out at
#   compile time), plain tiles with no mask code at all, FA2's interleaved row tiles per warp.
# ONE H200, within 120 s (LANE_LIMIT, default 115 s):
#   0. in the background: tests/attention_emu/main.cpp built with nvcc (the kernels without torch,
#      for compute-sanitizer)
#   1. build tk_attention (a no-op when the call prebuilt it from this tree)
#   2. GPU tests of 9 and 10: float64 at T 1..4096 and around the 64/128-row seams, D 64 (and 128:
#      the fallback), causal and full, poisoned outputs, vs variant 3's output, the backward on
#      their o and lse, CUDA-graph replays; then the forward block-shape tests (variants 0-3)
#   3. kernels/attention_portable_bench.py: FA2, p-default (3/3), p3/3 (the same kernels again:
#      the noise floor), p9/3, p10/3 interleaved (9 rounds of CUDA-graph replays), fwd and
#      fwd+bwd at gpt2 and shakespeare-char
#   4. compute-sanitizer memcheck and racecheck of 9 and 10 (causal and full, tails)
#   5. ncu (time permitting): one GPT-2 forward each of 3, 9, 10
# Results: OUT/summary.txt, OUT/portable_next.json, OUT/logs.tgz (every log).
# Decision rule (team.md): a variant may become DEFAULT_FWD_VARIANT only if its tests and the
# sanitizers pass here AND it is faster than p-default in this same interleaved run at gpt2 (and
# not slower beyond the p3/3-vs-p-default spread at shakespeare-char).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/attention_portable_next_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_ATTENTION_FWD_VARIANT TK_ATTENTION_BWD_VARIANT
note "gpu_attention_portable_next.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null); defaults: $(grep -E 'constexpr int DEFAULT_(FWD|BWD)_VARIANT' kernels/attention_portable.cu | tr -s ' ' | tr '\n' ' ')"

# 0. the torch-free harness for the sanitizers, built while the tests run
EMU_BIN=/tmp/attention_portable_next_emu_gpu
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

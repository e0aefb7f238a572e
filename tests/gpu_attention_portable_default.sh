#!/bin/bash
# tests/gpu_attention_portable_default.sh OUT — engineer P, session 7 (prepared, not run in session 7):
# checks the portable attention kernel's defaults (DEFAULT_FWD_VARIANT / DEFAULT_BWD_VARIANT in
# kernels/attention_portable.cu; since session 7 forward 3 (D = 64) / 0 (D = 128) and backward 3)
# beside the previous ones (OLD_FWD/OLD_BWD, default 3/1: session 4's) and FA2.
# ONE H200, within 110 s (LANE_LIMIT, default 105 s):
#   0. in the background: tests/attention_emu/main.cpp built with nvcc (for compute-sanitizer)
#   1. build tk_attention (a no-op when the call prebuilt it from this tree)
#   2. every GPU test of tests/test_attention.py but the session-7 variant tests, with the default:
#      float64 reference at T 1..4096, D 64/128, poisoned outputs, packed qkv, opcheck,
#      torch.compile, the model's loss and gradients tk vs torch, the block shapes
#   3. kernels/attention_portable_bench.py: FA2, the default (p-default) and the old one
#      (pOLD_FWD/OLD_BWD) interleaved, fwd and fwd+bwd, at gpt2, shakespeare-char, t4096-d128
#   4. compute-sanitizer memcheck and racecheck of the default (variables unset)
# Results: OUT/summary.txt, OUT/portable_default.json, OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-105}
OLD_FWD=${OLD_FWD:-3}
OLD_BWD=${OLD_BWD:-1}
source tests/gpu_lib.sh "${1:-/tmp/attention_portable_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_ATTENTION_FWD_VARIANT TK_ATTENTION_BWD_VARIANT
note "gpu_attention_portable_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null); defaults: $(grep -E 'constexpr int DEFAULT_(FWD|BWD)_VARIANT' kernels/attention_portable.cu | tr -s ' ' | tr '\n' ' ')"

EMU_BIN=/tmp/attention_portable_default_emu_gpu
( timeout 60 nvcc -x cu -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -I. -Ikernels \
    tests/attention_emu/main.cpp -o $EMU_BIN > "$L/harness_build.log" 2>&1; echo "rc=$?" >> "$L/harness_build.log" ) &
HARNESS=$!

# 1. build (no-op when prebuilt)
step 60 build.log python3 -m kernels --build tk_attention
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. every GPU test of the portable kernel, with the new default
step 45 pytest.log env TK_ATTENTION_TEST_BACKEND=portable python3 -m pytest -q --maxfail=20 --tb=short -rf \
    -p no:cacheprovider tests/test_attention.py -k "not session7"
note "pytest tests/test_attention.py (new default): $(grep -E 'passed|failed|error|skipped' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -12 | cut -c1-220 >> "$S"

# 3. the new default beside the old one and FA2, interleaved
step 35 bench.log python3 -m kernels.attention_portable_bench --shapes gpt2,shakespeare-char,t4096-d128 \
    --fwd "$OLD_FWD/$OLD_BWD" --fwdbwd "$OLD_FWD/$OLD_BWD" --rounds 9 --reps 15 --json "$OUT/portable_default.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bench.log" | grep -vE "^\s*$" >> "$S"

# 4. sanitizers on the new default (no variables: what training runs)
wait $HARNESS
note "harness build: $(tail -1 "$L/harness_build.log")"
if [ -x $EMU_BIN ]; then
    for case in "1 2 300 64 1" "1 1 200 64 0" "1 1 140 128 1"; do
        set -- $case
        step 20 memcheck.log compute-sanitizer --tool memcheck $EMU_BIN $1 $2 $3 $4 $5 5
        note "memcheck default ($1,$2,$3,$4 causal=$5): $(grep -E 'ERROR SUMMARY|^o=' "$L/memcheck.log" | tail -2 | tr '\n' ' ')"
    done
    for case in "1 1 300 64 1" "1 1 130 64 0"; do
        set -- $case
        step 25 racecheck.log compute-sanitizer --tool racecheck $EMU_BIN $1 $2 $3 $4 $5 5
        note "racecheck default ($1,$2,$3,$4 causal=$5): $(grep -E 'RACECHECK SUMMARY|^o=' "$L/racecheck.log" | tail -2 | tr '\n' ' ')"
    done
fi
pack

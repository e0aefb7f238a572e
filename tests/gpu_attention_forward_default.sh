#!/usr/bin/env bash
# tests/gpu_attention_forward_default.sh OUT_DIR — the Hopper forward's default (DEFAULT_VARIANT_D64 /
# _D128 in kernels/attention_hopper.cu; NEW names its number for the parametrized tests) verified as
# the default and timed beside the previous default(s), OLD (space-separated numbers, still
# selectable), on ONE H200 in <= 110 s, with opt-in CANDIDATES. Session 6's call 3 ran it with
# NEW=21 OLD="12 11" CANDIDATES=25; session 7's: NEW = the winner of call 2, OLD=21
# (TORCH_EXTENSIONS_DIR=/tmp/ext; expects the caller's prebuild, else the smoke step builds;
# LANE_LIMIT bounds every step, tests/gpu_lib.sh; logs in OUT/logs, packed into OUT/logs.tgz;
# figures in OUT/summary.txt). Order, what decides first:
#   1 smoke: the default and OLD with more work items than SMs, under a hard limit; then the
#     candidates in their own process (a hang drops them, not the default)
#   2 tests on the default path: tests/test_attention_hopper.py (variant 0 incl. two streams at
#     once; the parametrized float64 tests over the issue's T list, D 64/128, large logits,
#     strided views, many items, a CUDA graph, with variant NEW = the default's kernel, and the candidates) and tests/test_attention.py's
#     op-level tests with the Hopper backend pinned (forward + backward vs float64 over the issue's
#     shapes, the packed qkv op, the model's loss and gradients tk vs torch, torch.compile, opcheck)
#   3 timing in turns (kernels.attention_bench --interleave, CUDA-graph replay): forward (the
#     default = tk-hopper, OLD, the candidates, cuDNN), racecheck of the default and the
#     candidates (Q-slot reuse), forward+backward (tk = the model's path, OLD, cuDNN), memcheck
# Checked here without a GPU: bash -n; LANE_LIMIT=20 runs every step to its failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-108}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_forward_default.sh OUT_DIR}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
note "gpu_attention_forward_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}

# 1. smoke (builds the forward extension if the caller did not)
NEW=${NEW:?set NEW to the number of the default variant, e.g. NEW=27}
OLD=${OLD:-21}
step 60 smoke.log python3 tests/attention_sanitize_case.py items 0 $OLD
note "smoke: $(grep -oE '^variant [0-9]+ ok' "$L/smoke.log" | tr '\n' ' '); $(tail -1 "$L/smoke.log")"
grep -q "^variant 0 ok" "$L/smoke.log" || { note "THE DEFAULT FORWARD FAILED ITS SMOKE RUN: stopping"; pack; exit 1; }
CANDIDATES=${CANDIDATES:-}
PASSED=""
if [ -n "$CANDIDATES" ]; then
    step 15 smoke_candidates.log python3 tests/attention_sanitize_case.py items $CANDIDATES
    PASSED=$(grep -oE "^variant [0-9]+ ok" "$L/smoke_candidates.log" | awk '{printf "%s ", $2}' | sed 's/ $//')
    note "smoke of the candidates ${CANDIDATES}: passed: ${PASSED:-none}; $(tail -1 "$L/smoke_candidates.log")"
fi

# 2. tests of the default path
TK_ATTENTION_HOPPER_VARIANTS="$NEW $PASSED" TK_ATTENTION_TEST_BACKEND=hopper step 40 tests.log $PYT $XDIST \
    tests/test_attention_hopper.py tests/test_attention.py \
    -k "not nvcc and not bindings_parse and not gpu_script and (not test_attention.py or forward_backward_vs_float64 or packed_qkv or opcheck or torch_compile or model_loss or explicit_scale or output_layout)"
summary "tests (forward default + $NEW $PASSED; op-level on the Hopper backend)" tests.log

# 3. timing in turns, sanitizers
OLD_IMPLS=$(for v in $OLD; do printf ",tk-hopper-v%s" $v; done)
IMPLS="tk-hopper$OLD_IMPLS"
for v in $PASSED; do IMPLS="$IMPLS,tk-hopper-v$v"; done
step 20 interleaved.log python3 -m kernels.attention_bench --interleave gpt2,shakespeare-char,t4096-d128 \
    --impls "$IMPLS,sdpa-cudnn" --rounds 7 --reps 20 "$L/interleaved_fwd.json"
grep -E "interleaved,|ms  \(|skipped" "$L/interleaved.log" | while read -r line; do note "$line"; done
step 15 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py items 0 $PASSED
note "racecheck (forward 0 $PASSED, many items): $(grep -E 'RACECHECK SUMMARY|attention case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"
step 22 interleaved_fwdbwd.log python3 -m kernels.attention_bench --interleave gpt2,shakespeare-char,t4096-d128 \
    --direction fwd+bwd --impls "tk$OLD_IMPLS,sdpa-cudnn" --rounds 5 --reps 10 "$L/interleaved_fwdbwd.json"
grep -E "interleaved,|ms  \(|skipped" "$L/interleaved_fwdbwd.log" | while read -r line; do note "$line"; done
step 12 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_sanitize_case.py items 0 $PASSED
note "memcheck: $(grep -E 'ERROR SUMMARY|attention case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
pack

#!/usr/bin/env bash
# tests/gpu_attention_forward_default.sh OUT_DIR — the Hopper forward's default (DEFAULT_VARIANT_D64 /
# _D128 in kernels/attention_hopper.cu; NEW names its number for the parametrized tests) verified as
# the default and timed beside the previous default(s), OLD (space-separated numbers, still
# selectable), and EXTRA (opt-in candidates, tested and timed beside them), on ONE H200 in <= 90 s.
# Session 6's call 3 ran it with NEW=21, OLD="12 11"; session 7's call 4: NEW=30 (21's kernel with
# a work counter that resets itself, owned per stream and per captured graph launch by the
# bindings: no zeroing kernel per call), OLD=21; session 8's call 3: NEW=35 (30 + DOUBLE_P,
# LEAN_SOFTMAX, STALE_MAX; call 2: GPT-2 0.0721 ms vs 30's 0.0762), OLD=30, EXTRA=37 (35 with
# running row sums, STALE_MAX at D=128 too), after which 37 became the default; the defaults below
# re-verify it (NEW=37, OLD=30, no EXTRA: 35 was removed by the session's review).
# (TORCH_EXTENSIONS_DIR=/tmp/ext; expects the caller's prebuild, else the smoke step builds;
# LANE_LIMIT bounds every step, tests/gpu_lib.sh; logs in OUT/logs, packed into OUT/logs.tgz;
# figures in OUT/summary.txt). Order, what decides first:
#   1 smoke: the default, OLD and EXTRA with more work items than SMs, under a hard limit
#   2 racecheck and memcheck of the default (Q-slot reuse), the two at once (each is mostly CPU;
#     session 7's call 3 ran out of time with them one after the other), while step 3 runs
#   3 tests on the default path: tests/test_attention_hopper.py (variant 0: two streams at once, a
#     CUDA graph replayed beside eager calls on another stream, calls of different sizes back to
#     back on one counter, a CUDA graph behind the kernels that write its inputs; the parametrized
#     float64 tests over the issue's T list, D 64/128, large logits, strided views, many items,
#     with variant NEW = the default's kernel, and EXTRA) and tests/test_attention.py's op-level tests with
#     the Hopper backend pinned (forward + backward vs float64 over the issue's shapes, the packed
#     qkv op, the model's loss and gradients tk vs torch, torch.compile, opcheck)
#   4 timing in turns (kernels.attention_bench --interleave, CUDA-graph replay): forward (the
#     default = tk-hopper, OLD, EXTRA, cuDNN) at the issue's three shapes; then, if time is left,
#     forward+backward (tk = the model's path, OLD, cuDNN)
# Checked here without a GPU: bash -n; LANE_LIMIT=20 runs every step to its failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-88}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_forward_default.sh OUT_DIR}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
note "gpu_attention_forward_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
NEW=${NEW:-37}
OLD=${OLD:-30}
EXTRA=${EXTRA:-}

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}

# 1. smoke (builds the forward extension if the caller did not)
step 15 smoke.log python3 tests/attention_sanitize_case.py items 0 $OLD $EXTRA
note "smoke: $(grep -oE '^variant [0-9]+ ok' "$L/smoke.log" | tr '\n' ' '); $(tail -1 "$L/smoke.log")"
grep -q "^variant 0 ok" "$L/smoke.log" || { note "THE DEFAULT FORWARD FAILED ITS SMOKE RUN: stopping"; pack; exit 1; }
EXTRA=$(for v in $EXTRA; do grep -q "^variant $v ok" "$L/smoke.log" && printf "%s " $v; done; true)
EXTRA=${EXTRA% }

# 2 + 3. sanitizers of the default (mostly CPU) while the tests of the default path run
step 28 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py items 0 &
step 28 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_sanitize_case.py items 0 &
TK_ATTENTION_HOPPER_VARIANTS="$NEW $EXTRA" TK_ATTENTION_TEST_BACKEND=hopper step 32 tests.log $PYT $XDIST \
    tests/test_attention_hopper.py tests/test_attention.py \
    -k "not nvcc and not bindings_parse and not gpu_script and (not test_attention.py or forward_backward_vs_float64 or packed_qkv or opcheck or torch_compile or model_loss or explicit_scale or output_layout)"
wait
summary "tests (forward default + $NEW $EXTRA; op-level on the Hopper backend)" tests.log
note "racecheck (forward default, many items): $(grep -E 'RACECHECK SUMMARY|attention case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"
note "memcheck (forward default, many items): $(grep -E 'ERROR SUMMARY|attention case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"

# 4. timing in turns
OLD_IMPLS=$(for v in $OLD; do printf ",tk-hopper-v%s" $v; done)
EXTRA_IMPLS=$(for v in $EXTRA; do printf ",tk-hopper-v%s" $v; done)
step 16 interleaved.log python3 -m kernels.attention_bench --interleave gpt2,shakespeare-char,t4096-d128 \
    --impls "tk-hopper$OLD_IMPLS$EXTRA_IMPLS,sdpa-cudnn" --rounds 9 --reps 20 "$L/interleaved_fwd.json"
grep -E "interleaved,|ms  \(|skipped" "$L/interleaved.log" | while read -r line; do note "$line"; done
step 15 interleaved_fwdbwd.log python3 -m kernels.attention_bench --interleave gpt2,shakespeare-char,t4096-d128 \
    --direction fwd+bwd --impls "tk$OLD_IMPLS,sdpa-cudnn" --rounds 5 --reps 10 "$L/interleaved_fwdbwd.json"
grep -E "interleaved,|ms  \(|skipped" "$L/interleaved_fwdbwd.log" | while read -r line; do note "$line"; done
pack

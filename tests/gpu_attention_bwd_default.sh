#!/bin/bash
# tests/gpu_attention_bwd_default.sh OUT — engineer B, session 7, call 3 (issue 7): verifies the
# Hopper attention backward's D = 64 default proposed after call 2 (DEFAULT_VARIANT_D64 in
# kernels/attention_hopper_bwd.cu, now NEW below; the old default was 4). ONE H200, within 110 s
# (LANE_LIMIT, default 105 s):
#   1. build tk_attention_hopper_bwd (a no-op when the call prebuilt this tree)
#   2. GPU tests of the backward at D = 64 (variant 0 = the new default, and NEW by number):
#      float64 reference, poisoned outputs, T 1..4096, B·H from 1, large logits, packed views,
#      non-causal, after the Hopper forward, L2 groups, every variant vs the default
#   3. kernels/attention_bwd_bench.py: old default 4 vs NEW vs cuDNN's backward, interleaved,
#      at GPT-2 B=32, shakespeare and t4096-d128 (D = 128's default is unchanged: 5)
#   4. compute-sanitizer racecheck and memcheck of the small case (variants 0 and NEW)
#   5. the model's loss and gradients tk vs torch, torch.compile and opcheck of the op (which now
#      runs the new default), time permitting
# Results: OUT/summary.txt, OUT/bwd_bench.json, OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-105}
NEW=${NEW:-13}
source tests/gpu_lib.sh "${1:-/tmp/attention_bwd_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_attention_bwd_default.sh (NEW=$NEW) on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_attention_hopper_bwd tk_attention_hopper
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

step 40 pytest.log env TK_ATTENTION_HOPPER_BWD_VARIANTS="$NEW" python3 -m pytest -q --maxfail=10 --tb=short -rf \
    -p no:cacheprovider tests/test_attention_hopper_bwd.py -k "not 128"
note "pytest (D = 64: default = $NEW): $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -10 | cut -c1-220 >> "$S"

step 30 bwd_bench.log python3 -m kernels.attention_bwd_bench --variants "4,$NEW" --rounds 11 --reps 10 \
    --json "$OUT/bwd_bench.json"
grep -vE "UserWarning|_warn_once|^===|^rc=" "$L/bwd_bench.log" >> "$S"

step 30 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_bwd_sanitize_case.py 0 "$NEW"
note "racecheck: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize case ran' "$L/racecheck.log" | tr '\n' ' ')"
step 25 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_bwd_sanitize_case.py 0 "$NEW"
note "memcheck: $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

step 30 pytest_model.log python3 -m pytest -q --tb=short -rf -p no:cacheprovider tests/test_attention.py \
    -k "model_loss or torch_compile or opcheck"
note "pytest (model tk vs torch, compile, opcheck): $(grep -E 'passed|failed|error' "$L/pytest_model.log" | tail -1)"
pack

#!/bin/bash
# tests/gpu_layernorm_lean_default.sh OUT — engineer L, session 8, call 3 (the last helper call): verifies
# the new default plan (layernorm.cu's DEFAULT_PLAN: session 6's fwd_full,bwd_tree,pdl,fwd_early_pdl,
# bwd_l2_first2,bwd_reverse + fwd_lean,bwd_lean, the lean kernels that call 2 timed 3-7 us faster at
# every size) on ONE H200 within 90 s (LANE_LIMIT, default 84 s, bounds every step so that `pack`
# always runs). It stays the default only if every test below passes AND it is faster than session
# 6's plan in this run's interleaved bench at 16384, 32768 and 65536 x 768; else it is reverted.
# (Its kernels are PTX-identical to call 2's, whose memcheck of this plan had 0 errors: not rerun.)
#   1. load tk_layernorm (prebuilt from this tree; rebuilt here only if not)          -> build.log
#   2. at the same time (correctness only, no timing), with the new default:
#      a. test_layernorm_variants.py (every flag vs float64; lean == plain kernels, bitwise where
#         they are; the default's instances; pdl inside a CUDA graph)                 -> pytest.log
#      b. every other layernorm GPU test (test_layernorm.py: rows 1, 7, 16384, every width, bias and
#         residual combinations, poisoned outputs; dropout; the model)          -> pytest_default.log
#   3. python -m kernels.layernorm_bench --interleaved: fwd, fwd+bwd at 16384, 32768, 65536 x 768 bf16,
#      the default vs session 6's plan, eager and torch.compile beside, 9 interleaved rounds of 20
#      CUDA-graph replays; then the kernels alone                                      -> bench.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-84}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_lean_default.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_LAYERNORM_VARIANT
status=0
OLD=fwd_full,bwd_tree,pdl,fwd_early_pdl,bwd_l2_first2,bwd_reverse
note "gpu_layernorm_lean_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1); $(git log -1 --format=%h 2>/dev/null); DEFAULT_PLAN $(grep -o 'DEFAULT_PLAN = "[^"]*"' kernels/layernorm.cu)"

step 30 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

step 42 pytest.log python3 -m pytest -q -rfEs --tb=short -n 6 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
step 42 pytest_default.log python3 -m pytest -q -rfEs --tb=short -n 6 \
    -k "not test_cpu_" tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py &
B=$!
wait $A || status=1
wait $B || status=1
note "pytest variants: $(grep -E '(passed|failed|error|skipped)' "$L/pytest.log" | tail -1)"
note "pytest, every other layernorm test (new default): $(grep -E '(passed|failed|error|skipped)' "$L/pytest_default.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_default.log" | head -12 >> "$S"

step 36 bench.log python3 -m kernels.layernorm_bench --interleaved --plans "default;$OLD" --reps 20 --rounds 9 \
    --json "$L/interleaved.json" || status=1
sed -n '/^--interleaved/,$p' "$L/bench.log" | grep -vE "^ *$" | head -48 >> "$S"

note "done, status $status"
pack
exit $status

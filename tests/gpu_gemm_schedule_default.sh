#!/bin/bash
# tests/gpu_gemm_schedule_default.sh OUT — engineer G, session 8, call 3 (issue 3): verifies the
# proposed GEMM default for the weight gradients. matmul(step=0) on a plain product with few
# output tiles (fewer than 2 x SMs tiles of 128x256: GPT-2's four dW shapes) runs step 5 variant
# 10 (the planned schedule: whole tiles + 1-2 k-pieces per CTA, or heads + shared tails, summed
# in the kernel; kernels/gemm.py stream_schedule) instead of 5v7 (equal split-K + memset + TMA
# reduce-add + conversion kernel). Call 2 (tests/gpu_gemm_schedule.sh) measured it. The default
# stays only if this run shows the tests and sanitizers clean AND it faster than 5v7 at every dW
# shape in the same interleaved run, with the forward shapes (4v8, unchanged) beside.
# ONE H200, within 110 s (LANE_LIMIT, default 107 s):
#   1. build tk_gemm (no-op when the call prebuilt it)
#   2. compute-sanitizer memcheck, then racecheck (quick), of the scheduled variants
#   3. GPU tests of the default path: every per-step test at step 0 (GEMM_TEST_STEPS=0), the
#      schedule tests, 5v8's split-K tests, the CPU plan tests (the auto rule)
#   4. kernels/gemm_bench.py: 'auto' (the new default) beside 5v7 (the old one: equal splits +
#      memset + conversion) and torch.matmul, 5 interleaved trials, CUDA graphs, GPT-2's dW shapes,
#      then the forward shapes and 8192^3 (auto = 4v8 under both rules) in graph mode
# Results: OUT/summary.txt (compact), OUT/gemm_bench*.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-107}
source tests/gpu_lib.sh "${1:-/tmp/gemm_schedule_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_schedule_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 60 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

step 15 memcheck.log compute-sanitizer --tool memcheck python3 tests/gemm_schedule_sanitize_case.py
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
step 20 racecheck.log compute-sanitizer --tool racecheck python3 tests/gemm_schedule_sanitize_case.py quick
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"

step 30 pytest_gemm.log env GEMM_TEST_STEPS=0 python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_gemm_plan.py \
    tests/test_gemm_schedule.py tests/test_gemm_splitk.py tests/test_gemm.py \
    -k "not step4_variants and not step5_variants and not cluster_count_knob and not 4-6-0 and not 4-7-5 and not 4-8-0 and not 5-6-1 and not 5-7-0"
note "pytest (step 0 = the default, schedule, 5v8 split-K, plan): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-240 >> "$S"

step 20 gemm_bench.log python3 -m kernels.gemm_bench --steps 0 --variants5 7 --shapes dW --modes graph \
    --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0 --variants5 7 --shapes dW --modes graph (5v7 = the old default)"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"
step 20 gemm_bench_fwd.log python3 -m kernels.gemm_bench --steps 0 --shapes fwd,8192 --modes graph \
    --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench_fwd.json"
{ echo "--- kernels/gemm_bench.py --steps 0 --shapes fwd,8192 --modes graph (auto = 4v8, unchanged)"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench_fwd.log"; } >> "$S"
pack

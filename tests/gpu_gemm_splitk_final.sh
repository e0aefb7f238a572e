#!/bin/bash
# tests/gpu_gemm_splitk_final.sh OUT — engineer G, session 7, call 4 (issue 3): verifies the
# proposed GEMM default for the weight gradients. matmul(step=0) on a plain product with few
# output tiles runs step 5 variant 8 (5v7's 128x128 ping-pong with the split-K finished in the
# kernel, kernels/gemm_splitk_epilogue.cuh) instead of 5v7 (memset + TMA reduce-add + conversion
# kernel). Calls 2 and 3 ran earlier versions: correct (tests, memcheck, racecheck) but 5-17%
# slower than 5v7; this version announces a tile BEFORE sending the next one, so no fence waits
# for fresh reductions; 5v9 (new) is the same with ONE arrival per consumer and tile (a named
# barrier, one release) instead of one per warp. The default (5v8 as committed, or 5v9) stays only
# if this run shows its tests and sanitizers clean AND it faster than 5v7 at every dW shape.
# ONE H200, within 100 s (LANE_LIMIT, default 97 s):
#   1. build tk_gemm (no-op when the call prebuilt it)
#   2. compute-sanitizer memcheck, then racecheck, of 5v8 and 5v9 on small split-K products (tails,
#      bf16 and fp32, repeated calls, consumers with 2 tiles: the arrival one tile later)
#   3. GPU tests of the default path: every per-step test at step 0 (GEMM_TEST_STEPS=0: x·Wᵀ at
#      tails and GPT-2's shapes, dx and dW, split-K, plan cache, graphs, kernel_only),
#      tests/test_gemm_splitk.py (every split count at M/N/K tails vs float64, workspace zero after
#      each call, graph replays, first call inside a capture, checks), 5v8/5v9 plain-variant tests,
#      the CPU plan tests (the auto rule)
#   4. kernels/gemm_bench.py: 'auto' (the new default) beside 'prev-auto' (5v7 + memset +
#      conversion) and 5v9 and torch.matmul, 5 interleaved trials, CUDA graphs, GPT-2's four dW
#      shapes (the forward shapes and 8192^3 run 4v8 under both rules: call 3 timed them)
#   5. if time is left: ncu (SpeedOfLight, WarpStateStats) of 5v7 and 5v8 at dW 3072x16384x768
# Results: OUT/summary.txt (compact), OUT/gemm_bench.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-97}
source tests/gpu_lib.sh "${1:-/tmp/gemm_splitk_final_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_splitk_final.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 50 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. sanitizers first
cat > "$L/sanitize_case.py" <<'EOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
checks = []
# (1000, 1152, 528) with 9 splits: 360 / 432 units on 132 CTAs (short: 2 k-tiles each), so a
# consumer runs 2 tiles and the arrival one tile later runs in store_tile as well as in
# end_tiles; (200, 1040, 144) with 3 splits: tails in M, N and K
quick = sys.argv[1:] == ["quick"]          # racecheck: the first shape, bf16, one call
for variant in (8, 9):
    for (M, K, N, splits) in ((1000, 1152, 528, 9), (200, 1040, 144, 3))[:1 if quick else 2]:
        for dtype in ((torch.bfloat16,) if quick else (torch.bfloat16, torch.float32)):
            for rep in range(1 if quick else 2):
                dy, x = r(K, M), r(K, N)
                c = gemm.matmul(dy.t(), x, step=5, variant=variant, splits=splits, out_dtype=dtype)
                checks.append((f"5v{variant} {M}x{K}x{N} splits {splits} {dtype} call {rep}", c, dy.double().t() @ x.double()))
torch.cuda.synchronize()
bad = 0
for name, c, ref in checks:
    err = ((c.double() - ref).norm() / ref.norm()).item()
    bad += not err < 1e-2
    print(f"{name}: rel err {err:.2e}", "OK" if err < 1e-2 else "BAD")
print(f"gemm splitk sanitize case ran, {bad} bad")
EOF
step 15 memcheck.log compute-sanitizer --tool memcheck python3 "$L/sanitize_case.py"
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
step 25 racecheck.log compute-sanitizer --tool racecheck python3 "$L/sanitize_case.py" quick
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"

# 3. tests of the default path
step 30 pytest_gemm.log env GEMM_TEST_STEPS=0 python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_gemm_plan.py \
    tests/test_gemm_splitk.py tests/test_gemm.py \
    -k "not step4_variants and not step5_variants and not cluster_count_knob and not 4-6-0 and not 4-7-5 and not 4-8-0 and not 5-6-1 and not 5-7-0"
note "pytest (step 0 = the default, the in-kernel split-K, 5v8/5v9 plain-variant tests, plan): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-240 >> "$S"

# 4. the new default vs the previous one vs torch.matmul at the weight gradients
step 20 gemm_bench.log python3 -m kernels.gemm_bench --steps 0 --variants5 9 --prev-auto --shapes dW --modes graph \
    --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0 --variants5 9 --prev-auto --shapes dW --modes graph"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"

# 5. where 5v8's time goes against 5v7's (for the notes; skipped when under 15 s are left)
cat > "$L/ncu_case.py" <<'EOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
dy, x = torch.randn(16384, 3072, device="cuda", dtype=torch.bfloat16), torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16)
for variant in (7, 8):
    gemm.matmul(dy.t(), x, step=5, variant=variant)
torch.cuda.synchronize()
print("ncu case ran")
EOF
# (the section and metric names of session 6's ncu run, known to work on this ncu)
step 20 ncu.log ncu --section SpeedOfLight --section WarpStateStats --print-details all \
    --metrics "smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
    -k "regex:gemm_pingpong" python3 "$L/ncu_case.py"
note "ncu: $(grep -cE 'gemm_pingpong_kernel' "$L/ncu.log") kernels profiled, $(grep -E 'case ran|rc=' "$L/ncu.log" | tr '\n' ' ')"
{ echo "--- ncu (5v7, then 5v8; dW 3072x16384x768)"
  grep -E "gemm_pingpong|Duration|Throughput|Stall|hmma|inst_executed|Warp Cycles Per Issued" "$L/ncu.log" | cut -c1-150 | head -60; } >> "$S"
pack

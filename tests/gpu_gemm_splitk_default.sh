#!/bin/bash
# tests/gpu_gemm_splitk_default.sh OUT — engineer G, session 7, call 3 (issue 3). Decides the GEMM
# default for the weight gradients: matmul(step=0) on a plain product with few output tiles runs
# step 5 variant 8 (5v7's 128x128 ping-pong with the split-K finished in the kernel: bulk
# reduce-adds into a workspace the kernel keeps zeroed, each tile announced one tile later, the
# last split stores it; kernels/gemm_splitk_epilogue.cuh) instead of 5v7 (memset + TMA reduce-add
# + conversion kernel). Call 2 ran the first version (red.v4, arrival at once): correct but 12-17%
# slower; this is its redesign, not yet run. Everything else step 0 runs is unchanged (4v8).
# ONE H200, within 110 s (LANE_LIMIT, default 105 s):
#   1. build tk_gemm (no-op when the call prebuilt it)
#   2. GPU tests of the default path: every per-step test at step 0 (GEMM_TEST_STEPS=0: x·Wᵀ at
#      tails and GPT-2's shapes in bf16 and fp32 into poisoned outputs, dx and dW, split-K, the
#      fused bias/GELU rule, plan cache, graphs, kernel_only), tests/test_gemm_splitk.py (every
#      split count at M/N/K tails vs float64, workspace zero after each call, graph replays, ...),
#      test_gemm's plain-variant tests of 5v8/5v9, the CPU plan tests (the auto rule)
#   3. kernels/gemm_bench.py: the new default ('auto'), the previous one ('prev-auto': 4v8, or 5v7
#      with its memset and conversion), 5v9 and every lesson step beside torch.matmul, 5
#      interleaved trials, graph mode (steps 1-2 eager: graph skips the slow lessons), at 8192^3
#      and GPT-2's fwd and dW shapes
#   4. compute-sanitizer memcheck and racecheck of 5v8 and 5v9 on small split-K products (tails,
#      bf16 and fp32, repeated calls, consumers with 2 tiles: the deferred arrival)
# Results: OUT/summary.txt (compact), OUT/gemm_bench.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-105}
source tests/gpu_lib.sh "${1:-/tmp/gemm_splitk_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_splitk_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 60 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. tests of the default path
step 35 pytest_gemm.log env GEMM_TEST_STEPS=0 python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_gemm_plan.py \
    tests/test_gemm_splitk.py tests/test_gemm.py \
    -k "not step4_variants and not step5_variants and not cluster_count_knob and not 4-6-0 and not 4-7-5 and not 4-8-0 and not 5-6-1 and not 5-7-0"
note "pytest (step 0 = the default, the in-kernel split-K, 5v8/5v9 plain-variant tests, plan): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-240 >> "$S"

# 3. the new default, the previous one, 5v9 and every step vs torch.matmul
step 40 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,1,2,3,4,5 --variants5 9 --prev-auto --modes eager,graph \
    --eager-keys torch,step1,step2 --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0,1,2,3,4,5 --variants5 9 --prev-auto --modes eager,graph --eager-keys torch,step1,step2"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"

# 4. sanitizers on small split-K products of the new kernels
cat > "$L/sanitize_case.py" <<'EOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
checks = []
# (1000, 4096, 528) with 9 splits: 360 / 432 units on 132 CTAs, so a consumer runs 2 tiles and the
# deferred arrival runs inside store_tile as well as in end_tiles; (200, 1040, 144): tails
quick = sys.argv[1:] == ["quick"]          # racecheck: the first shape, one call per dtype
for variant in (8, 9):
    for (M, K, N, splits) in ((1000, 4096, 528, 9), (200, 1040, 144, 3))[:1 if quick else 2]:
        for dtype in (torch.bfloat16, torch.float32):
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
step 20 memcheck.log compute-sanitizer --tool memcheck python3 "$L/sanitize_case.py"
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
step 25 racecheck.log compute-sanitizer --tool racecheck python3 "$L/sanitize_case.py" quick
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"
pack

#!/bin/bash
# tests/gpu_gemm_splitk.sh OUT — engineer G, session 7 (issue 3): split-K finished inside the
# kernel (step 5 variants 8 = 128x128, 9 = 64x256; kernels/gemm_splitk_epilogue.cuh): the last
# split of a tile sums the others' partials from a workspace the kernel keeps zeroed and stores
# the tile, so a weight gradient is one kernel (no memset, no fp32 -> bf16 conversion kernel).
# ONE H200, within 120 s (LANE_LIMIT, default 115 s):
#   1. build tk_gemm (no-op when the call prebuilt it)
#   2. GPU tests: tests/test_gemm_splitk.py (every split count at tails in M/N/K, bf16 and fp32
#      into poisoned outputs vs float64, the workspace zero after every call, graph replays, the
#      first call inside a capture, kernel_only, the workspace checks), the CPU plan tests,
#      test_gemm.py's plain-variant tests for 5v8/5v9 (forward tails bit-identical to 5v0/5v1,
#      dx/dW, refusals, kernel_only) and its split-K / backward tests at steps 0 and 5
#   3. kernels/gemm_bench.py: 5v8, 5v9 beside 'auto' (today's default: 5v7 with memset + reduce-add
#      + conversion on these shapes) and torch.matmul, 5 interleaved trials, graph and kernel
#      modes, at GPT-2's four weight-gradient shapes (GEMM_BENCH_SHAPES overrides)
#   4. compute-sanitizer memcheck and racecheck of 5v8 and 5v9 on small split-K products (tails,
#      bf16 and fp32, repeated calls)
# Results: OUT/summary.txt (compact), OUT/gemm_bench.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/gemm_splitk_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_splitk.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 60 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. tests
step 40 pytest_gemm.log env GEMM_TEST_STEPS=0,5 python3 -m pytest -q --maxfail=5 --tb=short -rf \
    tests/test_gemm_splitk.py tests/test_gemm_plan.py tests/test_gemm.py \
    -k "test_gemm_splitk or test_gemm_plan or test_split_k or test_backward_products or (plain_epilogue and (5-8-0 or 5-9-1)) or (kernel_only_plain and (5-8-0 or 5-9-1))"
note "pytest (splitk + plan + step 0/5 split-K and backward products): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-240 >> "$S"

# 3. the new variants vs today's default vs torch.matmul
step 30 gemm_bench.log python3 -m kernels.gemm_bench --steps 0 --variants5 8,9 --shapes "${GEMM_BENCH_SHAPES:-dW}" \
    --modes graph,kernel --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0 --variants5 8,9 --modes graph,kernel"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"

# 4. sanitizers on small split-K products
cat > "$L/sanitize_case.py" <<'EOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
checks = []
# dW with tails in M and N, K not a multiple of the split count's k-tiles; 2 calls each (the
# second finds the workspace the first left), bf16 and fp32
# (1000, 4096, 528) with 9 splits: 360 / 432 units on 132 CTAs, so a consumer runs 2 tiles and the
# deferred arrival (one tile later) runs inside store_tile as well as in end_tiles
quick = sys.argv[1:] == ["quick"]          # racecheck: the second shape, one call per dtype
for variant in (8, 9):
    for (M, K, N, splits) in ((200, 1040, 144, 3), (1000, 4096, 528, 9))[1 if quick else 0:]:
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
step 25 memcheck.log compute-sanitizer --tool memcheck python3 "$L/sanitize_case.py"
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
step 30 racecheck.log compute-sanitizer --tool racecheck python3 "$L/sanitize_case.py" quick
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"

pack

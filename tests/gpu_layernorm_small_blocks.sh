#!/bin/bash
# tests/gpu_layernorm_small_blocks.sh OUT — engineer L, session 7, call 3 (issue 4: residual + LayerNorm
# fwd+bwd >= 3x torch eager at 16384x768; call 2: 62.5 us vs 184.5 = 2.95x), on ONE H200 within 110 s
# (LANE_LIMIT, default 105 s, bounds every step so that `pack` always runs). Call 2 (gpu_layernorm_grain.sh)
# found the small forward blocks limited to 4 an SM by named barriers (ncu: "Block Limit Barriers 4");
# the fwd_warps flags now run forward_kernel<..., SMALL>, with no named barrier (kernels/layernorm.cu),
# and colsum_fast adds each column's warp sums with a butterfly. Predictions: kernels/NOTES.md,
# "Session 7: L".
#   1. build tk_layernorm (the .cu changed)                                          -> build.log
#   2. at the same time, on the same GPU (correctness only, no timing):
#      a. test_layernorm_variants.py: every flag and every plan the bench times vs float64 on every
#         dtype combination (rows 1, 7, 333, 1000, 4099, 5, 16387; widths 64..4096; with/without
#         bias and residual; poisoned outputs), bitwise reproducible, the instances launched, the
#         forward's block size and grid from the profiler's trace, dropout left to 8-warp blocks,
#         pdl inside a CUDA graph bitwise equal to plain launches                   -> pytest.log
#      b, c. every other layernorm GPU test (test_layernorm.py: rows 1, 7, 16384, every width,
#         with/without bias and residual; test_layernorm_dropout.py; test_layernorm_model.py) with
#         TK_LAYERNORM_VARIANT=$CAND_A, and again with $CAND_B: as if each were the default
#                                                                   -> pytest_a.log, pytest_b.log
#   3. python -m kernels.layernorm_bench --interleaved: fwd, fwd+bwd (bwd = the difference) of the
#      public op at 16384, 32768 and 65536 x 768 bf16: eager, torch.compile, the default plan and
#      the candidates (layernorm_bench.INTERLEAVED_PLANS), 7 interleaved rounds of 20 CUDA-graph
#      replays in one process; then the kernels alone (bench, GPT-2, shakespeare shapes) -> bench.log
#   4. compute-sanitizer memcheck of fwd+bwd with the new instances (small shapes)  -> memcheck.log
#   5. if time is left: ncu of forward, backward and column sum at 16384x768 bf16, default vs
#      $CAND_A                                                                       -> ncu.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-105}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_small_blocks.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_LAYERNORM_VARIANT
status=0
CAND_A=default,fwd_warps1,colsum_fast
CAND_B=default,fwd_warps2,colsum_fast
note "gpu_layernorm_small_blocks.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- kernels tests 2>/dev/null || echo ' (dirty)')"

# 1. build
step 45 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

# 2. tests, three pytest runs at once (correctness only; timing comes after)
step 50 pytest.log python3 -m pytest -v -rfEs --tb=short -n 6 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
OTHERS="tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py"
TK_LAYERNORM_VARIANT=$CAND_A step 50 pytest_a.log python3 -m pytest -q -rfEs --tb=short -n 4 -k "not test_cpu_" $OTHERS &
B=$!
TK_LAYERNORM_VARIANT=$CAND_B step 50 pytest_b.log python3 -m pytest -q -rfEs --tb=short -n 4 -k "not test_cpu_" $OTHERS &
C=$!
wait $A || status=1
wait $B || status=1
wait $C || status=1
note "pytest variants: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1) ($(grep -c PASSED "$L/pytest.log") PASSED lines)"
grep -E "(PASSED|FAILED|ERROR).*(block_size|dropout_kernels_alone|what_launches|inside_a_cuda_graph.*warps)" "$L/pytest.log" | head -9 >> "$S"
note "pytest, every other layernorm test with $CAND_A: $(grep -E '(passed|failed|error)' "$L/pytest_a.log" | tail -1)"
note "pytest, every other layernorm test with $CAND_B: $(grep -E '(passed|failed|error)' "$L/pytest_b.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_a.log" "$L/pytest_b.log" | head -12 >> "$S"

# 3. timing: eager, torch.compile and the tk plans in one process, interleaved rounds
step 45 bench.log python3 -m kernels.layernorm_bench --interleaved --reps 20 --rounds 7 --json "$L/interleaved.json" || status=1
sed -n '/^--interleaved/,$p' "$L/bench.log" | head -130 >> "$S"

# 4. memcheck of the new instances (SMALL forwards with G = 1, 2, 4; the FAST column sum)
cat > "$L/memcheck_case.py" <<'PY'
import torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
B = torch.bfloat16
for plan in ("default,fwd_warps1,colsum_fast", "fwd_warps2,bwd_even", "default,fwd_warps4"):
    ln.set_variant(plan)
    for rows, cols, dt in ((7, 768, B), (1, 64, B), (4099, 384, B), (333, 4096, B), (1001, 768, torch.float32)):
        x, r = (torch.randn(rows, cols, device="cuda").to(dt).requires_grad_() for _ in range(2))
        w, b = (torch.randn(cols, device="cuda").to(dt).requires_grad_() for _ in range(2))
        y, h = ln.add_layernorm(x, r, w, b, 1e-5)
        torch.autograd.grad((y, h), (x, r, w, b), (torch.randn_like(y), torch.randn_like(h)))
torch.cuda.synchronize()
print("memcheck case ran")
PY
if command -v compute-sanitizer > /dev/null; then
    step 30 memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$L/memcheck_case.py" || status=1
    note "memcheck: $(grep -E 'ERROR SUMMARY|memcheck case ran' "$L/memcheck.log" | tr '\n' ' ')"
else
    note "compute-sanitizer not found: skipped"
fi

# 5. ncu, default vs CAND_A (diagnostic only; skipped by `step` when under 15 s are left)
cat > "$L/ncu_case.py" <<PY
import torch
from kernels import layernorm as ln
ext = ln._ext.module
M, C = 16384, 768
x, r, dy, dh = (torch.randn(M, C, device="cuda").bfloat16() for _ in range(4))
w, b = torch.randn(C, device="cuda").bfloat16(), torch.randn(C, device="cuda").bfloat16()
for plan in ("default", "$CAND_A"):
    ln.set_variant(plan)
    y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5)
    ext.backward(dy, dh, h, mean, rstd, w)
torch.cuda.synchronize()
print("ncu case ran")
PY
if command -v ncu > /dev/null; then
    step 30 ncu.log ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
        -k "regex:forward_kernel|column_sum" python3 "$L/ncu_case.py" || true
    grep -E "^  [a-z].*kernel|Duration|SM Active Cycles|Elapsed Cycles|DRAM Throughput|Achieved Active Warps|Block Limit (Barriers|Shared|Registers)|Shared Memory Configuration Size|Grid Size|Block Size" "$L/ncu.log" \
        | sed -E 's/\(const .*\) \(/ (/' | head -60 >> "$S"
fi

note "done, status $status"
pack
exit $status

#!/bin/bash
# tests/gpu_layernorm_grain.sh OUT — engineer L, session 7 (issue 4: residual + LayerNorm fwd+bwd >= 3x
# torch eager at 16384x768; session 6 left 62.6 us vs 184.6 = 2.95x), on ONE H200 within 120 s
# (LANE_LIMIT, default 115 s, bounds every step so that `pack` always runs). The candidates are about
# the grain of the work (kernels/layernorm.cu, "variants"; predictions in kernels/NOTES.md,
# "Session 7: L"): forward blocks of 1, 2 or 4 warps instead of 8 (fwd_warps1/2/4: with fwd_full,
# 16384 one-warp blocks at 16384x768, as torch.compile's Triton forward has them), a backward grid
# whose blocks all take the same number of row steps (bwd_even), a column sum with all its loads in
# flight at once (colsum_fast), and bwd_l2_first vs the default's bwd_l2_first2.
# (Call 2 ran it at commit 2f4746b, where colsum_fast was colsum_wide (its loads only) and the
# fwd_warps flags ran blocks with named barriers, 4 an SM; the names are today's, so it still parses.
# The plans it timed are in kernels/NOTES.md, "Session 7: L"; layernorm_bench's list changed since.)
#   1. build tk_layernorm (python -m kernels --build; the .cu changed)                 -> build.log
#   2. at the same time, on the same GPU (correctness only, no timing):
#      a. test_layernorm_variants.py: every flag vs float64 on every dtype combination (rows 1, 7,
#         333, 1000, 4099, 5, 16387; widths 64..4096; with/without bias and residual; poisoned
#         outputs), bitwise reproducible, the instance launched, the forward's block size and grid
#         and bwd_even's grid read from the profiler's trace, pdl inside a CUDA graph bitwise equal
#         to plain launches                                                          -> pytest.log
#      b. every other layernorm GPU test (test_layernorm.py: rows 1, 7, 16384 and every width;
#         test_layernorm_dropout.py, test_layernorm_model.py) with
#         TK_LAYERNORM_VARIANT=$CANDIDATE, as if it were the default                  -> pytest_candidate.log
#   3. python -m kernels.layernorm_bench --interleaved: fwd, fwd+bwd (bwd = the difference) of the
#      public op at 16384, 32768 and 65536 x 768 bf16: eager, torch.compile, the default plan and
#      the candidates, in 7 interleaved rounds of 20 CUDA-graph replays in one process; then the
#      kernels alone at the bench, GPT-2 and shakespeare shapes                      -> bench.log
#   4. compute-sanitizer memcheck of fwd+bwd with the new flags (small shapes)     -> memcheck.log
#   5. if time is left: ncu of the forward, backward and column sum at 16384x768 bf16, default vs
#      $CANDIDATE (SpeedOfLight, Occupancy, LaunchStats)                             -> ncu.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_grain.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
CANDIDATE=${CANDIDATE:-default,fwd_warps1,bwd_even,colsum_fast}
note "gpu_layernorm_grain.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- kernels tests 2>/dev/null || echo ' (dirty)'); candidate $CANDIDATE"

# 1. build
step 50 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

# 2. tests, two pytest runs at once (correctness only; timing comes after both)
step 45 pytest.log python3 -m pytest -v -rfEs --tb=short -n 7 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
TK_LAYERNORM_VARIANT=$CANDIDATE step 45 pytest_candidate.log python3 -m pytest -q -rfEs --tb=short -n 6 \
    -k "not test_cpu_" tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py &
B=$!
wait $A || status=1
wait $B || status=1
note "pytest variants: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1) ($(grep -c PASSED "$L/pytest.log") PASSED lines)"
grep -E "(PASSED|FAILED|ERROR).*(block_size|bwd_even|inside_a_cuda_graph.*warps)" "$L/pytest.log" | head -9 >> "$S"
note "pytest, every other layernorm test with $CANDIDATE: $(grep -E '(passed|failed|error)' "$L/pytest_candidate.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_candidate.log" | head -10 >> "$S"

# 3. timing: eager, torch.compile and the tk plans in one process, interleaved rounds
step 50 bench.log python3 -m kernels.layernorm_bench --interleaved --reps 20 --rounds 7 --json "$L/interleaved.json" || status=1
sed -n '/^--interleaved/,$p' "$L/bench.log" | head -170 >> "$S"

# 4. memcheck of the new launch shapes (a row index past the end would be the bug to catch)
cat > "$L/memcheck_case.py" <<'PY'
import torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
B = torch.bfloat16
for plan in ("default,fwd_warps1,bwd_even,colsum_fast", "fwd_warps2,bwd_even", "default,fwd_warps4,colsum_fast"):
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

# 5. ncu, default vs the candidate (diagnostic only; skipped by `step` when under 15 s are left)
cat > "$L/ncu_case.py" <<PY
import torch
from kernels import layernorm as ln
ext = ln._ext.module
M, C = 16384, 768
x, r, dy, dh = (torch.randn(M, C, device="cuda").bfloat16() for _ in range(4))
w, b = torch.randn(C, device="cuda").bfloat16(), torch.randn(C, device="cuda").bfloat16()
for plan in ("default", "$CANDIDATE"):
    ln.set_variant(plan)
    y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5)
    ext.backward(dy, dh, h, mean, rstd, w)
torch.cuda.synchronize()
print("ncu case ran")
PY
if command -v ncu > /dev/null; then
    step 35 ncu.log ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
        -k "regex:forward_kernel|backward_kernel|column_sum" python3 "$L/ncu_case.py" || true
    grep -E "^  [a-z].*kernel|Duration|SM Active Cycles|Elapsed Cycles|DRAM Throughput|Achieved Active Warps|Block Size|Grid Size|Registers Per" "$L/ncu.log" \
        | sed -E 's/\(const .*\) \(/ (/' | head -60 >> "$S"
fi

note "done, status $status"
pack
exit $status

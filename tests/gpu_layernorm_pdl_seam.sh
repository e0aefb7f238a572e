#!/bin/bash
# tests/gpu_layernorm_pdl_seam.sh OUT — engineer L (issue 4: residual + LayerNorm fwd+bwd >= 3x torch
# eager at 16384x768), on ONE H200 within 150 s (LANE_LIMIT, default 145 s, bounds every step so that
# `pack` always runs). Call 2 ran this script as gpu_layernorm_memory_hints.sh (memory hints: rows
# ahead in L2, evict-first loads, fewer forward blocks an SM; they lost). It showed the backward's
# rows asked of L2 before its pdl wait paying off under pdl; this run measures the seam between the
# forward and the backward (layernorm.cu): fwd_early_pdl (the forward lets the backward launch as
# each block starts), bwd_l2_first / bwd_l2_first2 (the backward asks L2 for its first 1 / 2 row
# steps before it waits), and bwd_reverse. (Call 3 ran it at commit 0793647: default + those three
# flags won at every size and became the default plan; kernels/NOTES.md, "Session 6: L".)
#   1. build tk_layernorm (python -m kernels --build; ~15-30 s)                        -> build.log
#   2. at the same time, on the same GPU (correctness only, no timing):
#      a. test_layernorm_variants.py: every flag (each alone, on the default plan, with the reversed
#         backward, on the persistent forward) vs float64 on every dtype combination (rows 1, 7, 333,
#         1000, 4099, 5, 16387; widths 64..4096), bitwise reproducible, the instance launched, the
#         flags inside a CUDA graph with pdl bitwise equal to plain launches, dropout left to the
#         plain kernels                                                             -> pytest.log
#      b. every other layernorm GPU test (test_layernorm.py, test_layernorm_dropout.py,
#         test_layernorm_model.py) with TK_LAYERNORM_VARIANT=default + the new flags +
#         bwd_reverse: as if they were the default                                   -> pytest_seam.log
#   3. python -m kernels.layernorm_bench --interleaved: fwd, fwd+bwd (bwd = the difference) of the
#      public op at 16384, 32768 and 65536 x 768 bf16: eager, torch.compile, the default plan and
#      the candidates, timed in 7 interleaved rounds in one process; then the kernels alone at the
#      bench, GPT-2 and shakespeare shapes                                           -> bench.log
#   4. compute-sanitizer memcheck of a fwd+bwd with the new flags (small shapes)     -> memcheck.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-145}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_pdl_seam.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
SEAM_PLAN=default,fwd_early_pdl,bwd_l2_first2,bwd_reverse
note "gpu_layernorm_pdl_seam.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- kernels tests 2>/dev/null || echo ' (dirty)')"

# 1. build
step 70 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

# 2. tests, two pytest runs at once (correctness only; timing comes after both)
step 45 pytest.log python3 -m pytest -v -rfEs --tb=short -n 6 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
TK_LAYERNORM_VARIANT=$SEAM_PLAN step 45 pytest_seam.log python3 -m pytest -q -rfEs --tb=short -n 6 \
    -k "not test_cpu_" tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py &
B=$!
wait $A || status=1
wait $B || status=1
note "pytest variants: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1) ($(grep -c PASSED "$L/pytest.log") PASSED lines)"
grep -E "(PASSED|FAILED|ERROR).*(what_launches|dropout_kernels_alone|inside_a_cuda_graph)" "$L/pytest.log" | head -5 >> "$S"
note "pytest, every other layernorm test with $SEAM_PLAN: $(grep -E '(passed|failed|error)' "$L/pytest_seam.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_seam.log" | head -10 >> "$S"

# 3. timing: eager, torch.compile and the tk plans in one process, interleaved rounds
step 60 bench.log python3 -m kernels.layernorm_bench --interleaved --reps 20 --rounds 7 --json "$L/interleaved.json" || status=1
sed -n '/^--interleaved/,$p' "$L/bench.log" | head -140 >> "$S"

# 4. memcheck of the new instances (a prefetch past a tensor's end would be the bug to catch)
cat > "$L/memcheck_case.py" <<'PY'
import torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
B = torch.bfloat16
for plan in ("default,fwd_early_pdl,bwd_l2_first2", "default,fwd_early_pdl,bwd_l2_first2,bwd_reverse"):
    ln.set_variant(plan)
    for rows, cols in ((7, 768), (1, 64), (4099, 384), (333, 4096)):
        x, r = (torch.randn(rows, cols, device="cuda").to(B).requires_grad_() for _ in range(2))
        w, b = (torch.randn(cols, device="cuda").to(B).requires_grad_() for _ in range(2))
        y, h = ln.add_layernorm(x, r, w, b, 1e-5)
        torch.autograd.grad((y, h), (x, r, w, b), (torch.randn_like(y), torch.randn_like(h)))
torch.cuda.synchronize()
print("memcheck case ran")
PY
if command -v compute-sanitizer > /dev/null; then
    step 40 memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$L/memcheck_case.py" || status=1
    note "memcheck: $(grep -E 'ERROR SUMMARY|memcheck case ran' "$L/memcheck.log" | tr '\n' ' ')"
else
    note "compute-sanitizer not found: skipped"
fi

note "done, status $status"
pack
exit $status

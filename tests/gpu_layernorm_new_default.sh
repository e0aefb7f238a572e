#!/bin/bash
# tests/gpu_layernorm_new_default.sh OUT — engineer L, session 7, call 3: verifies the default plan
# proposed from call 2 (kernels/layernorm.cu's DEFAULT_PLAN, already changed in this tree) on ONE
# H200 within 110 s (LANE_LIMIT, default 105 s, bounds every step so that `pack` always runs):
#   1. build tk_layernorm (the .cu changed)                                          -> build.log
#   2. at the same time, on the same GPU: test_layernorm_variants.py (every flag and the new default
#      vs float64, launch shapes, pdl graph) and every other layernorm GPU test (test_layernorm.py:
#      rows 1, 7, 16384, every width, with/without bias and residual, poisoned outputs;
#      test_layernorm_dropout.py; test_layernorm_model.py), all with the new default  -> pytest*.log
#   3. layernorm_bench --interleaved: eager, torch.compile, the new default and the OLD default
#      (session 6's plan spelled as flags: $OLD) and $EXTRA, interleaved rounds at 16384, 32768 and
#      65536 x 768 bf16; then the kernels alone                                     -> bench.log
#   4. compute-sanitizer memcheck of the default plan's fwd+bwd on small shapes        -> memcheck.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-105}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_new_default.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_LAYERNORM_VARIANT
status=0
OLD=fwd_full,bwd_tree,pdl,fwd_early_pdl,bwd_l2_first2,bwd_reverse   # session 6's default plan
EXTRA=${EXTRA:-}                                                      # another plan to time beside, or none
PLANS="default;$OLD${EXTRA:+;$EXTRA}"
note "gpu_layernorm_new_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- kernels tests 2>/dev/null || echo ' (dirty)'); DEFAULT_PLAN $(grep -o 'DEFAULT_PLAN = "[^"]*"' kernels/layernorm.cu)"

step 45 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

step 45 pytest.log python3 -m pytest -q -rfEs --tb=short -n 7 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
step 45 pytest_others.log python3 -m pytest -q -rfEs --tb=short -n 6 \
    -k "not test_cpu_" tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py &
B=$!
wait $A || status=1
wait $B || status=1
note "pytest variants: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1)"
note "pytest, every other layernorm GPU test (new default): $(grep -E '(passed|failed|error)' "$L/pytest_others.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_others.log" | head -10 >> "$S"

step 45 bench.log python3 -m kernels.layernorm_bench --interleaved --plans "$PLANS" --reps 20 --rounds 9 \
    --json "$L/interleaved.json" || status=1
sed -n '/^--interleaved/,$p' "$L/bench.log" | head -90 >> "$S"

cat > "$L/memcheck_case.py" <<'PY'
import torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
print("plan:", ln.set_variant("default"))
for rows, cols, dt in ((7, 768, torch.bfloat16), (1, 64, torch.bfloat16), (4099, 384, torch.bfloat16),
                       (333, 4096, torch.bfloat16), (1001, 768, torch.float32)):
    x, r = (torch.randn(rows, cols, device="cuda").to(dt).requires_grad_() for _ in range(2))
    w, b = (torch.randn(cols, device="cuda").to(dt).requires_grad_() for _ in range(2))
    y, h = ln.add_layernorm(x, r, w, b, 1e-5)
    torch.autograd.grad((y, h), (x, r, w, b), (torch.randn_like(y), torch.randn_like(h)))
torch.cuda.synchronize()
print("memcheck case ran")
PY
if command -v compute-sanitizer > /dev/null; then
    step 25 memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$L/memcheck_case.py" || status=1
    note "memcheck: $(grep -E 'ERROR SUMMARY|memcheck case ran|^plan' "$L/memcheck.log" | tr '\n' ' ')"
fi

note "done, status $status"
pack
exit $status

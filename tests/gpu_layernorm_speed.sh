#!/bin/bash
# LayerNorm speed (session 3, engineer H4): one H200 call, logs in "$1".
# Logs under OUT/logs/, summary in OUT/summary.txt (tests/gpu_lib.sh: note, step).
#   1. build tk_layernorm (timed)                                         -> build.log
#   2. the variants' tests first (test_layernorm_variants.py, every variant vs float64) -> pytest_variants.log
#      python -m kernels.layernorm_bench: every plan variant of the kernels, forward and backward
#      alone at bench.py's bf16 shapes and the model's mixed-dtype shapes, the picked plan, then
#      bench.py's fwd+bwd row (tk vs eager, same process) for none / default / picked / picked+bwd_reverse,
#      and a per-kernel profile of that row                               -> variants.log, variants.json
#   3. bench.py --ops layernorm --quick with the picked plan (TK_LAYERNORM_VARIANT), eager and
#      torch.compile (default mode) beside                                -> bench.log, bench_layernorm.json
#   4. the other GPU tests: test_layernorm.py, test_layernorm_model.py (the CPU-only nvcc test
#      skipped)                                                           -> pytest.log
#   5. at the same time as 4 (no timing left by then): compute-sanitizer memcheck + racecheck of
#      "none" and of every flag at once, on small shapes                  -> sanitizer.log
# Usage: bash tests/gpu_layernorm_speed.sh OUT_DIR. Expected ~3 min (build ~45 s cold, variants
# ~30 s, bench.py ~60 s with its two compiles, tests ~60 s beside the sanitizer); each step has
# its own time limit and the whole script LANE_LIMIT (gpu_lib.sh, default 480 s).
# FINAL=1 (a short call, ~60 s, extension prebuilt): the GPU tests of the plan flags, the default
# plan, the empty-rows fix and the model widths, and `layernorm_bench --final` (backward alone
# and bench.py's fwd+bwd row: none / default, eager beside): pytest_final.log, final.log.
# Exit status: non-zero if any step failed (each still runs).
: "${1:?usage: bash tests/gpu_layernorm_speed.sh OUT_DIR}"
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
source tests/gpu_lib.sh "$OUT"   # OUT/logs (L), OUT/summary.txt (S), note, step
status=0
run() {   # run SECONDS LOG CMD...: gpu_lib's step, its status noted in the summary
    step "$@"
    local rc=$?
    note "rc=$rc ($2): ${*:3}"
    [ $rc -eq 0 ] || status=1
    return $rc
}

note "start, commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- kernels tests 2>/dev/null || echo ' (dirty)')"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader >> "$S" 2>&1

run 240 build.log python3 -c "from kernels import layernorm; r = layernorm._ext.why_not(); print('build:', r or 'ok'); assert r is None"

# the plan flags' tests, and the default plan (fwd_full,bwd_tree,pdl) at the model widths, the
# mixed call, determinism, the empty-rows fix and the model step
FINAL_TESTS="bwd_tree or default_none or pdl_launches or what_launches or unused_h_and_empty_rows"
FINAL_TESTS="$FINAL_TESTS or model_widths_many_rows or mixed_call or statistics or model_step"
if [ "${FINAL:-0}" = 1 ]; then
    run 50 pytest_final.log python3 -m pytest -q -rfEsx --tb=short -k "$FINAL_TESTS" tests/test_layernorm_variants.py \
        tests/test_layernorm.py tests/test_layernorm_model.py
    tail -2 "$L/pytest_final.log" >> "$S"
    run 40 final.log python3 -m kernels.layernorm_bench --final --reps 30 --json "$L/final.json"
    grep -A 4 "^bench.py's fwd+bwd row" "$L/final.log" >> "$S"
    note "done (FINAL), status $status"
    exit $status
fi

# every variant against float64 first (~15 s): a wrong variant shows here even if it then
# crashes the timing process
run 90 pytest_variants.log python3 -m pytest -q -rfEsx --tb=short -k "not test_cpu_" tests/test_layernorm_variants.py
tail -2 "$L/pytest_variants.log" >> "$S"

run 120 variants.log python3 -m kernels.layernorm_bench --json "$L/variants.json"
BEST=$(sed -n 's/^BEST=//p' "$L/variants.log" | tail -1)
note "picked plan: '${BEST:-default}'"
grep -A 12 "^bench.py's fwd+bwd row" "$L/variants.log" | head -4 >> "$S"

export TK_LAYERNORM_VARIANT="$BEST"   # read by the extension at its first launch
run 150 bench.log python3 bench.py --ops layernorm --quick --compile-modes default --json "$L/bench_layernorm.json"
unset TK_LAYERNORM_VARIANT
grep -A 8 "^CUDA-graph replay" "$L/bench.log" >> "$S"

run 180 pytest.log python3 -m pytest -q -rfEsx --tb=short -k "not test_cpu_" tests/test_layernorm.py \
    tests/test_layernorm_model.py &
PYTEST=$!

SAN_PY='
import torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
ext = ln._ext.module
F, B = torch.float32, torch.bfloat16
for spec in ["none", "fwd_full,bwd_reverse,bwd_tree,pdl"]:
    ln.set_variant(spec)
    for rows, cols, th, tr, ty in [(37, 768, B, B, B), (37, 768, F, B, B), (9, 4096, F, F, F), (5, 1600, B, B, B)]:
        x, r = torch.randn(rows, cols, device="cuda").to(th), torch.randn(rows, cols, device="cuda").to(tr)
        w, b = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
        y, h, m, s = ext.forward(x, r, w, b, 1e-5, y_bf16=(ty == B and th == F))
        ext.backward(y, h, h, m, s, w, residual_grad_bf16=(tr != th))
torch.cuda.synchronize()
print("sanitizer workload done")
'
if command -v compute-sanitizer > /dev/null; then
    for tool in memcheck racecheck; do
        run 60 sanitizer.log compute-sanitizer --tool $tool --error-exitcode 3 python3 -c "$SAN_PY"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$L/sanitizer.log" | tail -1 >> "$S"
    done
else
    note "compute-sanitizer not found: skipped"
fi
wait $PYTEST || status=1
tail -3 "$L/pytest.log" >> "$S"

note "done, status $status"
exit $status

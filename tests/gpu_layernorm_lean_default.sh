#!/bin/bash
# tests/gpu_layernorm_lean_default.sh OUT — engineer L, session 8, call 3 (the last helper call): verifies
# the default proposed after call 2 (kernels/NOTES.md, "Session 8: L"): $CANDIDATE (default
# default,fwd_lean,bwd_lean) on ONE H200 within 110 s (LANE_LIMIT, default 103 s, bounds every step so
# that `pack` always runs). A default changes only if its tests pass here AND it is faster than the
# old default in this run's interleaved bench at 16384, 32768 and 65536 x 768.
#   1. load tk_layernorm (prebuilt from this tree; rebuilt here only if not)          -> build.log
#   2. at the same time (correctness only, no timing):
#      a. compute-sanitizer memcheck of fwd+bwd under $CANDIDATE (one-warp rows and wider, tails,
#         fp32/bf16 parameters, no residual / no bias, dropout)                       -> memcheck.log
#      b. test_layernorm_variants.py (every flag vs float64, lean == plain bitwise, instances, pdl
#         inside a CUDA graph)                                                        -> pytest.log
#      c. every other layernorm GPU test with TK_LAYERNORM_VARIANT=$CANDIDATE    -> pytest_candidate.log
#   3. python -m kernels.layernorm_bench --interleaved --plans "default;$CANDIDATE": fwd, fwd+bwd at
#      16384, 32768, 65536 x 768 bf16 with eager and torch.compile, 9 interleaved rounds of 20
#      CUDA-graph replays; then the kernels alone                                      -> bench.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-103}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_lean_default.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_LAYERNORM_VARIANT
status=0
export CANDIDATE=${CANDIDATE:-default,fwd_lean,bwd_lean}
note "gpu_layernorm_lean_default.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1); candidate $CANDIDATE; $(git log -1 --format=%h 2>/dev/null)"

step 60 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

cat > "$L/memcheck_case.py" <<'PY'
import os
import torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
B, F = torch.bfloat16, torch.float32
seed = torch.tensor([7], dtype=torch.int64, device="cuda")
ln.set_variant(os.environ["CANDIDATE"])
for rows, cols, xd, rd, pd in ((7, 768, B, B, B), (1, 64, B, B, F), (4099, 384, B, B, B), (333, 1024, B, B, B),
                               (1001, 384, F, B, F), (5, 320, F, F, F), (9, 512, F, F, B), (3, 768, F, B, F),
                               (65, 4096, B, B, B)):
    for residual, bias in ((True, True), (False, True), (True, False)):
        x = torch.randn(rows, cols, device="cuda").to(xd)
        r = torch.randn(rows, cols, device="cuda").to(rd) if residual else None
        w = torch.randn(cols, device="cuda").to(pd)
        b = torch.randn(cols, device="cuda").to(pd) if bias else None
        y, h, mean, rstd = ln._ext.module.forward(x, r, w, b, 1e-5)
        dh = torch.randn_like(x) if residual else None
        ln._ext.module.backward(torch.randn_like(y), dh, h if residual else x, mean, rstd, w, residual and rd != xd)
    if xd == rd:
        y, h, mean, rstd = ln._ext.module.forward(x, torch.randn_like(x), w, b, 1e-5, dropout_seed=seed, dropout_p=0.1)
        ln._ext.module.backward(torch.randn_like(y), torch.randn_like(x), h, mean, rstd, w, dropout_seed=seed, dropout_p=0.1)
torch.cuda.synchronize()
print("memcheck case ran")
PY
M=
if command -v compute-sanitizer > /dev/null; then
    step 40 memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$L/memcheck_case.py" &
    M=$!
else
    note "compute-sanitizer not found: skipped"
fi
step 48 pytest.log python3 -m pytest -q -rfEs --tb=short -n 5 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
TK_LAYERNORM_VARIANT=$CANDIDATE step 48 pytest_candidate.log python3 -m pytest -q -rfEs --tb=short -n 5 \
    -k "not test_cpu_" tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py &
B=$!
if [ -n "$M" ]; then
    wait $M || status=1
    note "memcheck: $(grep -E 'ERROR SUMMARY|memcheck case ran' "$L/memcheck.log" | tr '\n' ' ')"
fi
wait $A || status=1
wait $B || status=1
note "pytest variants: $(grep -E '(passed|failed|error|skipped)' "$L/pytest.log" | tail -1)"
note "pytest, every other layernorm test with $CANDIDATE: $(grep -E '(passed|failed|error|skipped)' "$L/pytest_candidate.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_candidate.log" | head -12 >> "$S"

step 45 bench.log python3 -m kernels.layernorm_bench --interleaved --plans "default;$CANDIDATE" --reps 20 --rounds 9 \
    --json "$L/interleaved.json" || status=1
sed -n '/^--interleaved/,$p' "$L/bench.log" | head -50 >> "$S"

note "done, status $status"
pack
exit $status

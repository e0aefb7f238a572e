#!/bin/bash
# tests/gpu_layernorm_wide.sh OUT — engineer L, session 9 (issue 7: GPT-2 training >= 1.10x torch.compile;
# every layernorm of the GPT-2 step is fp32 h at 768 columns under autocast, rows of TWO warps, where the
# default plan still runs forward_kernel / backward_kernel: 74.3 + 107.5 us a call, 24 calls a step).
# On ONE H200 within 200 s (LANE_LIMIT, default 190 s, bounds every step so that `pack` always runs).
# Ran in session 9's call 2 with two candidates (logs /work/gpu_logs/s9call2/gpu_layernorm_wide/):
# bwd_wide (backward_lean_kernel<..., G = 2>: the lean backward for rows of two warps) won and is in
# the default plan since; fwd_wide (a one-warp lean forward) lost and was removed (review, session 9),
# so this script now checks and times bwd_wide alone: the default against session 8's plan (LEAN_ON).
#   1. load tk_layernorm (prebuilt from this tree; rebuilt here only if not)          -> build.log
#   2. at the same time (correctness only, no timing):
#      a. compute-sanitizer memcheck of fwd+bwd under the bwd_wide plans (fp32 h 576..768, bf16 h 1280,
#         tails, rows 1 and 7, no residual / no bias, bf16 parameters, dropout falling back), then
#         racecheck of the backward's two-warp sums (shared scratch, one named barrier a row)
#                                                                   -> memcheck.log, racecheck.log
#      b. test_layernorm_variants.py: every flag (bwd_wide on session 8's plan and alone) vs
#         float64 on every dtype combination; bwd_wide vs float64 at every width it takes and vs
#         the plain backward; which instances launch; pdl inside a CUDA graph       -> pytest.log
#      c. every other layernorm GPU test with TK_LAYERNORM_VARIANT=$CANDIDATE, named explicitly
#         (test_layernorm.py, dropout, the model)                             -> pytest_candidate.log
#   3. python -m kernels.layernorm_bench --interleaved --mixed: the GPT-2 step's op (fp32 residual
#      stream, bf16 branch and y, fp32 parameters, under autocast), fwd and fwd+bwd at 16384, 32768,
#      65536 x 768: eager, torch.compile, session 8's plan, the default (its + bwd_wide), 7 interleaved
#      rounds of 20 CUDA-graph replays; then the kernels alone at 32768x768              -> bench.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-190}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_wide.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_LAYERNORM_VARIANT
status=0
CANDIDATE=default                                       # bwd_wide is in it
SESSION8=fwd_full,bwd_tree,pdl,fwd_early_pdl,bwd_l2_first2,bwd_reverse,fwd_lean,bwd_lean   # without bwd_wide
note "gpu_layernorm_wide.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1); candidate $CANDIDATE; $(git log -1 --format=%h 2>/dev/null)"

# 1. build (a cached load when the prebuild had this tree)
step 60 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

# 2. sanitizers and the tests at the same time (correctness only; timing comes after all of them)
cat > "$L/sanitize_case.py" <<'PY'
import sys
import torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
B, F = torch.bfloat16, torch.float32
seed = torch.tensor([7], dtype=torch.int64, device="cuda")
quick = len(sys.argv) > 1 and sys.argv[1] == "quick"   # racecheck: one plan, two shapes
plans = ("default",) if quick else ("default", "bwd_wide")
shapes = (((1001, 768, F, B, F), (9, 1280, B, B, B)) if quick else
          ((7, 768, F, B, F), (1, 576, F, F, F), (4099, 640, F, B, B), (333, 704, F, F, B), (16387, 768, F, B, F),
           (1001, 1280, B, B, B), (5, 1088, B, B, B), (3, 832, F, B, F)))
for plan in plans:
    ln.set_variant(plan)
    for rows, cols, xd, rd, pd in shapes:
        for residual, bias in ((True, True), (False, True), (True, False)):
            x = torch.randn(rows, cols, device="cuda").to(xd)
            r = torch.randn(rows, cols, device="cuda").to(rd) if residual else None
            w = torch.randn(cols, device="cuda").to(pd)
            b = torch.randn(cols, device="cuda").to(pd) if bias else None
            y_bf16 = xd == F and rd == B
            y, h, mean, rstd = ln._ext.module.forward(x, r, w, b, 1e-5, y_bf16)
            dh = torch.randn_like(x) if residual else None
            ln._ext.module.backward(torch.randn_like(y), dh, h if residual else x, mean, rstd, w, residual and rd != xd)
            if quick:
                break
        if xd == rd and not quick:   # dropout: the plain kernels under bwd_wide
            y, h, mean, rstd = ln._ext.module.forward(x, torch.randn_like(x), w, b, 1e-5, dropout_seed=seed, dropout_p=0.1)
            ln._ext.module.backward(torch.randn_like(y), torch.randn_like(x), h, mean, rstd, w, dropout_seed=seed, dropout_p=0.1)
torch.cuda.synchronize()
print("sanitize case ran")
PY
if command -v compute-sanitizer > /dev/null; then
    ( step 50 memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 python3 "$L/sanitize_case.py" || exit 1
      step 40 racecheck.log compute-sanitizer --tool racecheck --error-exitcode 1 python3 "$L/sanitize_case.py" quick ) &
    M=$!
else
    note "compute-sanitizer not found: skipped"
    M=
fi
step 95 pytest.log python3 -m pytest -q -rfEs --tb=short -n 8 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
TK_LAYERNORM_VARIANT=$CANDIDATE step 90 pytest_candidate.log python3 -m pytest -q -rfEs --tb=short -n 6 \
    -k "not test_cpu_" tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py &
B=$!
[ -n "$M" ] && { wait $M || status=1; note "sanitizers: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize case ran' "$L/memcheck.log" "$L/racecheck.log" 2>/dev/null | tr '\n' ' ')"; }
wait $A || status=1
wait $B || status=1
note "pytest variants: $(grep -E '(passed|failed|error|skipped)' "$L/pytest.log" | tail -1)"
note "pytest, every other layernorm test with $CANDIDATE: $(grep -E '(passed|failed|error|skipped)' "$L/pytest_candidate.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_candidate.log" | head -12 >> "$S"

# 3. timing: eager, torch.compile and the tk plans in one process, interleaved rounds, GPT-2's dtypes
step 80 bench.log python3 -m kernels.layernorm_bench --interleaved --mixed \
    --plans "$CANDIDATE;$SESSION8" --reps 20 --rounds 7 --json "$L/interleaved.json" || status=1
sed -n '/^--interleaved/,$p' "$L/bench.log" | grep -vE "^ *$" | head -60 >> "$S"

note "done, status $status"
pack
exit $status

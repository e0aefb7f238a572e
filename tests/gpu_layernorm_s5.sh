#!/bin/bash
# tests/gpu_layernorm_s5.sh OUT — session 5, engineer L (issue 4: residual + LayerNorm fwd+bwd
# >= 3x torch eager at 16384x768), on ONE H200 within 150 s (LANE_LIMIT, default 145 s, bounds every
# step so that `pack` always runs):
#   1. build tk_layernorm (python -m kernels --build; ~30 s cold)                      -> build.log
#   2. the layernorm GPU tests: test_layernorm_variants.py (every plan flag vs float64, the
#      kernel-name test mended this session, bwd_async bitwise equal to the plain backward), and
#      test_layernorm.py's model widths at 16384 rows and the mixed call (8 workers)  -> pytest.log
#   3. python -m kernels.layernorm_bench --s5: fwd, bwd, fwd+bwd at 16384x768 and 32768x768 bf16,
#      the default plan alone and with the opt-in flags bwd_async, colsum_ahead, fwd_async, PyTorch eager
#      and torch.compile in the same process;
#      then the kernels alone at the bench and GPT-2 shapes                            -> bench.log
#   4. ncu (real clocks) of the layernorm kernels: bf16 16384x768 and GPT-2's mixed 32768x768,
#      forward, backward and column sum: the default plan, then with fwd_async,bwd_async,colsum_ahead
#                                                                                      -> ncu.log
#   5. if >= 25 s are left: compute-sanitizer racecheck of the async backward         -> racecheck.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-145}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_s5.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
note "gpu_layernorm_s5.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- kernels tests 2>/dev/null || echo ' (dirty)')"

# 1. build
step 60 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

# 2. tests (correctness first; no timing here)
step 35 pytest.log python3 -m pytest -v -rfEs --tb=short -n 8 -k "not test_cpu_" tests/test_layernorm_variants.py \
    "tests/test_layernorm.py::test_model_widths_many_rows" "tests/test_layernorm.py::test_mixed_call_launches_only_layernorm_kernels" \
    "tests/test_layernorm.py::test_unused_h_and_empty_rows" "tests/test_layernorm.py::test_statistics_and_determinism" \
    || status=1
note "pytest: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1) ($(grep -c PASSED "$L/pytest.log") PASSED lines)"
grep -E "PASSED.*what_launches|FAILED.*what_launches" "$L/pytest.log" | head -1 >> "$S"
grep -E "^FAILED|^ERROR" "$L/pytest.log" | head -8 >> "$S"

# 3. timing: tk plans, eager and torch.compile in one process
step 65 bench.log python3 -m kernels.layernorm_bench --s5 --reps 20 --warmup 5 --json "$L/s5.json" || status=1
sed -n '/^--s5/,$p' "$L/bench.log" | head -40 >> "$S"

# 4. ncu: where the backward's time goes (function base names; template arguments are not matched)
cat > "$L/ncu_probe.py" <<'PY'
import sys, torch
from kernels import layernorm as ln
assert ln._ext.why_not() is None
ext = ln._ext.module
F, B = torch.float32, torch.bfloat16
g = torch.Generator(device="cuda").manual_seed(0)
rnd = lambda *s, dt: torch.randn(*s, generator=g, device="cuda").to(dt)
# (rows, h dtype, branch dtype, y dtype, parameter dtype): bench.py's bf16 and GPT-2 under autocast
for rows, th, tr, ty, tp in ((16384, B, B, B, B), (32768, F, B, B, F)):
    x, r, dy, dh = rnd(rows, 768, dt=th), rnd(rows, 768, dt=tr), rnd(rows, 768, dt=ty), rnd(rows, 768, dt=th)
    w, b = rnd(768, dt=tp), rnd(768, dt=tp)
    mixed, y_bf16 = tr != th, ty == B and th == F
    for plan in ("default", "default,fwd_async,bwd_async,colsum_ahead"):
        ln.set_variant(plan)
        y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5, y_bf16=y_bf16)
        ext.backward(dy, dh, h, mean, rstd, w, residual_grad_bf16=mixed)
        torch.cuda.synchronize()
        print("profiled", rows, th, plan, flush=True)
PY
if command -v ncu > /dev/null; then
    step 35 ncu.log ncu --clock-control none -f -o "$L/ln" \
        -k "regex:forward_kernel|backward_kernel|backward_async_kernel|column_sum_kernel" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats python3 "$L/ncu_probe.py" || status=1
    ncu --import "$L/ln.ncu-rep" --page details > "$L/ncu_details.txt" 2>&1
    ncu --import "$L/ln.ncu-rep" --page details --print-details all > "$L/ncu_details_all.txt" 2>&1   # stall reasons
    grep -E "^  .*(forward_kernel|backward_kernel|backward_async_kernel|column_sum_kernel)|^    (Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Warp Cycles Per Issued)" \
        "$L/ncu_details.txt" | sed -E 's/\(anonymous namespace\):://; s/\((__nv_bfloat16|float) const.*\) \(/ (/' > "$L/ncu_summary.txt"
    cat "$L/ncu_summary.txt" >> "$S"
else
    note "ncu not found: skipped"
fi

# 5. racecheck of the async backward (its stages become the block sum's shared memory)
cat > "$L/race_probe.py" <<'PY'
import torch
from kernels import layernorm as ln
ext = ln._ext.module
F, B = torch.float32, torch.bfloat16
for plan in ("bwd_async,fwd_async", "bwd_tree,bwd_async,colsum_ahead"):
    ln.set_variant(plan)
    for rows, cols, th, tr, ty in ((37, 768, B, B, B), (37, 768, F, B, B), (9, 4096, F, F, F), (5, 1600, B, B, B)):
        x, r = torch.randn(rows, cols, device="cuda").to(th), torch.randn(rows, cols, device="cuda").to(tr)
        w, b = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
        y, h, m, s = ext.forward(x, r, w, b, 1e-5, y_bf16=(ty == B and th == F))
        ext.backward(y, h, h, m, s, w, residual_grad_bf16=(tr != th))
torch.cuda.synchronize()
print("racecheck workload done")
PY
if command -v compute-sanitizer > /dev/null && [ $(( LIMIT - ($(date +%s) - START) )) -ge 25 ]; then
    step 25 racecheck.log compute-sanitizer --tool racecheck --error-exitcode 3 python3 "$L/race_probe.py" || status=1
    note "racecheck: $(grep -E 'RACECHECK SUMMARY|workload done' "$L/racecheck.log" | tr '\n' ' ')"
else
    note "racecheck skipped (no time or no compute-sanitizer)"
fi

note "done, status $status"
pack
exit $status

#!/bin/bash
# tests/gpu_layernorm_s5.sh OUT — session 5, engineer L (issue 4: residual + LayerNorm fwd+bwd
# >= 3x torch eager at 16384x768), on ONE H200 within 150 s (LANE_LIMIT, default 145 s, bounds every
# step so that `pack` always runs). Call 2 ran an earlier version (cp.async flags, since removed);
# this one measures the opt-in flag bwd_smem (backward_smem_kernel: dw, db sums in shared memory,
# three blocks an SM):
#   1. build tk_layernorm (python -m kernels --build; ~10-20 s)                        -> build.log
#   2. at the same time, on the same GPU (correctness only, no timing):
#      a. test_layernorm_variants.py: every plan flag vs float64, the kernel-name test, bwd_smem
#         bitwise equal to the bwd_tree plan (incl. dropout, in a CUDA graph with pdl) -> pytest.log
#      b. every other layernorm GPU test (test_layernorm.py, test_layernorm_dropout.py,
#         test_layernorm_model.py) with TK_LAYERNORM_VARIANT=default,bwd_smem: the flag as if it
#         were the default                                                          -> pytest_smem.log
#   3. python -m kernels.layernorm_bench --s5: fwd, fwd+bwd (and bwd = the difference) at
#      16384x768 and 32768x768 bf16, the default plan and default,bwd_smem, PyTorch eager and
#      torch.compile in the same process; then the kernels alone at the bench, GPT-2 and
#      shakespeare shapes                                                            -> bench.log
#   4. ncu (real clocks) of the backward kernels, default and bwd_smem, bf16 16384x768 and GPT-2's
#      mixed 32768x768 (stall reasons: ncu_details_all.txt)                            -> ncu.log
#   5. compute-sanitizer memcheck and racecheck of bwd_smem on small shapes           -> sanitizer.log
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

# 2. tests, two pytest runs at once (correctness only; timing comes after both)
step 45 pytest.log python3 -m pytest -v -rfEs --tb=short -n 6 -k "not test_cpu_" tests/test_layernorm_variants.py &
A=$!
TK_LAYERNORM_VARIANT=default,bwd_smem step 45 pytest_smem.log python3 -m pytest -q -rfEs --tb=short -n 6 \
    -k "not test_cpu_" tests/test_layernorm.py tests/test_layernorm_dropout.py tests/test_layernorm_model.py &
B=$!
wait $A || status=1
wait $B || status=1
note "pytest variants: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1) ($(grep -c PASSED "$L/pytest.log") PASSED lines)"
grep -E "PASSED.*what_launches|FAILED.*what_launches" "$L/pytest.log" | head -1 >> "$S"
note "pytest, every other layernorm test with default,bwd_smem: $(grep -E '(passed|failed|error)' "$L/pytest_smem.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest.log" "$L/pytest_smem.log" | head -10 >> "$S"

# 3. timing: tk plans, eager and torch.compile in one process
step 50 bench.log python3 -m kernels.layernorm_bench --s5 --reps 30 --json "$L/s5.json" || status=1
sed -n '/^--s5/,$p' "$L/bench.log" | head -40 >> "$S"

# 4. ncu of the backward kernels (function base names: template arguments are not matched)
cat > "$L/ncu_probe.py" <<'PY'
import torch
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
    y, h, mean, rstd = ext.forward(x, r, w, b, 1e-5, y_bf16=y_bf16)
    for plan in ("default", "default,bwd_smem"):
        ln.set_variant(plan)
        ext.backward(dy, dh, h, mean, rstd, w, residual_grad_bf16=mixed)
        torch.cuda.synchronize()
        print("profiled", rows, th, plan, flush=True)
PY
if command -v ncu > /dev/null; then
    step 35 ncu.log ncu --clock-control none -f -o "$L/ln" -k "regex:backward_kernel|backward_smem_kernel" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats python3 "$L/ncu_probe.py" || status=1
    ncu --import "$L/ln.ncu-rep" --page details > "$L/ncu_details.txt" 2>&1
    ncu --import "$L/ln.ncu-rep" --page details --print-details all > "$L/ncu_details_all.txt" 2>&1   # stall reasons
    grep -E "^  .*(backward_kernel|backward_smem_kernel)|^    (Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Warp Cycles Per Issued|L1/TEX Hit|Shared Memory Configuration)" \
        "$L/ncu_details.txt" | sed -E 's/\(anonymous namespace\):://; s/\((__nv_bfloat16|float|const) .*\) \(/ (/' > "$L/ncu_summary.txt"
    cat "$L/ncu_summary.txt" >> "$S"
else
    note "ncu not found: skipped"
fi

# 5. sanitizers of bwd_smem (its shared-memory sums and the block sum read across groups)
cat > "$L/san_probe.py" <<'PY'
import torch
from kernels import layernorm as ln
ext = ln._ext.module
F, B = torch.float32, torch.bfloat16
for plan in ("bwd_smem", "pdl,bwd_smem,bwd_reverse"):
    ln.set_variant(plan)
    for rows, cols, th, tr, ty in ((37, 768, B, B, B), (37, 768, F, B, B), (9, 4096, F, F, F), (5, 1600, B, B, B)):
        x, r = torch.randn(rows, cols, device="cuda").to(th), torch.randn(rows, cols, device="cuda").to(tr)
        w, b = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
        y, h, m, s = ext.forward(x, r, w, b, 1e-5, y_bf16=(ty == B and th == F))
        ext.backward(y, h, h, m, s, w, residual_grad_bf16=(tr != th))
torch.cuda.synchronize()
print("sanitizer workload done")
PY
if command -v compute-sanitizer > /dev/null; then
    for tool in memcheck racecheck; do
        if [ $(( LIMIT - ($(date +%s) - START) )) -ge 20 ]; then
            step 20 sanitizer.log compute-sanitizer --tool $tool --error-exitcode 3 python3 "$L/san_probe.py" || status=1
            note "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/sanitizer.log" | tail -1)"
        else
            note "$tool skipped (no time left)"
        fi
    done
fi

note "done, status $status"
pack
exit $status

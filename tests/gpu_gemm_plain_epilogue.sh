#!/bin/bash
# tests/gpu_gemm_plain_epilogue.sh OUT — engineer G, session 6 (issue 3: the GEMM at GPT-2's K = 768
# shapes vs cuBLAS). Question: is the per-tile cost that cuBLAS does not pay our epilogue's
# instruction stream (run-time bias/GELU branches around every value, ~1000 instructions per warp
# per tile, ~84 KB of SASS per tile)? The candidates: variants 6 and 7 of steps 4 and 5, the
# pipelines of 4v0 / 4v5 (2-CTA clusters) and 5v1 (64x256) / 5v0 (128x128) with a compile-time
# plain epilogue (kernels/gemm_plain_epilogue.cuh: stmatrix staging, ~50 instructions per box);
# 4v8 = 4v6 with a tile's stores deferred into the next tile's first k-steps.
# ONE H200, within 150 s including the build (LANE_LIMIT, default 145 s):
#   1. build tk_gemm (python -m kernels --build tk_gemm; gemm_4 and gemm_5 changed)
#   2. tests: variants 6-8 against fp32 references (tails, every layout, split-K, bf16/fp32
#      outputs, poisoned outputs, bit-identical to the twin variant), their refusals,
#      kernel_only; the CPU plan tests
#   3. kernels/gemm_bench.py: 8192^3 and GPT-2's fwd and dW shapes, torch.matmul vs auto (the
#      default: 5v1 at K <= 1024, else step 4), step 4, 4v6, 4v7, 4v8, 5v6, 5v7; 5 interleaved
#      trials, modes eager, graph, kernel
#   4. ncu at 16384x768x3072 of cuBLAS, 4v0, 4v6, 4v7, 4v8, 5v1, 5v6, 5v7: duration, instructions,
#      tensor pipe, warp states (every stall reason) and source counters; the per-SASS-line page as CSV
# Results: OUT/summary.txt (compact), OUT/gemm_bench.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-145}
source tests/gpu_lib.sh "${1:-/tmp/gemm_plain_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_plain_epilogue.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. build
step 80 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. tests of the new variant (and the paths it shares: kernel_only, the plan checks)
step 25 pytest_gemm.log python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_gemm_plan.py tests/test_gemm.py \
    -k "plain or kernel_only"
note "pytest (plain epilogue, kernel_only, plan): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-200 >> "$S"

# 3. the bench (the default auto, step 4 and the four plain variants, interleaved with torch.matmul)
step 50 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,4 --variants4 6,7,8 --variants5 6,7 \
    --modes eager,graph,kernel --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0,4 --variants4 6,7,8 --variants5 6,7 --modes eager,graph,kernel"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"

# 4. ncu: where each kernel's time goes at the K = 768 shape
cat > "$L/plain_case.py" <<'EOF'
# 16384x768x3072 (y = x·Wᵀ) by cuBLAS, then step 4 v0 / v6 / v7 / v8 and step 5 v1 / v6 / v7 (kernels/gemm.py)
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
M, K, N = 16384, 768, 3072
x = torch.randn(M, K, device="cuda").bfloat16()
w = (torch.randn(N, K, device="cuda") * K ** -0.5).bfloat16()
ref = x @ w.t()
for step, variant in ((4, 0), (4, 6), (4, 7), (4, 8), (5, 1), (5, 6), (5, 7)):
    y = gemm.matmul(x, w.t(), step=step, variant=variant)
    print(f"step {step} v{variant}: equal to cuBLAS: {torch.equal(y, ref)}, "
          f"rel err {((y.float() - ref.float()).norm() / ref.float().norm()).item():.2e}")
torch.cuda.synchronize()
EOF
NCU_METRICS="smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.max"
step 40 ncu.log ncu --section SpeedOfLight --section WarpStateStats --section SourceCounters --metrics "$NCU_METRICS" \
    --print-details all -k "regex:nvjet|gemm_ws|gemm_pingpong" -o "$L/ncu_plain" python3 "$L/plain_case.py" \
    && step 20 ncu.log ncu -i "$L/ncu_plain.ncu-rep" --section SpeedOfLight --section WarpStateStats \
       --section SourceCounters --metrics "$NCU_METRICS" --print-details all \
    && step 15 ncu_source.log ncu -i "$L/ncu_plain.ncu-rep" --page source --csv --print-source sass
gzip -f "$L/ncu_source.log" 2>/dev/null
# what comes back is capped (16 MiB a file): the report itself cannot be read without ncu anyway
rm -f "$L/ncu_plain.ncu-rep"
[ -f "$L/ncu_source.log.gz" ] && [ "$(stat -c %s "$L/ncu_source.log.gz")" -gt 8000000 ] && \
    { note "ncu_source.log.gz over 8 MB: dropped"; rm -f "$L/ncu_source.log.gz"; }
{ echo "--- ncu 16384x768x3072 (clocks locked by ncu)"
  grep -E "^  [a-z_A-Z]|Duration|smsp__inst_executed.sum|hmma_cycles_active|Warp Cycles Per Issued|Stall|equal to cuBLAS" \
       "$L/ncu.log" | cut -c1-160 | head -120; } >> "$S"
note "ncu: $(grep -cE 'Duration' "$L/ncu.log") kernel sections"
pack

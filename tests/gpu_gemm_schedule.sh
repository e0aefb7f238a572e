#!/bin/bash
# tests/gpu_gemm_schedule.sh OUT — engineer G, session 8, call 2 (issue 3: the weight gradients).
# Step 5 variants 10 and 11 (new, opt-in): variant 8's in-kernel split-K on a schedule planned on
# the host (kernels/gemm.py stream_schedule): each CTA runs whole 128x128 tiles plus one or two
# k-pieces of the tiles left over (more tiles than SMs), or one tile's head plus nothing / a
# share of the tails (fewer tiles than SMs), instead of `splits` equal pieces of every tile.
# 10: a piece arrives in its own epilogue; 11: one tile of its consumer later (as 8).
# ONE H200, within 115 s (LANE_LIMIT, default 112 s):
#   1. build tk_gemm (no-op when the call prebuilt it)
#   2. compute-sanitizer memcheck, then racecheck, of 5v10 and 5v11 (tests/gemm_schedule_sanitize_case.py:
#      heads + shared tails, whole tiles + pieces, tails in M/N/K, bf16 and fp32)
#   3. GPU tests: tests/test_gemm_schedule.py (both variants at tails and GPT-2's dW shapes into
#      poisoned outputs vs float64, workspace zero after every call, graphs, first call in a
#      capture, kernel_only, binding checks) and tests/test_gemm_splitk.py (5v8: its arrival now
#      counts k-tiles, not splits)
#   4. kernels/gemm_bench.py at GPT-2's four dW shapes: 'auto' (the default: 5v7 + memset +
#      conversion), 5v8, 5v10, 5v11 and torch.matmul, 5 interleaved trials, CUDA graphs and kernel alone
#   5. if time is left: ncu SpeedOfLight of 5v7 and 5v10 at dW 2304x16384x768 (DRAM bytes: does the
#      schedule keep the heads' reads shared in L2?)
# Results: OUT/summary.txt (compact), OUT/gemm_bench.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-112}
source tests/gpu_lib.sh "${1:-/tmp/gemm_schedule_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_schedule.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 60 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. sanitizers first
step 15 memcheck.log compute-sanitizer --tool memcheck python3 tests/gemm_schedule_sanitize_case.py
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
step 25 racecheck.log compute-sanitizer --tool racecheck python3 tests/gemm_schedule_sanitize_case.py quick
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"

# 3. tests
step 30 pytest_gemm.log python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_gemm_schedule.py tests/test_gemm_splitk.py
note "pytest (5v10/5v11 schedule tests, 5v8 split-K tests): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-240 >> "$S"

# 4. the candidates vs the default vs torch.matmul at the weight gradients
step 25 gemm_bench.log python3 -m kernels.gemm_bench --steps 0 --variants5 8,10,11 --shapes dW --modes graph,kernel \
    --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0 --variants5 8,10,11 --shapes dW --modes graph,kernel"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"

# 5. DRAM traffic of the schedule against equal splits (skipped when under 15 s are left)
cat > "$L/ncu_case.py" <<'PYEOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
dy, x = torch.randn(16384, 2304, device="cuda", dtype=torch.bfloat16), torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16)
for variant in (7, 10):
    gemm.matmul(dy.t(), x, step=5, variant=variant)
torch.cuda.synchronize()
print("ncu case ran")
PYEOF
step 20 ncu.log ncu --section SpeedOfLight --metrics "dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
    -k "regex:gemm_pingpong" python3 "$L/ncu_case.py"
note "ncu: $(grep -cE 'gemm_pingpong_kernel' "$L/ncu.log") kernels profiled, $(grep -E 'case ran|rc=' "$L/ncu.log" | tr '\n' ' ')"
{ echo "--- ncu (5v7, then 5v10; dW 2304x16384x768)"
  grep -E "gemm_pingpong|Duration|Throughput|dram__bytes|lts__t_bytes|hmma" "$L/ncu.log" | cut -c1-150 | head -30; } >> "$S"
pack

#!/bin/bash
# tests/gpu_gemm_schedule.sh OUT — engineer G, session 8, call 2 (issue 3: the weight gradients).
# Step 5 variant 10 (matmul(step=0)'s for most dW since call 3) and step 4 variant 9 (opt-in) run the plain product on a schedule
# planned on the host (kernels/gemm.py stream_schedule): each CTA runs whole tiles plus one or
# two k-pieces of the tiles left over (more tiles than SMs), or one tile's head / a share of the
# tails (fewer tiles than SMs), instead of `splits` equal pieces of every tile; pieces are summed
# in the kernel (step 5 variant 8's protocol, counting k-tiles). 5v10: 128x128 ping-pong, a piece
# arrives in its own epilogue; 4v9: step 4's cooperative 128x256 tile (48 KB per 4.2 MFLOP k-step
# instead of 32 KB per 2.1). (Call 2 also ran 5v11, a piece arriving one tile later: removed since.)
# ONE H200, within 115 s (LANE_LIMIT, default 112 s):
#   1. build tk_gemm (no-op when the call prebuilt it)
#   2. compute-sanitizer memcheck of 5v10, 4v9 (tests/gemm_schedule_sanitize_case.py: heads +
#      shared tails, whole tiles + pieces, tails in M/N/K, bf16 and fp32)
#   3. GPU tests: tests/test_gemm_schedule.py (both variants at tails and GPT-2's dW shapes into
#      poisoned outputs vs float64, workspace zero after every call, graphs, first call in a
#      capture, kernel_only, binding checks) and tests/test_gemm_splitk.py (5v8: its arrival now
#      counts k-tiles, not splits)
#   4. kernels/gemm_bench.py at GPT-2's four dW shapes: 'auto' (the default; in call 2 5v7 + memset +
#      conversion), 4v9, 5v10 and torch.matmul, 5 interleaved trials, CUDA graphs and kernel alone
#   5. racecheck of 5v10 and 4v9 (quick case)
#   6. if time is left: ncu SpeedOfLight of 5v7, 5v10, 4v9 at dW 2304x16384x768 (DRAM bytes: do the
#      heads share their reads through L2?)
# Results: OUT/summary.txt (compact), OUT/gemm_bench.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-112}
source tests/gpu_lib.sh "${1:-/tmp/gemm_schedule_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_schedule.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 60 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. memcheck first
step 20 memcheck.log compute-sanitizer --tool memcheck python3 tests/gemm_schedule_sanitize_case.py
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"

# 3. tests
step 30 pytest_gemm.log python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_gemm_schedule.py tests/test_gemm_splitk.py
note "pytest (4v9/5v10 schedule tests, 5v8 split-K tests): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-240 >> "$S"

# 4. the candidates vs the default vs torch.matmul at the weight gradients
step 30 gemm_bench.log python3 -m kernels.gemm_bench --steps 0 --variants4 9 --variants5 10 --shapes dW --modes graph,kernel \
    --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0 --variants4 9 --variants5 10 --shapes dW --modes graph,kernel"
  grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"

# 5. racecheck (the small shapes)
step 25 racecheck.log compute-sanitizer --tool racecheck python3 tests/gemm_schedule_sanitize_case.py quick
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"

# 6. DRAM traffic of the schedules against equal splits (skipped when under 15 s are left)
cat > "$L/ncu_case.py" <<'PYEOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
dy, x = torch.randn(16384, 2304, device="cuda", dtype=torch.bfloat16), torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16)
for step, variant in ((5, 7), (5, 10), (4, 9)):
    gemm.matmul(dy.t(), x, step=step, variant=variant)
torch.cuda.synchronize()
print("ncu case ran")
PYEOF
step 30 ncu.log ncu --section SpeedOfLight --metrics "dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
    -k "regex:gemm_pingpong|gemm_ws" python3 "$L/ncu_case.py"
note "ncu: $(grep -cE 'gemm_pingpong_kernel|gemm_ws_kernel' "$L/ncu.log") kernels profiled, $(grep -E 'case ran|rc=' "$L/ncu.log" | tr '\n' ' ')"
{ echo "--- ncu (5v7, 5v10, 4v9; dW 2304x16384x768)"
  grep -E "gemm_pingpong|gemm_ws|Duration|Throughput|dram__bytes|lts__t_bytes|hmma" "$L/ncu.log" | cut -c1-150 | head -45; } >> "$S"
pack

#!/bin/bash
# tests/gpu_gemm_s5.sh OUT — session 5, engineer G (issue 3: the GEMM at the GPT-2 shapes vs cuBLAS).
# Question: how much of tk's gap to torch.matmul at the GPT-2 shapes is host-side launch cost and
# how much is the kernel? ONE H200, within 120 s including the build (LANE_LIMIT, default 115 s):
#   1. build tk_gemm (python -m kernels --build tk_gemm; ~50 s cold; its bindings changed)
#   2. the tests of what changed: the plan cache (same shape with other tensors, other strides,
#      an unaligned view; cache on/off give the same results), gemm.kernel_only, matmul replayed
#      from a CUDA graph with new inputs (tests/test_gemm.py -k ...), the CPU
#      tests of the cache (tests/test_gemm_plan.py), and steps 1-3 at small shapes (their layout path)
#   3. kernels/gemm_bench.py at 8192^3 and the GPT-2 shapes (forward and weight gradient), auto
#      (the last step, as gemm.matmul(step=0) runs it) and step 4 vs torch.matmul, 5 interleaved
#      trials, three timing modes in one run: eager (launched from Python), graph (both sides
#      captured in CUDA graphs: kernels alone), kernel (tk's GEMM kernel alone, without split-K's
#      memset and conversion); then host microseconds per call and per part of tk's path.
# Results: OUT/summary.txt (compact), OUT/gemm_bench.json, OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/gemm_s5_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_s5.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. build
step 75 build.log python3 -m kernels --build tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. tests of the changed paths
step 20 pytest_gemm.log python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_gemm_plan.py tests/test_gemm.py \
    -k "plan or kernel_only or cuda_graph or bad_inputs or strided or auto_step"
note "pytest (plan cache, kernel_only, graph): $(grep -E 'passed|failed|error' "$L/pytest_gemm.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_gemm.log" | head -10 | cut -c1-200 >> "$S"
# steps 1-3 through the refactored matmul (their own layout path: B copied as [N][K], step 2's K padding)
IDS=""; for s in 1 2 3; do for c in 77-48-272 1000-320-528; do IDS="$IDS tests/test_gemm.py::test_forward_xWt[$c-$s]"; done
    IDS="$IDS tests/test_gemm.py::test_backward_products[333-768-768-$s] tests/test_gemm.py::test_backward_products[4096-768-2304-$s]"; done
step 12 pytest_gemm_steps123.log python3 -m pytest -q --maxfail=3 --tb=short -rf $IDS
note "pytest steps 1-3, small shapes: $(grep -E 'passed|failed|error' "$L/pytest_gemm_steps123.log" | tail -1)"

# 3. the bench: eager vs graph vs kernel alone, and the host path
step 80 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,4 --modes eager,graph,kernel --host \
    --trials 5 --iters 20 --replays 3 --json "$OUT/gemm_bench.json"
{ echo "--- kernels/gemm_bench.py --steps 0,4 --modes eager,graph,kernel --host"; grep -vE "^===|UserWarning|_warn_once" "$L/gemm_bench.log"; } >> "$S"
note "bench done (rc in gemm_bench.log: $(grep -E '^rc=' "$L/gemm_bench.log" | tail -1))"
pack

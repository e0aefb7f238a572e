#!/bin/bash
# tests/gpu_mlp_s5.sh OUT — session 5, engineer M (issue 6: the MLP at 1.10x eager and torch.compile),
# call 3: the new defaults (finish=1, gprime=1, dGELU on ping-pong 64x256, dW on schedule 10) against
# sessions 3-4's default and the other session 5 options. (Call 2 ran this script's first version:
# git log -- tests/gpu_mlp_s5.sh.) ONE H200, within 150 s including the build (LANE_LIMIT 145 s):
#   1. build tk_mlp (python -m kernels --build tk_mlp)
#   2. tests/test_mlp.py, all of it but the torch.compile test: the new default path (float64,
#      model loss and gradients, autocast, opcheck, inference bit-identity, bad inputs) and every
#      schedule and flag, sessions 3-4's default among them (BASE / OLD specs)
#   3. issue 6's table in ONE run: kernels/mlp_bench.py --graphs --compile, M = 16384 and 65536,
#      C = 768: tk specs (CUDA-graph replays, interleaved trials) vs torch eager vs torch.compile
#   4. tests/test_mlp.py's torch.compile test (the custom ops under torch.compile, new defaults)
#   5. every kernel's time (torch.profiler) at M = 16384 for the main specs
#   6. if time is left: the plain GEMMs of the c_fc and dGELU shapes (swapped sizes C = 3072, H = 768)
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-145}
source tests/gpu_lib.sh "${1:-/tmp/mlp_s5_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_mlp_s5.sh (call 3) on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. build
step 60 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. correctness: the whole MLP test file but the torch.compile test
step 55 pytest_mlp.log python3 -m pytest -q --maxfail=10 --tb=short -rf tests/test_mlp.py -k "not torch_compile_module"
note "pytest test_mlp.py (all but torch.compile): $(grep -E 'passed|failed|error' "$L/pytest_mlp.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/pytest_mlp.log" | head -20 | cut -c1-200 >> "$S"

# 3. issue 6's table: tk specs vs eager vs torch.compile, CUDA graphs, one run
#    0: the new default (gprime=1, finish=1, dGELU ping-pong 64x256 multiplying by the saved GELU', dW on 10)
#    dgelu=4,dw=4,finish=0,gprime=0: sessions 3-4's default; the rest: one change at a time
SPECS="0;dgelu=4,dw=4,finish=0,gprime=0;dgelu=4,gprime=0;dgelu=4,gprime=0,fast=1;dgelu=4;pre=1;dgelu=6,pre=1,fast=1,gprime=0;dgelu=5"
step 55 mlp_bench_graphs.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 5 --iters 10 --schedules "$SPECS"
{ echo "--- mlp_bench --graphs --compile"; grep -vE "^===|^rc=|UserWarning|_warn_once" "$L/mlp_bench_graphs.log"; } | tee -a "$S"

# 4. the custom ops under torch.compile with the new defaults
step 35 pytest_mlp_compile.log python3 -m pytest -q --tb=short -rf tests/test_mlp.py -k "torch_compile_module"
note "pytest test_mlp.py torch.compile test: $(grep -E 'passed|failed|error' "$L/pytest_mlp_compile.log" | tail -1)"

# 5. per kernel at M = 16384
step 15 mlp_kernels.log python3 -m kernels.mlp_bench --kernels --M 16384 --trials 1 --iters 5 \
    --schedules "0;dgelu=4,dw=4,finish=0,gprime=0;dgelu=4;pre=1;dgelu=4,gprime=0,fast=1"
{ echo "--- mlp_bench --kernels M=16384"; grep -E "^M=|^  tk|kernels of|gemm|reduce|elementwise|finish|Memset|Fill" "$L/mlp_kernels.log" | cut -c1-150; } >> "$S"

# 6. the plain GEMMs of the c_fc and dGELU shapes, if time is left
step 12 mlp_plain.log python3 -m kernels.mlp_bench --kernels --M 16384 --C 3072 --H 768 --trials 1 --iters 5 \
    --schedules "proj=4,dx=4,gprime=0;proj=6,dx=6,gprime=0"
{ echo "--- mlp_plain (C=3072, H=768: c_proj fwd = c_fc's shape, dx = dGELU's shape, plain epilogues)"; grep -E "^M=|kernels of|gemm" "$L/mlp_plain.log" | cut -c1-150; } >> "$S"
note "done in $(( $(date +%s) - START )) s"
pack

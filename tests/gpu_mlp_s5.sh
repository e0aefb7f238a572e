#!/bin/bash
# tests/gpu_mlp_s5.sh OUT — session 5, engineer M (issue 6: the MLP at 1.10x eager and torch.compile).
# This is the closing version, for the final call (ONE quiet H200, within 110 s: LANE_LIMIT 105 s).
# Calls 2 and 3 ran its earlier versions (git log -- tests/gpu_mlp_s5.sh): tests of every session 5
# path and ncu of the dGELU and c_fc kernels; their benches died on an mlp_bench bug (fixed, 7547a79).
#   1. build tk_mlp (python -m kernels --build tk_mlp; cached when the final's tests built it)
#   2. issue 6's table in ONE run: kernels/mlp_bench.py --graphs --compile, M = 16384 and 65536,
#      C = 768: the default (fast=1 since session 5), sessions 3-4's default (fast=0) and the
#      opt-ins, CUDA-graph replays in interleaved trials, beside torch eager and torch.compile
#   3. every kernel's time (torch.profiler) at M = 16384 for the main specs
#   4. if time is left: the plain GEMMs of the c_fc and dGELU shapes (swapped sizes C = 3072, H = 768)
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-105}
source tests/gpu_lib.sh "${1:-/tmp/mlp_s5_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_mlp_s5.sh (final) on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. build
step 45 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. issue 6's table: tk specs vs eager vs torch.compile, CUDA graphs, one run
#    0: the default (fast=1); fast=0: sessions 3-4's default; then the opt-ins one at a time and together
#    (the final call also timed dgelu=6,gprime=1: 0.96 / 3.77 ms against the default's 0.90 / 3.26;
#    gprime was removed after it, kernels/NOTES.md session 5 M)
SPECS="0;fast=0;finish=1;dw=10;finish=1,dw=10;dgelu=6,pre=1;finish=1,dw=10,dgelu=6,pre=1"
step 65 mlp_bench_graphs.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 5 --iters 10 --schedules "$SPECS"
{ echo "--- mlp_bench --graphs --compile"; grep -vE "^===|^rc=|UserWarning|_warn_once" "$L/mlp_bench_graphs.log"; } | tee -a "$S"

# 3. per kernel at M = 16384
step 20 mlp_kernels.log python3 -m kernels.mlp_bench --kernels --M 16384 --trials 1 --iters 5 \
    --schedules "0;fast=0;finish=1,dw=10"
{ echo "--- mlp_bench --kernels M=16384"; grep -E "^M=|^  tk|kernels of|gemm|reduce|elementwise|finish|Memset|Fill" "$L/mlp_kernels.log" | cut -c1-150; } >> "$S"
# 4. if time is left: the plain GEMMs of the c_fc and dGELU shapes (C = 3072, H = 768 swaps them:
#    c_proj's forward is then x·Wᵀ at c_fc's shape with a bias-only epilogue, dx is dy·W at the
#    dGELU GEMM's shape with none), i.e. what c_fc's and dGELU's epilogues cost on top
step 15 mlp_plain.log python3 -m kernels.mlp_bench --kernels --M 16384 --C 3072 --H 768 --trials 1 --iters 5 \
    --schedules "proj=4,dx=4;proj=6,dx=6"
{ echo "--- mlp_plain (C=3072, H=768: c_proj fwd = c_fc's shape, dx = dGELU's shape, plain epilogues)"; grep -E "^M=|kernels of|gemm" "$L/mlp_plain.log" | cut -c1-150; } >> "$S"
note "done in $(( $(date +%s) - START )) s"
pack

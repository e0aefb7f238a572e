#!/usr/bin/env bash
# A session's first look, on a TWO-GPU machine (kind nvidia-h200-x2), ~4 min. Session 6's
# (kernels/NOTES.md, "Next session: what to do first", end of session 5):
#
#   bash tests/gpu_probe.sh OUT
#
#   GPU 0:  the attention tests, racecheck, memcheck and bench on the file as pruned after
#           session 5's last GPU call (tests/gpu_attention_s5.sh: defaults only); then the MLP's
#           per-kernel times at M = 65536 for the default and the opt-ins finish=1 / dw=10, which
#           were faster at 16384 and slower at 65536 in session 5 with no profile to say why
#   GPU 1:  ncu (memory workload, warp states, scheduler) of the K = 768 GEMM that holds the MLP
#           back, 16384x768x3072: cuBLAS, our auto (step 5 v1, ping-pong 64x256), step 4
#           (cooperative 128x256) and step 4 v5 (the same in 2-CTA clusters, cuBLAS's design);
#           ncu of the layernorm forward at 16384x768 (slower than torch.compile's there)
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 240).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_probe.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-240}
source tests/gpu_lib.sh "$1"
note "gpu_probe (session 6)"
setup_shakespeare
prebuild_all

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    LANE_LIMIT=140 step 150 gpu_attention_s5.log bash tests/gpu_attention_s5.sh "$L/attention"
    tail -25 "$L/gpu_attention_s5.log" | sed 's/^/    /' >> "$S"
    step 60 mlp_kernels_65536.log python3 -m kernels.mlp_bench --kernels --M 65536 --trials 1 --iters 5 \
        --schedules "0;finish=1;dw=10;dw=10,finish=1"
    { echo "--- mlp_bench --kernels M=65536"; grep -vE "^===|UserWarning|_warn_once" "$L/mlp_kernels_65536.log" | cut -c1-160 | head -80; } >> "$S"
}

write_cases() {
    cat > "$L/gemm_case.py" <<'PY'
# One K = 768 forward product, 16384x768x3072 (y = x·Wᵀ), by cuBLAS and by three tk kernels.
import sys, torch
sys.path.insert(0, ".")
from kernels import gemm
M, K, N = 16384, 768, 3072
x = torch.randn(M, K, device="cuda").bfloat16()
w = (torch.randn(N, K, device="cuda") * K ** -0.5).bfloat16()
ref = x @ w.t()
for step, variant in ((5, 1), (4, 0), (4, 5)):
    y = gemm.matmul(x, w.t(), step=step, variant=variant)
    err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"step {step} v{variant}: rel err vs cuBLAS {err:.2e}")
torch.cuda.synchronize()
PY
    cat > "$L/ln_case.py" <<'PY'
import sys, torch
sys.path.insert(0, ".")
from kernels import layernorm
M, C = 16384, 768
x, r = (torch.randn(M, C, device="cuda").bfloat16() for _ in range(2))
w, b = torch.randn(C, device="cuda"), torch.randn(C, device="cuda")
for _ in range(2):
    y, h, mean, rstd = layernorm._ext_forward(x, r, w, b, 1e-5)     # the default forward kernel, bf16
torch.cuda.synchronize()
print("ln case ran", y.shape, h.dtype)
PY
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    write_cases
    local sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
    step 120 ncu_gemm.log ncu $sections -k "regex:nvjet|gemm|cutlass|sm90" python3 "$L/gemm_case.py"
    grep -E "^  [a-zA-Z_].*\(|Duration|Throughput|L2 Hit|Hit Rate|Issue Slots|No Eligible|Active Warps|Stall|Warp Cycles|Registers|Shared Memory Config|Cluster|Grid Size|step .* rel err" "$L/ncu_gemm.log" > "$L/ncu_gemm_summary.txt"
    step 60 ncu_ln.log ncu $sections -k "regex:forward" python3 "$L/ln_case.py"
    grep -E "^  [a-zA-Z_].*\(|Duration|Throughput|Hit Rate|Issue Slots|No Eligible|Active Warps|Registers|Grid Size|Waves" "$L/ncu_ln.log" > "$L/ncu_ln_summary.txt"
    note "ncu gemm: $(grep -cE 'Duration' "$L/ncu_gemm.log") kernels; ln: $(grep -cE 'Duration' "$L/ncu_ln.log")"
    grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput" "$L/ncu_gemm.log" | cut -c1-140 >> "$S"
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput" "$L/ncu_ln.log" | cut -c1-140 >> "$S"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
pack

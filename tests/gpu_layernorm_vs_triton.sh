#!/bin/bash
# tests/gpu_layernorm_vs_triton.sh OUT — engineer L, session 7: a DIAGNOSTIC for the next session, no
# default change (ONE H200, within 60 s: LANE_LIMIT, default 55 s). torch.compile's residual +
# LayerNorm forward is 1.8 / 2.0 / 3.9 us faster than ours at 16384 / 32768 / 65536 x 768 bf16
# (kernels/NOTES.md, "Session 7: L"), and neither its one-warp blocks nor our tail explain it. This
# collects what the next session needs to stop guessing:
#   1. the Triton kernel torch.compile generates for kernels/layernorm_bench.eager_add_layernorm at
#      16384x768 bf16 (forward, no grad): its source (TORCH_LOGS=output_code) and its PTX from the
#      inductor cache (the load/store forms and cache hints: ld.global.L1::evict_first.L2::cache_hint?)
#                                                                   -> compile.log, triton_*.ptx
#   2. ncu of that kernel and of our forward (default plan) on the same inputs, caches flushed, real
#      clocks: SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, LaunchStats, WarpStateStats and the
#      DRAM bytes read and written                                                   -> ncu.log
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-55}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_vs_triton.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCHINDUCTOR_CACHE_DIR="$OUT/inductor_cache"
unset TK_LAYERNORM_VARIANT
note "gpu_layernorm_vs_triton.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

cat > "$L/case.py" <<'PY'
import torch
from kernels import layernorm as ln
from kernels.layernorm_bench import eager_add_layernorm
assert ln._ext.why_not() is None
M, C = 16384, 768
x, r = (torch.randn(M, C, device="cuda").bfloat16() for _ in range(2))
w, b = torch.randn(C, device="cuda").bfloat16(), torch.randn(C, device="cuda").bfloat16()
compiled = torch.compile(eager_add_layernorm, dynamic=False)
with torch.no_grad():
    for _ in range(2):
        compiled(x, r, w, b)                                  # torch.compile's forward (Triton)
        ln._ext.module.forward(x, r, w, b, 1e-5)             # ours, the default plan
torch.cuda.synchronize()
print("case ran; plan", ln.variant())
PY

# 1. the Triton kernel's source and PTX
TORCH_LOGS=output_code step 30 compile.log python3 "$L/case.py" || note "compile case FAILED: see compile.log"
grep -n -A60 "^def triton_" "$L/compile.log" | head -90 > "$L/triton_source.txt"
note "triton kernels: $(grep -o '^def triton_[a-z_0-9]*' "$L/compile.log" | sort -u | tr '\n' ' ')"
find "$TORCHINDUCTOR_CACHE_DIR" ~/.triton/cache -name "*.ptx" -newer "$L/case.py" 2>/dev/null | head -4 | while read -r f; do cp "$f" "$L/"; done
for f in "$L"/*.ptx; do
    [ -f "$f" ] && note "$(basename "$f"): $(grep -cE 'ld\.global' "$f") ld.global, $(grep -cE 'st\.global' "$f") st.global; forms: $(grep -oE '(ld|st)\.global[.a-zA-Z0-9:_]*' "$f" | sort | uniq -c | tr '\n' ' ')"
done
sed -n 1,70p "$L/triton_source.txt" >> "$S"

# 2. ncu of both forwards (caches flushed, clocks as the GPU runs them)
if command -v ncu > /dev/null; then
    step 30 ncu.log ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum \
        -k "regex:triton_|forward_kernel" -c 4 python3 "$L/case.py" || true
    grep -E "^  [a-zA-Z].*(triton|kernel)|Duration|DRAM Throughput|dram__bytes|inst_executed|Registers Per|Block Size|Grid Size|Achieved Active Warps|L1/TEX Hit|L2 Hit|Block Limit (Barriers|Registers|Shared)|Warp Cycles Per Issued" \
        "$L/ncu.log" | sed -E 's/\(const .*\) \(/ (/' | head -70 >> "$S"
fi
rm -rf "$TORCHINDUCTOR_CACHE_DIR"
note "done"
pack
exit 0

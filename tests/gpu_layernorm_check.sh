#!/bin/bash
# The tk LayerNorm's GPU check (session 2: mixed dtypes), one H200 call, everything logged to
# "$1/layernorm.log":
#   1. build the tk_layernorm extension (timed; 25-45 s cold as before: the bindings' torch headers
#      dominate, nvcc of the 41-kernel layernorm.cu takes ~5 s here, was ~3)
#   2. pytest tests/test_layernorm.py tests/test_layernorm_model.py (every dtype combination vs
#      float64, the bf16 y within one rounding, no cast kernels in the mixed call, opcheck,
#      torch.compile, bad inputs, the model step tk vs torch and its activation-cast count)
#   3. per residual+LayerNorm call, fwd+bwd: the pre-session-2 way (cast kernels around a
#      same-dtype kernel) against the mixed-dtype kernel, at the GPT-2 and shakespeare shapes,
#      CUDA-graph replay; the saving per step against kernels/NOTES.md's prediction
#   4. python3 bench.py --ops layernorm --quick --compile-modes ""
# Usage: bash tests/gpu_layernorm_check.sh OUT_DIR. Expected: ~60-90 s after the cold build.
# Exit status: non-zero if any step failed (each still runs).
OUT=${1:?usage: bash tests/gpu_layernorm_check.sh OUT_DIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
LOG="$OUT/layernorm.log"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
cd "$(dirname "$0")/.."
status=0
step() { echo "== $1 ($(date -u +%T))" >> "$LOG"; }

step "build"
t0=$(date +%s)
timeout 300 python3 -c "from kernels import layernorm; r = layernorm._ext.why_not(); print('build:', r or 'ok'); assert r is None" \
    >> "$LOG" 2>&1 || status=1
echo "build took $(( $(date +%s) - t0 )) s" >> "$LOG"

step "pytest"
timeout 240 python3 -m pytest -q -rfEsx --tb=short tests/test_layernorm.py tests/test_layernorm_model.py >> "$LOG" 2>&1 || status=1

step "casts around a same-dtype kernel vs the mixed-dtype kernel (fwd+bwd per call)"
timeout 60 python3 - >> "$LOG" 2>&1 <<'PY' || status=1
import torch
from kernels import layernorm
ext = layernorm._ext.module


def replay_us(fn, iters=50):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


# (shape, mixed calls per step): 2 per layer (one fewer in layer 0, which has no branch) + ln_f
for name, rows, cols, calls in (("GPT-2 B=32 T=1024 C=768", 32768, 768, 24),
                                ("shakespeare B=64 T=256 C=384", 16384, 384, 12)):
    h = torch.randn(rows, cols, device="cuda")
    branch = torch.randn(rows, cols, device="cuda").bfloat16()
    w, b = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
    dy, dh = torch.randn(rows, cols, device="cuda").bfloat16(), torch.randn(rows, cols, device="cuda")

    def with_casts():   # before: branch -> fp32, fp32 y -> bf16 for the matmul; dy -> fp32, grad -> bf16
        y, hh, mean, rstd = ext.forward(h, branch.float(), w, b, 1e-5)
        y.bfloat16()
        dx, _, _ = ext.backward(dy.float(), dh, hh, mean, rstd, w)
        dx.bfloat16()

    def mixed():
        y, hh, mean, rstd = ext.forward(h, branch, w, b, 1e-5, y_bf16=True)
        ext.backward(dy, dh, hh, mean, rstd, w, residual_grad_bf16=True)

    # correctness of what is timed: same h, y up to one rounding, same gradients
    y0, h0, m0, r0 = ext.forward(h, branch.float(), w, b, 1e-5)
    y1, h1, m1, r1 = ext.forward(h, branch, w, b, 1e-5, y_bf16=True)
    g0 = ext.backward(dy.float(), dh, h0, m0, r0, w)
    g1 = ext.backward(dy, dh, h1, m1, r1, w, residual_grad_bf16=True)
    same = {"h": torch.equal(h0, h1), "y (bf16)": torch.equal(y0.bfloat16(), y1), "dh_out": torch.equal(g0[0], g1[0]),
            "d branch (bf16)": torch.equal(g0[0].bfloat16(), g1[3]), "dw": torch.equal(g0[1], g1[1])}
    print(f"{name}: bitwise equal, casts vs mixed: {same}")
    old, new = replay_us(with_casts), replay_us(mixed)
    n = rows * cols
    moved_old, moved_new = 56 * n, 28 * n   # bytes per call, fwd+bwd (kernels/layernorm.cu, top)
    predicted = (moved_old - moved_new) / 3e12 * 1e6
    print(f"{name}: per call fwd+bwd {old:.1f} us with casts ({moved_old / old / 1e6:.2f} TB/s), "
          f"{new:.1f} us mixed ({moved_new / new / 1e6:.2f} TB/s); saved {old - new:.1f} us per call "
          f"(predicted {predicted:.1f} at 3 TB/s), x{calls} calls = {(old - new) * calls / 1e3:.2f} ms per step "
          f"(predicted {predicted * calls / 1e3:.2f}, plus the no-branch call of layer 0)")
PY

step "bench.py --ops layernorm --quick"
timeout 180 python3 bench.py --ops layernorm --quick --compile-modes "" >> "$LOG" 2>&1 || status=1

echo "== done, status $status ($(date -u +%T))" >> "$LOG"
exit $status

#!/bin/bash
# One H200 call for the tk MLP: build, a smoke check against float64, bench rows, pytest,
# (optionally) compute-sanitizer. Usage: bash tests/mlp_gpu_check.sh OUTDIR  (logs land there)
# Env: SKIP_BENCH=1, SKIP_PYTEST=1, SANITIZE=1, BENCH_ARGS (default: --quick, default compile mode).
OUT=${1:-/tmp/mlp_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
timeout 150 python3 -c "from kernels import mlp_op; r = mlp_op._ext.why_not(); print('build:', r); assert r is None" 2>&1 | tail -30 | tee "$OUT/build.log"
echo "build took $(( $(date +%s) - t0 )) s"
timeout 40 python3 - <<'PY' 2>&1 | tee "$OUT/smoke.log"
import torch, torch.nn.functional as F
from kernels import mlp_op
def rel(a, b): return ((a.double() - b).norm() / b.norm()).item()
for M, C, bias in [(1000, 768, True), (17, 384, False), (16384, 768, True)]:
    g = torch.Generator(device="cuda").manual_seed(M)
    r = lambda *s, sc=1.0: (torch.randn(*s, generator=g, device="cuda") * sc).to(torch.bfloat16)
    H = 4 * C
    x, w1, w2, dy = r(M, C), r(H, C, sc=C ** -0.5), r(C, H, sc=H ** -0.5), r(M, C)
    b1, b2 = (r(H, sc=0.5), r(C, sc=0.5)) if bias else (None, None)
    y, pre, h = mlp_op.mlp_fwd(x, w1, b1, w2, b2)
    grads = mlp_op.mlp_bwd(dy, x, pre, h, w1, w2)
    torch.cuda.synchronize()
    L = [t.double().requires_grad_() for t in (x, w1, w2)]
    B = [t.double().requires_grad_() if t is not None else None for t in (b1, b2)]
    p64 = F.linear(L[0], L[1], B[0]); y64 = F.linear(F.gelu(p64, approximate="tanh"), L[2], B[1]); y64.backward(dy.double())
    errs = {"pre": rel(pre, p64.detach()), "y": rel(y, y64.detach()), "dx": rel(grads[0], L[0].grad),
            "dw_fc": rel(grads[1], L[1].grad), "dw_proj": rel(grads[3], L[2].grad)}
    if bias: errs.update(db_fc=rel(grads[2], B[0].grad), db_proj=rel(grads[4], B[1].grad))
    print(f"smoke M={M} C={C} bias={bias}: " + " ".join(f"{k} {v:.2e}" for k, v in errs.items()))
PY
if [ -z "$SKIP_BENCH" ]; then
  timeout ${BENCH_TIMEOUT:-100} python3 bench.py --ops mlp ${BENCH_ARGS:---quick --compile-modes default --reps 30} --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  grep -v "^\s*$" "$OUT/bench.log" | tail -25
fi
if [ -z "$SKIP_PYTEST" ]; then
  # the full log goes to the file (a crash's first lines matter more than its thread dump)
  timeout ${PYTEST_TIMEOUT:-120} python3 -m pytest -v -s --maxfail=8 --tb=short tests/test_mlp.py > "$OUT/pytest.log" 2>&1
  grep -E "PASSED|FAILED|ERROR|Fatal|terminate|passed|failed|rel|smoke|M=" "$OUT/pytest.log" | head -60
fi
if [ -n "$SANITIZE" ]; then
  timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool memcheck --print-limit 5 python3 -c "
import torch
from kernels import mlp_op
r = lambda *s: torch.randn(*s, device='cuda').to(torch.bfloat16)
x, w1, b1, w2, b2, dy = r(333, 384), r(1536, 384) * 0.05, r(1536), r(384, 1536) * 0.02, r(384), r(333, 384)
y, pre, h = mlp_op.mlp_fwd(x, w1, b1, w2, b2); mlp_op.mlp_bwd(dy, x, pre, h, w1, w2)
torch.cuda.synchronize(); print('memcheck script done')" 2>&1 | tail -12 | tee "$OUT/memcheck.log"
fi

#!/bin/bash
# One H200 call for the GEMM: build, SASS facts, a smoke test per step, pytest, bench, memcheck.
# Usage: bash tests/gemm_gpu_check.sh OUTDIR   (logs land in OUTDIR)
OUT=${1:-/tmp/gemm_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # the sanitizer script below runs from /tmp
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
timeout 180 python3 -c "from kernels import gemm; r = gemm.why_not(); print('build:', r); assert r is None" 2>&1 | tail -30 | tee "$OUT/build.log"
echo "build took $(( $(date +%s) - t0 )) s"
for o in $TORCH_EXTENSIONS_DIR/tk_gemm/*.o; do
  echo "$(basename $o): $(cuobjdump --dump-sass $o 2>/dev/null | grep -oE 'HGMMA\.[0-9x]+|USETMAXREG\.[A-Z_.]+|UTMA[A-Z]+|HMMA\.16816|LDSM[A-Z0-9.]*|LDGSTS|STL|LDL' | sort | uniq -c | tr '\n' ' ')"
done | tee "$OUT/sass.txt"
timeout 60 python3 - <<'PY' 2>&1 | tee "$OUT/smoke.log"
import torch
from kernels import gemm
for step in (1, 2, 3, 4):
    x = torch.randn(200, 128, device="cuda", dtype=torch.bfloat16); W = torch.randn(272, 128, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ W.float().t()
    c = gemm.matmul(x, W.t(), step=step, out_dtype=torch.float32); torch.cuda.synchronize()
    print("smoke step", step, "rel err", ((c - ref).norm() / ref.norm()).item())
PY
if ! grep -q "smoke step 4" "$OUT/smoke.log"; then echo "smoke test failed: stopping"; exit 1; fi
timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -q --maxfail=6 --tb=short tests/test_gemm.py 2>&1 | tail -40 | tee "$OUT/pytest.log"
timeout ${BENCH_TIMEOUT:-120} python3 -m kernels.gemm_bench ${BENCH_ARGS} 2>&1 | tee "$OUT/bench.log"
# step 5 (experimental): smoke test with a short timeout (a protocol bug would hang), then its tests and timing
timeout 30 python3 -c "
import torch; from kernels import gemm
x = torch.randn(1000, 768, device='cuda', dtype=torch.bfloat16); W = torch.randn(3072, 768, device='cuda', dtype=torch.bfloat16)
c = gemm.matmul(x, W.t(), step=5, out_dtype=torch.float32); torch.cuda.synchronize()
ref = x.float() @ W.float().t(); print('smoke step 5 rel err', ((c - ref).norm() / ref.norm()).item())" 2>&1 | tee "$OUT/smoke5.log"
if grep -q "smoke step 5" "$OUT/smoke5.log"; then
  TK_GEMM_STEP5=1 timeout 90 python3 -m pytest -q --maxfail=4 --tb=short -k step5 tests/test_gemm.py 2>&1 | tail -20 | tee "$OUT/pytest5.log"
  timeout ${BENCH_TIMEOUT:-120} python3 -m kernels.gemm_bench --steps 4,5 2>&1 | tee "$OUT/bench5.log"
fi
timeout ${BENCH_TIMEOUT:-120} python3 -m kernels.gemm_bench --variants 2>&1 | tee "$OUT/variants.log"
timeout ${BENCH_TIMEOUT:-120} python3 bench.py --ops gemm --compile-modes '' --reps 20 --warmup 3 --json "$OUT/bench_gemm.json" 2>&1 | tail -30 | tee "$OUT/bench_py.log"
cat > /tmp/gemm_small.py <<'PY'
import torch
from kernels import gemm
r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)
x, W, dy = r(200, 256), r(272, 256), r(200, 272)
for step in (1, 2, 3, 4):
    gemm.matmul(x, W.t(), step=step); gemm.matmul(dy, W, step=step)
gemm.matmul(r(512, 1024).t(), r(512, 256), splits=3)
gemm.matmul(x, W.t(), bias=r(272), gelu=True)
torch.cuda.synchronize(); print("sanitizer script done")
PY
timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool memcheck --print-limit 5 python3 /tmp/gemm_small.py 2>&1 | tail -8 | tee "$OUT/memcheck.log"
timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool racecheck --print-limit 5 python3 /tmp/gemm_small.py 2>&1 | tail -8 | tee "$OUT/racecheck.log"

#!/bin/bash
# tests/gpu_gemm_mlp.sh OUT — one H200 call for the GEMM lessons (steps 4/5, auto) and the MLP's
# kernel schedules (engineer H3, session 3): build both extensions, a smoke check of every new
# kernel with a short timeout (a protocol bug hangs), the GEMM bench at GPT-2's shapes with cuBLAS
# beside, the MLP schedule bench, bench.py's MLP rows, the GEMM and MLP GPU tests, memcheck (if
# 50 s are left, or SANITIZE=1). FINAL=1: only the GEMM/MLP tests and one MLP bench row (~90 s).
# Expected runtime ~3.5-4 min on one warm H200 (builds ~50 s of it); every step is bounded and the
# whole script stays under LANE_LIMIT (default 235 s) plus packing. Results: OUT/summary.txt (the compact
# tables) and OUT/logs.tgz (every log). One GPU is enough.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-235}
source tests/gpu_lib.sh "${1:-/tmp/gemm_mlp_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_mlp.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. both extensions at once (python -m kernels --build: one process each, ~45 s together)
step 150 build.log python3 -m kernels --build tk_gemm tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. smoke: each new kernel once, errors vs fp32/float64 (small; 40 s limit: a hang shows here)
cat > /tmp/smoke_gemm_mlp.py <<'PY'
import torch, torch.nn.functional as F
from kernels import gemm, mlp_op
def rel(a, b): return ((a.double() - b.double()).norm() / b.double().norm()).item()
r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda") * sc).to(torch.bfloat16)
x, W, dy = r(1000, 768), r(3072, 768), r(4096, 2304)
x2 = r(4096, 768)
for step, v in [(4, 0), (5, 0), (5, 1), (5, 2), (0, 0)]:
    c = gemm.matmul(x, W.t(), step=step, variant=v, out_dtype=torch.float32); torch.cuda.synchronize()
    d = gemm.matmul(dy.t(), x2, step=step, variant=v); torch.cuda.synchronize()
    print(f"smoke gemm step {step} v{v}: fwd {rel(c, x.float() @ W.float().t()):.1e} dW {rel(d, dy.float().t() @ x2.float()):.1e}", flush=True)
for sched in ("4", "5", "6", "0,side=0"):
    mlp_op.set_schedule(sched)
    M, C = 1000, 768
    xs, w1, b1, w2, b2, g = r(M, C), r(4 * C, C, sc=C ** -0.5), r(4 * C, sc=0.5), r(C, 4 * C, sc=(4 * C) ** -0.5), r(C, sc=0.5), r(M, C)
    y, pre, h = mlp_op.mlp_fwd(xs, w1, b1, w2, b2)
    dx, dw1, db1, dw2, db2 = mlp_op.mlp_bwd(g, xs, pre, h, w1, w2); torch.cuda.synchronize()
    L = [t.double().requires_grad_() for t in (xs, w1, b1, w2, b2)]
    y64 = F.linear(F.gelu(F.linear(L[0], L[1], L[2]), approximate="tanh"), L[3], L[4]); y64.backward(g.double())
    errs = [rel(a, b) for a, b in [(y, y64), (dx, L[0].grad), (dw1, L[1].grad), (db1, L[2].grad), (dw2, L[3].grad), (db2, L[4].grad)]]
    print(f"smoke mlp schedule {sched}: y dx dw1 db1 dw2 db2 " + " ".join(f"{e:.1e}" for e in errs), flush=True)
mlp_op.set_schedule("0")
print("smoke done", flush=True)
PY
step 40 smoke.log python3 /tmp/smoke_gemm_mlp.py
grep -E "^smoke" "$L/smoke.log" | tee -a "$S"
# the 2-CTA cluster variant (multicast, cross-CTA barriers) alone: if it hangs, only it is dropped
cat > /tmp/smoke_cluster.py <<'PY'
import torch, torch.nn.functional as F
from kernels import gemm, mlp_op
def rel(a, b): return ((a.double() - b.double()).norm() / b.double().norm()).item()
r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda") * sc).to(torch.bfloat16)
for v in (3, 4):
    for M in (1000, 4096, 77):
        x, W = r(M, 768), r(3072, 768)
        c = gemm.matmul(x, W.t(), step=5, variant=v, out_dtype=torch.float32); torch.cuda.synchronize()
        print(f"smoke cluster gemm v{v} M={M}: {rel(c, x.float() @ W.float().t()):.1e}", flush=True)
mlp_op.set_schedule("7")
M, C = 1000, 768
xs, w1, b1, w2, b2, g = r(M, C), r(4 * C, C, sc=C ** -0.5), r(4 * C, sc=0.5), r(C, 4 * C, sc=(4 * C) ** -0.5), r(C, sc=0.5), r(M, C)
y, pre, h = mlp_op.mlp_fwd(xs, w1, b1, w2, b2); dx, dw1, db1, dw2, db2 = mlp_op.mlp_bwd(g, xs, pre, h, w1, w2); torch.cuda.synchronize()
L = [t.double().requires_grad_() for t in (xs, w1, b1, w2, b2)]
y64 = F.linear(F.gelu(F.linear(L[0], L[1], L[2]), approximate="tanh"), L[3], L[4]); y64.backward(g.double())
print("smoke cluster mlp schedule 7: y dx dw1 dw2 " + " ".join(f"{rel(a, b):.1e}" for a, b in [(y, y64), (dx, L[0].grad), (dw1, L[1].grad), (dw2, L[3].grad)]), flush=True)
print("cluster smoke done", flush=True)
PY
step 30 smoke_cluster.log python3 /tmp/smoke_cluster.py
grep -E "^smoke" "$L/smoke_cluster.log" | tee -a "$S"
if grep -q "cluster smoke done" "$L/smoke_cluster.log"; then
  export TK_TEST_CLUSTER=1; V5=1,2,3,4; MLP_SCHEDS="0;0,side=0;4;4,side=0;5;6;7;fc=5,dgelu=5,dw=5;fc=5,dgelu=5,dx=5,proj=5;fc=6,dgelu=6;fc=7,dgelu=7;fc=7,dgelu=7,dx=7,proj=7"
else
  note "CLUSTER SMOKE FAILED: the 2-CTA cluster variant (gemm step 5 v3, MLP schedule 7) is left out below"
  export TK_TEST_CLUSTER=0; V5=1,2; MLP_SCHEDS="0;0,side=0;4;4,side=0;5;6;fc=5,dgelu=5,dw=5;fc=5,dgelu=5,dx=5,proj=5;fc=6,dgelu=6"
fi
if grep -q "smoke done" "$L/smoke.log"; then
  GEMM_STEPS=0,5; MLP_ENV=""; MLP_K="not torch_compile_module"
else
  note "SMOKE FAILED (see above): step-5 paths skipped below, MLP forced to step 4"
  GEMM_STEPS=4; MLP_ENV="TK_MLP_SCHEDULE=4"; MLP_K="not torch_compile_module and not schedules"
fi

# FINAL=1: only what the last combined call has room for: the GEMM and MLP tests and one bench row
if [ -n "$FINAL" ]; then
  step 70 pytest_gemm.log env GEMM_TEST_STEPS=0,4,5 python3 -m pytest -q --maxfail=8 --tb=short tests/test_gemm.py
  note "pytest test_gemm.py (steps 0,4,5): $(grep -E 'passed|failed|error|skipped' "$L/pytest_gemm.log" | tail -1)"
  step 60 pytest_mlp.log python3 -m pytest -q --maxfail=8 --tb=short tests/test_mlp.py -k "not torch_compile_module"
  note "pytest test_mlp.py: $(grep -E 'passed|failed|error|skipped' "$L/pytest_mlp.log" | tail -1)"
  step 40 mlp_bench.log python3 -m kernels.mlp_bench --M 16384 --trials 5 --iters 10 --schedules "0;4"
  grep -vE "^===|^rc=" "$L/mlp_bench.log" | tee -a "$S"
  note "done in $(( $(date +%s) - START )) s"; pack; exit 0
fi

# 3. speed (first: tuning needs it most): GEMM steps vs cuBLAS at GPT-2's shapes (5 interleaved trials), the MLP's schedules vs
#    eager in one process, then bench.py's MLP rows (tk vs eager vs torch.compile)
if [ "$GEMM_STEPS" = "0,5" ]; then
  step 45 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,4,5 --variants5 $V5 --trials 5 --iters 20
  step 40 mlp_bench.log python3 -m kernels.mlp_bench --parts --trials 5 --iters 10 --schedules "$MLP_SCHEDS"
else
  step 45 gemm_bench.log python3 -m kernels.gemm_bench --steps 4 --trials 5 --iters 20
fi
{ echo "--- gemm_bench (TFLOP/s, ratio to torch in the same trials)"; grep -vE "^===|^rc=" "$L/gemm_bench.log"
  echo "--- mlp_bench"; grep -vE "^===|^rc=" "$L/mlp_bench.log" 2>/dev/null; } | tee -a "$S"
step 80 bench_mlp.log env $MLP_ENV python3 bench.py --ops mlp --quick --compile-modes default --reps 30 --json "$OUT/bench_mlp.json"
{ echo "--- bench.py --ops mlp"; grep -vE "^===|^\s*$" "$L/bench_mlp.log" | tail -14; } | tee -a "$S"

# 4. GPU tests (steps 1-3 unchanged this session: only steps 0/4/5 cases here)
step 70 pytest_gemm.log env GEMM_TEST_STEPS=$GEMM_STEPS python3 -m pytest -q --maxfail=8 --tb=short tests/test_gemm.py
note "pytest test_gemm.py (steps $GEMM_STEPS): $(grep -E 'passed|failed|error|skipped' "$L/pytest_gemm.log" | tail -1)"
step 90 pytest_mlp.log env $MLP_ENV python3 -m pytest -q --maxfail=8 --tb=short tests/test_mlp.py -k "$MLP_K"
note "pytest test_mlp.py: $(grep -E 'passed|failed|error|skipped' "$L/pytest_mlp.log" | tail -1)"
grep -E "^FAILED|Error" "$L/pytest_gemm.log" "$L/pytest_mlp.log" | head -12 | tee -a "$S"

# 5. memcheck on small calls of the new kernels, if time is left
cat > /tmp/san_gemm_mlp.py <<'PY'
import torch
from kernels import gemm, mlp_op
r = lambda *s: (torch.randn(*s, device="cuda") * 0.1).to(torch.bfloat16)
x, W, dy = r(200, 256), r(272, 256), r(512, 256)
import os
for v in (0, 1, 2, 3, 4) if os.environ.get("TK_TEST_CLUSTER") != "0" else (0, 1, 2):
    gemm.matmul(x, W.t(), step=5, variant=v, bias=r(272), gelu=True)
    gemm.matmul(dy.t(), r(512, 192), step=5, variant=v, splits=3)
for s in ("5", "6", "7") if os.environ.get("TK_TEST_CLUSTER") != "0" else ("5", "6"):
    mlp_op.set_schedule(s)
    xs, w1, b1, w2, b2, g = r(333, 384), r(1536, 384), r(1536), r(384, 1536), r(384), r(333, 384)
    y, pre, h = mlp_op.mlp_fwd(xs, w1, b1, w2, b2); mlp_op.mlp_bwd(g, xs, pre, h, w1, w2)
torch.cuda.synchronize(); print("sanitizer script done")
PY
if [ $(( LIMIT - ($(date +%s) - START) )) -ge 50 ] || [ -n "$SANITIZE" ]; then
  step 60 memcheck.log compute-sanitizer --tool memcheck --print-limit 5 python3 /tmp/san_gemm_mlp.py
  note "memcheck: $(grep -E 'ERROR SUMMARY|sanitizer script done' "$L/memcheck.log" | tr '\n' ' ')"
else
  note "memcheck skipped: under 50 s left (SANITIZE=1 forces it)"
fi
note "done in $(( $(date +%s) - START )) s"
pack

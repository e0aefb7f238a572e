#!/bin/bash
# tests/gpu_gemm_mlp.sh OUT — one H200 call for the GEMM and the MLP (written in session 4), on ONE
# GPU, within 240 s including the builds (LANE_LIMIT, default 228 s, bounds every step):
#   1. build tk_gemm and tk_mlp (python -m kernels --build, in parallel; ~50 s cold)
#   2. smoke: the dGELU GEMM with pre by TMA (pre=1, opt-in) and by per-thread loads, vs
#      float64 at tails (a protocol bug hangs here, under a 40 s limit); then the 2-CTA cluster
#      kernels (MLP schedules 8, 9; GEMM step 4 v5, step 5 v4) at tails, with TK_GEMM_VERBOSE=1
#   3. the default path first: tests/test_mlp.py without the every-schedule tests, bench.py --ops mlp
#      --compile-modes default (tk vs torch eager vs torch.compile, CUDA graphs, M = 16384 and
#      65536, C = 768: issue 6's done-when, one run), tests/test_gemm.py (steps 0, 4, 5)
#   4. kernels/mlp_bench.py --kernels at M = 16384: the MLP fwd+bwd per schedule (default and the
#      opt-ins), interleaved with torch eager, and every kernel's time (torch.profiler); then the
#      every-schedule MLP tests
#   5. kernels/gemm_bench.py: GPT-2 shapes vs cuBLAS, 5 interleaved trials (issue 3's done-when),
#      with step 4 and step 5 in 2-CTA clusters and step 5's 5-stage variant
#   6. the fastest spec of step 4's table (if not the default) in bench.py, without torch.compile
#   7. ncu of the dGELU kernel and the cluster kernels, if >= 45 s are left
#   8. compute-sanitizer memcheck and racecheck on small calls of the new kernels, if time is left
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-228}
source tests/gpu_lib.sh "${1:-/tmp/gemm_mlp_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_gemm_mlp.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. builds
step 150 build.log python3 -m kernels --build tk_gemm tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. smoke
cat > /tmp/h2_smoke.py <<'PY'
import os, torch, torch.nn.functional as F
from kernels import gemm, mlp_op
def rel(a, b): return ((a.double() - b.double()).norm() / b.double().norm()).item()
r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda") * sc).to(torch.bfloat16)
def mlp_smoke(spec):
    mlp_op.set_schedule(spec)
    for M, C in ((1000, 768), (77, 384), (1, 768)):
        xs, w1, b1, w2, b2, g = r(M, C), r(4 * C, C, sc=C ** -0.5), r(4 * C, sc=0.5), r(C, 4 * C, sc=(4 * C) ** -0.5), r(C, sc=0.5), r(M, C)
        y, pre, h = mlp_op.mlp_fwd(xs, w1, b1, w2, b2)
        dx, dw1, db1, dw2, db2 = mlp_op.mlp_bwd(g, xs, pre, h, w1, w2); torch.cuda.synchronize()
        L = [t.double().requires_grad_() for t in (xs, w1, b1, w2, b2)]
        y64 = F.linear(F.gelu(F.linear(L[0], L[1], L[2]), approximate="tanh"), L[3], L[4]); y64.backward(g.double())
        errs = [rel(a, b) for a, b in [(y, y64), (dx, L[0].grad), (dw1, L[1].grad), (db1, L[2].grad), (dw2, L[3].grad), (db2, L[4].grad)]]
        print(f"smoke mlp [{spec}] M={M} C={C}: y dx dw1 db1 dw2 db2 " + " ".join(f"{e:.1e}" for e in errs), flush=True)
    mlp_op.set_schedule("0")
for spec in ("0", "dgelu=6", "dgelu=6,pre=1", "dgelu=5,pre=1", "dgelu=4,pre=1"):
    mlp_smoke(spec)
print("smoke done", flush=True)
mlp_smoke("fc=8,dgelu=8,pre=1")
mlp_smoke("fc=9,dgelu=9,pre=1")
os.environ["TK_GEMM_VERBOSE"] = "1"
for M in (4096, 77, 1000):                              # the dW products need a token count that is a multiple of 16
    x, W, dy = r(M, 768), r(3072, 768), r(M, 3072)
    for step, v in ((5, 1), (5, 4), (4, 5)):
        c = gemm.matmul(x, W.t(), step=step, variant=v, out_dtype=torch.float32); torch.cuda.synchronize()
        line = f"smoke gemm step {step} v{v} M={M}: fwd {rel(c, x.float() @ W.float().t()):.1e}"
        if M % 16 == 0:
            d = gemm.matmul(dy.t(), x, step=step, variant=v); torch.cuda.synchronize()
            line += f" dW {rel(d, dy.float().t() @ x.float()):.1e}"
        print(line, flush=True)
print("cluster smoke done", flush=True)
PY
step 40 smoke.log python3 /tmp/h2_smoke.py
grep -E "^smoke|cluster launch" "$L/smoke.log" | sort | uniq -c | sort -k2 | cut -c1-220 | tee -a "$S"
MLP_ENV=""; SCHEDS="0;pre=1;dgelu=4,pre=1;dgelu=6;0,side=0;dw=10;dw=10,dx=10,proj=10;fc=8,dgelu=8,pre=1;fc=9,dgelu=9,pre=1;9,dw=4,pre=1"; V4=5; V5=4,5
if ! grep -q "cluster smoke done" "$L/smoke.log"; then
  note "CLUSTER SMOKE DID NOT FINISH: cluster kernels left out below"
  export TK_TEST_CLUSTER=0; SCHEDS="0;pre=1;dgelu=4,pre=1;dgelu=6;0,side=0;dw=10;dw=10,dx=10,proj=10"; V4=""; V5=5
fi
if ! grep -q "smoke done" "$L/smoke.log"; then
  note "SMOKE DID NOT FINISH: see smoke.log; the benches below run the default only"
  SCHEDS="0;0,side=0"
fi

# 3. the default path first: its tests, then issue 6's table (tk default vs eager vs torch.compile,
#    CUDA graphs, M = 16384 and 65536) — what the final call must not lose to a later step
step 40 pytest_mlp.log python3 -m pytest -q --maxfail=8 --tb=short -rf tests/test_mlp.py -k "not torch_compile_module and not schedules_vs"
note "pytest test_mlp.py (default path): $(grep -E 'passed|failed|error|skipped' "$L/pytest_mlp.log" | tail -1)"
step 70 bench_mlp.log env $MLP_ENV python3 bench.py --ops mlp --quick --compile-modes default --reps 30 --json "$OUT/bench_mlp.json"
{ echo "--- bench.py --ops mlp"; grep -vE "^===|^\s*$" "$L/bench_mlp.log" | tail -12; } | tee -a "$S"
step 40 pytest_gemm.log env GEMM_TEST_STEPS=0,4,5 python3 -m pytest -q --maxfail=8 --tb=short -rf tests/test_gemm.py
note "pytest test_gemm.py (steps 0,4,5): $(grep -E 'passed|failed|error|skipped' "$L/pytest_gemm.log" | tail -1)"

# 4. the MLP per schedule and per kernel (M = 16384), then every schedule's tests (the opt-ins)
step 45 mlp_bench.log python3 -m kernels.mlp_bench --M 16384 --kernels --trials 5 --iters 10 --schedules "$SCHEDS"
{ echo "--- mlp_bench"; grep -vE "^===|^rc=|UserWarning|_warn_once" "$L/mlp_bench.log"; } | tee -a "$S"
BEST=$(awk '/^  tk\[/ {ms=$2+0; if (best == "" || ms < bms) {best=$1; bms=ms}} END {print best}' "$L/mlp_bench.log" | sed 's/^tk\[//; s/\]$//')
note "fastest schedule in mlp_bench: ${BEST:-none}"
step 50 pytest_mlp_schedules.log python3 -m pytest -q --maxfail=8 --tb=short -rf tests/test_mlp.py -k "schedules_vs"
note "pytest test_mlp.py (every schedule, pre=1, clusters): $(grep -E 'passed|failed|error|skipped' "$L/pytest_mlp_schedules.log" | tail -1)"
grep -hE "^FAILED|^ERROR" "$L/pytest_mlp.log" "$L/pytest_mlp_schedules.log" "$L/pytest_gemm.log" | head -12 | tee -a "$S"

# 5. issue 3's table: GPT-2 shapes vs cuBLAS (auto = step 5 64x256 at K <= 1024), 5 interleaved trials
step 40 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,4 --variants4 "$V4" --variants5 "$V5" --trials 5 --iters 10
{ echo "--- gemm_bench (TFLOP/s, ratio to torch in the same trials)"; grep -vE "^===|^rc=" "$L/gemm_bench.log"; } | tee -a "$S"

# 6. the fastest mlp_bench spec (if not the default) in bench.py too, without torch.compile
if [ -n "$BEST" ] && [ "$BEST" != "0" ] && [ -z "$MLP_ENV" ]; then
  step 40 bench_mlp_best.log env TK_MLP_SCHEDULE="$BEST" python3 bench.py --ops mlp --quick --compile-modes "" --reps 30 --json "$OUT/bench_mlp_best.json"
  { echo "--- bench.py --ops mlp with TK_MLP_SCHEDULE=$BEST (no torch.compile)"; grep -vE "^===|^\s*$" "$L/bench_mlp_best.log" | tail -8; } | tee -a "$S"
fi

# 7. ncu of the dGELU kernel and the cluster kernels, if >= 45 s are left
cat > /tmp/h2_ncu.py <<'PY'
import torch
from kernels import gemm, mlp_op
r = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)
x, W = r(16384, 768), r(3072, 768)
gemm.matmul(x, W.t(), step=5, variant=1)                # ping-pong 64x256
gemm.matmul(x, W.t(), step=5, variant=4)                # the same in 2-CTA clusters (B multicast)
gemm.matmul(x, W.t(), step=4, variant=5)                # step 4 in 2-CTA clusters
M, C = 16384, 768
xs, w1, b1, w2, b2, g = r(M, C), r(4 * C, C) * 0.03, r(4 * C), r(C, 4 * C) * 0.02, r(C), r(M, C)
y, pre, h = mlp_op.mlp_fwd(xs, w1, b1, w2, b2)
mlp_op.mlp_bwd(g, xs, pre, h, w1, w2)                   # the dGELU GEMM (default schedule)
torch.cuda.synchronize()
print("ncu script done")
PY
if [ -n "$V4" ] && [ $(( LIMIT - ($(date +%s) - START) )) -ge 45 ]; then
  step 40 ncu.log ncu --kernel-name "regex:gemm_pingpong|gemm_ws" --launch-count 6 \
      --section LaunchStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
      python3 /tmp/h2_ncu.py
  { echo "--- ncu (key lines)"; grep -E "^  void|Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc Active|Issue Slots Busy" "$L/ncu.log" | cut -c1-140 | head -60; } >> "$S"
else
  note "ncu skipped: under 45 s left or no clusters"
fi

# 8. compute-sanitizer on small calls of the new kernels (pre by TMA on every schedule, clusters),
#    if >= 45 s are left (or SANITIZE=1): memcheck, then racecheck (shared-memory hazards)
cat > /tmp/h2_san.py <<'PY'
import os, torch
from kernels import gemm, mlp_op
r = lambda *s: (torch.randn(*s, device="cuda") * 0.1).to(torch.bfloat16)
specs = ["dgelu=6,pre=1", "dgelu=5,pre=1", "dgelu=4,pre=1", "10"] + (["fc=8,dgelu=8,pre=1", "fc=9,dgelu=9,pre=1"] if os.environ.get("TK_TEST_CLUSTER") != "0" else [])
for s in specs:
    mlp_op.set_schedule(s)
    xs, w1, b1, w2, b2, g = r(333, 384), r(1536, 384), r(1536), r(384, 1536), r(384), r(333, 384)
    y, pre, h = mlp_op.mlp_fwd(xs, w1, b1, w2, b2); mlp_op.mlp_bwd(g, xs, pre, h, w1, w2)
if os.environ.get("TK_TEST_CLUSTER") != "0":
    x, W, dy = r(200, 256), r(272, 256), r(512, 256)
    gemm.matmul(x, W.t(), step=4, variant=5, bias=r(272), gelu=True)
    gemm.matmul(dy.t(), r(512, 192), step=4, variant=5, splits=3)
torch.cuda.synchronize(); print("sanitizer script done")
PY
for tool in memcheck racecheck; do
  if [ $(( LIMIT - ($(date +%s) - START) )) -ge 45 ] || [ -n "$SANITIZE" ]; then
    step 60 $tool.log compute-sanitizer --tool $tool --print-limit 5 python3 /tmp/h2_san.py
    note "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitizer script done|Error' "$L/$tool.log" | head -4 | tr '\n' ' ')"
  else
    note "$tool skipped: under 45 s left (SANITIZE=1 forces it)"
  fi
done
note "done in $(( $(date +%s) - START )) s"
pack

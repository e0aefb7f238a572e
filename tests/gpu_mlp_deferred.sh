#!/bin/bash
# tests/gpu_mlp_deferred.sh OUT — engineer M, session 7 (issues 6 and 7): the MLP's dGELU and c_fc
# epilogues under the next tile's math in half boxes (kernels/mlp_deferred.cuh): fast=3 (dGELU,
# peeled), fast=4 (dGELU, one loop), fcfast=4 (c_fc), all opt-in. ONE H200, within 120 s
# (LANE_LIMIT, default 112):
#   1. build tk_mlp (a no-op when the call prebuilt this tree)
#   2. GPU tests of the session 7 paths against float64 and the default / fcfast=3 (tails in M
#      and N, short K, poisoned outputs), the evaluation twins, determinism, no-bias, refusals
#   3. compute-sanitizer memcheck on the new kernels (several tiles per CTA, a tail, short K)
#   4. per-kernel times (eager launches, torch.profiler) of the default and the candidates at
#      M = 16384 and 65536
#   5. issue 6's table: mlp_bench --graphs --compile at 16384 and 65536, the default beside the
#      candidates, interleaved, torch eager and torch.compile in the same run, with nvidia-smi
#      sampling SM clock and power every 100 ms during it (session 6's graph/eager disagreement)
#   6. racecheck on the same case, if time is left
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-112}
source tests/gpu_lib.sh "${1:-/tmp/mlp_deferred_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
note "gpu_mlp_deferred.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 60 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. tests of the session 7 paths (and the tests they joined)
step 32 tests.log python3 -m pytest -q -n 8 -p no:cacheprovider --maxfail=5 -rf tests/test_mlp.py \
    -k "session7 or dgelu_deferred or fc_parts or refuses or (inference and fcfast) or deterministic or no_bias_grads"
note "tests (session 7 paths): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"

# 3. memcheck: the deferred kernels with 1-3 tiles per CTA (M = 2000 + tail, C = 768: 12 k-steps)
# and short K (C = 128: 2 k-steps, the parts after the loop), bias and none
cat > "$L/sanitize_case.py" <<'EOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import mlp_op
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)
for spec in ("fast=3,fcfast=4", "fast=4"):
    mlp_op.set_schedule(spec)
    for M, C, bias in ((4000 + 77, 768, True), (20000 + 5, 128, False)):
        H = 4 * C
        x, w1, w2, dy = r(M, C), r(H, C, scale=C ** -0.5), r(C, H, scale=H ** -0.5), r(M, C)
        b1, b2 = (r(H), r(C)) if bias else (None, None)
        y, pre, h = mlp_op.mlp_fwd(x, w1, b1, w2, b2)
        dx, dw1, db1, dw2, db2 = mlp_op.mlp_bwd(dy, x, pre, h, w1, w2, bias_grads=bias)
        torch.cuda.synchronize()
        print(spec, M, C, bias, "dx finite:", bool(torch.isfinite(dx).all()))
mlp_op.set_schedule("0")
print("mlp sanitize case ran")
EOF
step 20 memcheck.log compute-sanitizer --tool memcheck --print-limit 5 python3 "$L/sanitize_case.py"
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|finite: False|rc=' "$L/memcheck.log" | tr '\n' ' ')"

# 4. per kernel, eager launches (one short burst per spec)
KSPECS="0;fast=3;fast=4;fcfast=3;fcfast=4;fast=3,fcfast=4"
step 16 mlp_kernels.log python3 -m kernels.mlp_bench --kernels --M 16384,65536 --trials 1 --iters 5 --schedules "$KSPECS"
{ echo "--- mlp_bench --kernels (µs per launch, eager)"; grep -E "^M=|^  tk|kernels of|gemm|parts|reduce|elementwise|finish|Memset|Fill" \
    "$L/mlp_kernels.log" | cut -c1-150; } >> "$S"

# 5. issue 6's table, with clock / power sampled beside it
SPECS="0;fast=3;fast=4;fcfast=4;fast=3,fcfast=4;fast=3,fcfast=4,finish=1;fcfast=2,defer=1,finish=1,dw=5"
SPECS="$SPECS;fast=3,fcfast=4,defer=1,finish=1,dw=5"
nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
    --format=csv,noheader -lms 100 > "$L/smi_bench.csv" 2>&1 &
SMI=$!
step 48 mlp_bench_graphs.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 5 --iters 20 \
    --schedules "$SPECS"
kill "$SMI" 2>/dev/null
{ echo "--- mlp_bench --graphs --compile"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/mlp_bench_graphs.log"; } | tee -a "$S"
python3 - "$L/smi_bench.csv" >> "$S" 2>&1 <<'EOF'
import sys
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l.count(",") >= 3]
clk = [float(r[1].split()[0]) for r in rows if r[1].split()[0].replace(".", "").isdigit()]
pw = [float(r[2].split()[0]) for r in rows if r[2].split()[0].replace(".", "").isdigit()]
if clk:
    q = lambda v, f: sorted(v)[int(f * (len(v) - 1))]
    print(f"nvidia-smi during the bench: {len(clk)} samples; SM clock MHz min {min(clk):.0f} p10 {q(clk, .1):.0f} "
          f"median {q(clk, .5):.0f} max {max(clk):.0f}; power W median {q(pw, .5):.0f} max {max(pw):.0f}; "
          f"temperature C max {max(float(r[3]) for r in rows if r[3].isdigit()):.0f}")
else:
    print("nvidia-smi sampling gave nothing:", open(sys.argv[1]).read()[:200])
EOF

# 6. racecheck, if time is left
step 25 racecheck.log compute-sanitizer --tool racecheck --print-limit 5 python3 "$L/sanitize_case.py"
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"
note "done in $(( $(date +%s) - START )) s"
pack

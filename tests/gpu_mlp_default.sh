#!/bin/bash
# tests/gpu_mlp_default.sh OUT — engineer M, session 7, call 4 (the last helper call): verifies the
# MLP default proposed this session, finish=1,fcfast=4 (the backward's tail in one kernel; c_fc's
# epilogue in half boxes under the next tile's math on step 4's tile, kernels/mlp_fc_deferred.cu),
# against the old default (finish=0,fcfast=0), and times the dGELU candidates that stay opt-in:
# fast=3 (now 4 stages, 2 staging buffers, pre loads >= 3 k-steps ahead) and fcfast=5 (c_fc saves
# gelu'(pre) in pre's place; dGELU is one product per value). (Call 3 ran before this was ready.)
# ONE H200, within 100 s (LANE_LIMIT, default 98):
#   1. build tk_mlp (a no-op when the call prebuilt this tree)
#   2. compute-sanitizer memcheck (the default's c_fc kernel and both candidates' kernels: several
#      tiles per CTA, tails, short K), then racecheck of fcfast=5's two kernels (call 2 racechecked
#      the default's c_fc kernel and fast=3's first form)
#   3. GPU tests: tests/test_mlp.py but the sessions 3-6 schedule sweeps and the evaluation sweep
#      (call 2 ran fcfast=4's): the default path vs float64 at tails, every session 7 path, autograd,
#      opcheck, torch.compile, the model's loss and gradients
#   4. issue 6's table: mlp_bench --graphs --compile, 5 interleaved trials, new vs old default vs
#      candidates, torch eager and torch.compile in the same run; nvidia-smi clock/power sampled
#   5. per-kernel times (eager launches) at M = 16384, if time is left
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-98}
source tests/gpu_lib.sh "${1:-/tmp/mlp_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
note "gpu_mlp_default.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 60 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. sanitizers: 1-3 tiles per CTA (M = 4077, C = 768: 12 k-steps) and short K (C = 128: 2 k-steps)
cat > "$L/sanitize_case.py" <<'EOF'
import sys, torch
sys.path.insert(0, ".")
from kernels import mlp_op
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)
cases = ((4000 + 77, 768, True), (20000 + 5, 128, False))[:int(sys.argv[2]) if len(sys.argv) > 2 else 2]
for spec in sys.argv[1].split(";"):                # (the default's c_fc, fcfast=4, runs under fast=3)
    mlp_op.set_schedule(spec)
    for M, C, bias in cases:
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
step 12 memcheck.log compute-sanitizer --tool memcheck --print-limit 5 python3 "$L/sanitize_case.py" "fast=3;fcfast=5"
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|finite: False|rc=' "$L/memcheck.log" | tr '\n' ' ')"
step 14 racecheck.log compute-sanitizer --tool racecheck --print-limit 5 python3 "$L/sanitize_case.py" "fcfast=5" 1
note "racecheck: $(grep -E 'RACECHECK SUMMARY|case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"

# 3. tests
step 24 tests.log python3 -m pytest -q -n 8 -p no:cacheprovider --maxfail=8 -rf tests/test_mlp.py \
    -k "not test_schedules_vs_float64 and not session6_schedules and not inference_forward_matches"
note "tests (test_mlp.py without the sessions 3-6 sweeps and the evaluation sweep): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"


# 4. issue 6's table, with clock / power sampled beside it
SPECS="0;finish=0,fcfast=0;fast=3;fcfast=5"
nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
    --format=csv,noheader -lms 100 > "$L/smi_bench.csv" 2>&1 &
SMI=$!
step 26 mlp_bench_graphs.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 5 --iters 20 \
    --schedules "$SPECS"
kill "$SMI" 2>/dev/null
{ echo "--- mlp_bench --graphs --compile"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/mlp_bench_graphs.log"; } | tee -a "$S"
python3 - "$L/smi_bench.csv" >> "$S" 2>&1 <<'EOF'
import sys
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l.count(",") >= 3]
clk = [float(r[1].split()[0]) for r in rows if r[1].split()[0].replace(".", "").isdigit()]
pw = [float(r[2].split()[0]) for r in rows if r[2].split()[0].replace(".", "").isdigit()]
busy = [c for c, p in zip(clk, pw) if p > 300]        # samples while the GPU was working
if clk:
    q = lambda v, f: sorted(v)[int(f * (len(v) - 1))] if v else float("nan")
    print(f"nvidia-smi during the bench: {len(clk)} samples, {len(busy)} above 300 W; SM clock MHz of those: min "
          f"{min(busy) if busy else float('nan'):.0f} p10 {q(busy, .1):.0f} median {q(busy, .5):.0f}; power W max {max(pw):.0f}; "
          f"temperature C max {max(float(r[3]) for r in rows if r[3].isdigit()):.0f}")
else:
    print("nvidia-smi sampling gave nothing:", open(sys.argv[1]).read()[:200])
EOF

# 5. per kernel, eager launches, if time is left
KSPECS="0;finish=0,fcfast=0;fast=3;fcfast=5"
step 10 mlp_kernels.log python3 -m kernels.mlp_bench --kernels --M 16384 --trials 1 --iters 5 --schedules "$KSPECS"
{ echo "--- mlp_bench --kernels (µs per launch, eager)"; grep -E "^M=|^  tk|kernels of|gemm|parts|finish|reduce|elementwise|Memset|Fill" \
    "$L/mlp_kernels.log" | cut -c1-150; } >> "$S"

note "done in $(( $(date +%s) - START )) s"
pack

#!/bin/bash
# tests/gpu_mlp_s5.sh OUT — session 5, engineer M (issue 6: the MLP at 1.10x eager and torch.compile).
# ONE H200, within 150 s including the build (LANE_LIMIT, default 145 s, bounds every step):
#   1. build tk_mlp (python -m kernels --build tk_mlp; ~30-40 s cold)
#   2. correctness of everything new, vs float64 and vs the default: the fast dGELU epilogue
#      (fast=1) on schedules 4, 5, 6 with pre by per-thread loads and by TMA, the saved GELU'
#      (gprime=1: forward and backward, y and h bit-identical, the evaluation forward), the
#      one-kernel backward tail (finish=1) with side jobs on and off, determinism, set_schedule's
#      refusals (tests/test_mlp.py -k "fast or finish or gprime or refuses or deterministic or opt_ins")
#   3. issue 6's table in ONE run: kernels/mlp_bench.py --graphs --compile, M = 16384 and 65536,
#      C = 768: the default and the opt-ins (CUDA-graph replays, interleaved trials) vs torch eager
#      vs torch.compile of the reference MLP
#   4. every kernel's time per spec (torch.profiler) at M = 16384
#   5. ncu (if >= 30 s are left) of c_fc, four dGELU kernels and the gprime=1 pair: speed of light,
#      warp states, instruction counts, scheduler issue rate (report in logs.tgz, summary in summary.txt)
#   6. if time is left: the plain GEMMs of the c_fc and dGELU shapes (swapped sizes C = 3072,
#      H = 768: c_proj's forward and dx are then those shapes without GELU, GELU' or pre), and the
#      default and the fastest combination per kernel at M = 65536
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-145}
source tests/gpu_lib.sh "${1:-/tmp/mlp_s5_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
note "gpu_mlp_s5.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

# 1. build
step 75 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. correctness of the new paths (the default's kernels are unchanged: same policies, same configs)
step 35 pytest_mlp.log python3 -m pytest -q --maxfail=5 --tb=short -rf tests/test_mlp.py \
    -k "fast or finish or gprime or refuses or deterministic or opt_ins or no_bias" -s
note "pytest test_mlp.py (session 5 paths): $(grep -E 'passed|failed|error' "$L/pytest_mlp.log" | tail -1)"
grep -E "^FAILED|^ERROR|opt_ins|: vs float64" "$L/pytest_mlp.log" | head -30 | cut -c1-160 >> "$S"

# 3. issue 6's table: graphs, eager and torch.compile in the same run
SPECS="0;dw=10;finish=1;fast=1;dgelu=6,pre=1,fast=1;gprime=1;dgelu=6,gprime=1;dgelu=6,pre=1,gprime=1,finish=1,dw=10;dgelu=6,pre=1,fast=1,finish=1,dw=10"
step 60 mlp_bench_graphs.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 5 --iters 10 --schedules "$SPECS"
{ echo "--- mlp_bench --graphs --compile"; grep -vE "^===|^rc=|UserWarning|_warn_once" "$L/mlp_bench_graphs.log"; } | tee -a "$S"

# 4. per kernel at M = 16384
KSPECS="0;fast=1;pre=1,fast=1;dgelu=6,pre=1,fast=1;dgelu=6,fast=1;gprime=1;dgelu=6,gprime=1;dgelu=6,pre=1,gprime=1;0,side=0;finish=1"
step 20 mlp_kernels.log python3 -m kernels.mlp_bench --kernels --M 16384 --trials 1 --iters 5 --schedules "$KSPECS"

# 5. ncu: c_fc and the dGELU kernels (default step 4, fast on step 4, ping-pong pre by TMA, fast)
cat > /tmp/mlp_s5_ncu.py <<'PY'
import torch
from kernels import mlp_op
ext = mlp_op._ext.module
r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda") * sc).to(torch.bfloat16)
M, C = 16384, 768
x, w1, b1, w2, b2, dy = r(M, C), r(4 * C, C, sc=C ** -0.5), r(4 * C, sc=0.5), r(C, 4 * C, sc=(4 * C) ** -0.5), r(C, sc=0.5), r(M, C)
y, pre, h = ext.forward(x, w1, b1, w2, b2)                   # c_fc: bias_gelu on ping-pong 64x256
for spec in ("0", "fast=1", "dgelu=6,pre=1", "dgelu=6,pre=1,fast=1"):     # dGELU: step 4, step 4 fast, ping-pong TMA, its fast form
    mlp_op.set_schedule(spec)
    ext.backward(dy, x, pre, h, w1, w2)
mlp_op.set_schedule("dgelu=6,gprime=1")
y, saved, h = ext.forward(x, w1, b1, w2, b2)                 # c_fc saving GELU'(pre)
ext.backward(dy, x, saved, h, w1, w2)                        # dGELU multiplying by it, ping-pong 64x256
torch.cuda.synchronize()
print("ncu script done")
PY
cat > /tmp/mlp_s5_ncu_sum.py <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units, data = rows[0], rows[1], rows[2:]
col = {h: i for i, h in enumerate(head)}
want = ["gpu__time_duration.sum", "smsp__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__cycles_elapsed.avg.per_second"]
for r in data:
    name = r[col["Kernel Name"]] if "Kernel Name" in col else " ".join(r[:6])
    epi = next((e for e in ("dgelu_pre_tma_fast", "dgelu_pre_tma_saved", "dgelu_pre_tma", "dgelu_fast", "dgelu_saved", "dgelu",
                            "bias_gelu_gprime", "bias_gelu") if e + "_epilogue" in name), name[:40])
    sched = "step4" if "gemm_ws" in name else "pingpong"
    print(f"== {epi} on {sched}")
    for w in want:
        if w in col:
            print(f"   {w} = {r[col[w]]} {units[col[w]]}")
    def num(v):
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return None
    stalls = [(num(r[i]), h) for h, i in col.items() if "issue_stalled" in h and h.endswith("_per_issue_active.ratio")]
    stalls = sorted((v, h) for v, h in stalls if v is not None)[::-1]
    print("   stalls per issue: " + ", ".join(f"{h.split('stalled_')[1].split('_per')[0]} {v:.2f}" for v, h in stalls[:8]))
PY
if [ $(( LIMIT - ($(date +%s) - START) )) -ge 30 ]; then
  step 40 ncu.log ncu --kernel-name-base demangled --kernel-name "regex:bias_gelu|dgelu" --launch-count 7 \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats --section LaunchStats \
      --section ComputeWorkloadAnalysis -o "$L/ncu_mlp" -f python3 /tmp/mlp_s5_ncu.py
  step 10 ncu_details.log ncu -i "$L/ncu_mlp.ncu-rep" --page details
  step 10 ncu_raw.log ncu -i "$L/ncu_mlp.ncu-rep" --page raw --csv
  grep -vE "^===|^rc=" "$L/ncu_raw.log" > "$L/ncu_raw.csv"
  { echo "--- ncu (durations under ncu's locked clocks; stalls = warps stalled per issued instruction, all warps)"
    python3 /tmp/mlp_s5_ncu_sum.py "$L/ncu_raw.csv" 2>&1 | head -80; } >> "$S"
else
  note "ncu skipped: under 30 s left"
fi
# 6. the plain GEMMs (swapped sizes) and M = 65536 per kernel, if time is left
step 12 mlp_plain.log python3 -m kernels.mlp_bench --kernels --M 16384 --C 3072 --H 768 --trials 1 --iters 5 --schedules "proj=4,dx=4;proj=6,dx=6;proj=5,dx=5"
step 12 mlp_kernels_65536.log python3 -m kernels.mlp_bench --kernels --M 65536 --trials 1 --iters 3 --schedules "0;dgelu=6,pre=1,gprime=1,finish=1,dw=10"
for f in mlp_kernels mlp_plain mlp_kernels_65536; do
  { echo "--- $f"; grep -E "^M=|^  tk|kernels of|gemm|reduce|elementwise|finish|Memset" "$L/$f.log" | cut -c1-150; } >> "$S"
done
note "done in $(( $(date +%s) - START )) s"
pack

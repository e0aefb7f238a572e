#!/bin/bash
# tests/gpu_gemm_lean.sh OUT — engineer G, session 10 (issue 7): the lean k-step of gemm4's consumer
# loop (config::LEAN, kernels/gemm_4_warp_specialized.cuh; opt-in: TK_GEMM_LEAN_KSTEP=1 runs the
# default pipeline config<4, 64, false, 2, 1> as its lean twin, for matmul's 4v8 / 4v0 and the MLP's
# c_proj forward, dx and dW kernels alike). SASS (sm_90a): the k-step 95 -> 68 instructions per
# warp in 4v8's loop, 91 -> ~62 in the bias / reduce-add kernels; the default kernels' SASS unchanged.
# ONE H200, within 170 s (LANE_LIMIT, default 165 s):
#   1. tests/test_gemm_lean.py: lean vs default bit for bit (dW: fp32 noise) and vs float32 matmul
#      at tails and GPT-2's shapes, the MLP's kernels under the flag, a bad flag value refused
#   2. ncu (a few metrics): c_fc's and c_proj's forward products and dW_fc on step 4, default vs
#      lean, one launch each: time, warp instructions, tensor pipe, issue activity
#   3. kernels/gemm_lean_bench.py: GPT-2's plain products at 32768 tokens and gemm_bench's shapes
#      (torch, auto, auto+lean; dW: step4 split-K into fp32 (the MLP's kind) +lean, 5v10 fp32, 4v4,
#      4v9 +lean; others: 4v0 (exposed per-value epilogue: the MLP's c_proj/dx kind), 4v4, 4v9), 7
#      interleaved trials of CUDA graphs; then the MLP fwd+bwd (tk_mlp) default vs lean vs cuBLAS at
#      16384 and 32768 tokens, with a per-kernel table (the MLP's own c_proj / dx / dW kernels)
# Results: OUT/summary.txt, OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-165}
source tests/gpu_lib.sh "${1:-/tmp/gemm_lean_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_GEMM_LEAN_KSTEP
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
note "gpu_gemm_lean.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 200 > "$L/smi.csv" 2>&1 &
SMI=$!

step 45 tests.log python3 -m pytest -q -p no:cacheprovider --maxfail=6 -rf tests/test_gemm_lean.py
note "tests (lean vs default bit for bit, vs float32, MLP kernels, bad flag): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-240 >> "$S"

METRICS="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
METRICS+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum"
step 30 ncu.log ncu --nvtx --nvtx-include "ncu/" -k "regex:gemm_ws_kernel" --kernel-name-base demangled \
    --metrics "$METRICS" --csv --print-units base python3 -m kernels.gemm_lean_bench ncu
{ echo "--- ncu (clocks locked by ncu), one launch each; order: $(grep -o 'ncu case order: .*' "$L/ncu.log" | cut -c17-)"
  python3 - "$L/ncu.log" <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("  no ncu rows (see ncu.log)"); sys.exit()
head, body = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
by = {}
for r in body:
    if r[ix["Metric Name"]] == "Metric Name":
        continue
    by.setdefault(r[ix["ID"]], {"name": r[ix["Kernel Name"]]})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
print("  id      us   inst M  issue%  tensor%  DRAM rd MB  lean?  kernel")
for i, m in sorted(by.items(), key=lambda kv: int(kv[0])):
    f = lambda k, s=1.0: float(m.get(k, "nan").replace(",", "")) * s
    print(f"  {i:>2} {f('gpu__time_duration.sum', 1e-3):7.1f} {f('smsp__inst_executed.sum', 1e-6):8.2f} "
          f"{f('smsp__issue_active.avg.pct_of_peak_sustained_active'):7.1f} {f('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):8.1f} "
          f"{f('dram__bytes_read.sum', 1e-6):11.1f}  {'LEAN ' if (', 1, 1>' in m['name'] or ', 1, true>' in m['name']) else 'dflt '}  {m['name'][:110]}")
PY
} >> "$S" 2>&1

step 75 bench.log python3 -m kernels.gemm_lean_bench all --shapes gpt2,bench --M 16384,32768 --extra \
    --trials 7 --iters 10 --replays 3 --json "$L/bench.json"
{ echo "--- kernels/gemm_lean_bench.py all --shapes gpt2,bench --M 16384,32768 --extra (x torch: torch time / arm time)"
  grep -vE "^===|^rc=0|UserWarning|_warn_once|warnings.warn" "$L/bench.log" | cut -c1-230; } >> "$S"

kill "$SMI" 2>/dev/null
python3 - "$L/smi.csv" >> "$S" 2>&1 <<'PY'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(", ") >= 2]
num = lambda t: float(t.split()[0]) if t.split() and t.split()[0].replace(".", "").isdigit() else None
busy = sorted(num(r[1]) for r in rows if num(r[2]) and num(r[2]) > 300 and num(r[1]))
print(f"nvidia-smi: {len(rows)} samples, {len(busy)} above 300 W" + (
      f"; SM clock MHz of those min {busy[0]:.0f} median {busy[len(busy) // 2]:.0f} max {busy[-1]:.0f}" if busy else ""))
PY
note "done in $(( $(date +%s) - START )) s"
pack

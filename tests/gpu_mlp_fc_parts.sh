#!/bin/bash
# tests/gpu_mlp_fc_parts.sh OUT — engineer M, session 9. Where do c_fc's extra ~95 µs a layer go
# (GPT-2's step, M = 32768: 309 µs against 215 for a plain product of its shape) and the dGELU
# GEMM's ~43, and do the opt-in candidates of kernels/mlp_fc_deferred.cu cut them: fcfast=8 (whole
# boxes, the two consumer warpgroups taking turns), fcfast=9 (fcfast=5's parts on the kernel's lean
# k-step, kernels/mlp_deferred.cuh)? Session 9's call 2 ran it with cases a-f and fcfast=7 (quarter
# boxes) only (kernels/NOTES.md, session 9 M: every epilogue instruction cost the tensor pipe ~1.3
# cycles; fcfast=7 lost 0.4-0.5% and was removed after the session); fcfast=8 and 9 were written after
# and have NOT run. Cases: tests/mlp_fc_ncu_case.py --list (a c_fc default fcfast=5, g fcfast=8,
# h fcfast=9, c plain x·W1ᵀ 4v8, d fcfast=4, e dGELU default, f plain dy·W2 4v8; no biases).
# ONE H200, within LANE_LIMIT (default 192 s; call 2 took 148 s with 6 cases and 2 specs, so with 7
# and 3 expect ~175 s: the source counters, last, may be skipped; under a 170 s cut, set LANE_LIMIT); a
# .cu change (tk_mlp is rebuilt if the call's prebuild did not include this tree):
#   1. GPU tests: fcfast=8, 9 bit-identical to fcfast=5 (gelu'(pre), h, y) at tails, K = 128..1280,
#      H = 2880, and their backward vs float64; forward under one / backward under another schedule
#      (eager and custom op); refusals; torch.compile of a module; the compiled MLP's saved flag
#      (tests/test_mlp_saved_flag.py, CPU stand-ins)
#   2. ncu at M = 32768, one launch per case (SpeedOfLight, WarpStateStats, SchedulerStats,
#      MemoryWorkloadAnalysis, LaunchStats + DRAM bytes, L2 hit rate, issue slots, tensor pipe,
#      instructions); clocks locked and caches flushed by ncu
#   3. per kernel at boost clocks: CUDA events (5 interleaved rounds; a, g, h, d the whole
#      forward, e the whole backward, c, f the kernel alone) and the profiler's time of the kernel
#      alone, at M = 32768 and 16384
#   4. the MLP fwd+bwd (mlp_bench --graphs --compile --no-bias, M = 16384 and 32768, 7 trials in a
#      fresh random order, 25 ms idle before each burst): default vs fcfast=8, 9 (x first = the
#      paired ratio to the default), torch eager and torch.compile beside them: the decision figure
#   5. if >= 30 s are left: ncu source counters of a, g, h, c, e (stall samples per SASS line)
# Results: OUT/summary.txt and OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-192}
source tests/gpu_lib.sh "${1:-/tmp/mlp_fc_parts_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
CASE=tests/mlp_fc_ncu_case.py
CASES=a,g,h,c,d,e,f
SRC_CASES=a,g,h,c,e                      # neighbours with different kernel names (the source pages are matched by order)
REGEX="regex:bias_gelu_parts|dgelu_parts|deferred_plain"   # = mlp_fc_ncu_case.NCU_REGEX
note "gpu_mlp_fc_parts.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"
python3 "$CASE" --list >> "$S" 2>&1

nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 100 > "$L/smi.csv" 2>&1 &
SMI=$!

# 1. tests (the first test builds tk_mlp if the prebuild did not)
step 50 tests.log python3 -m pytest -q -n 6 -p no:cacheprovider --maxfail=8 -rf tests/test_mlp_saved_flag.py tests/test_mlp.py \
    -k "saved_flag or saves_argument or part_sizes or (reads_what_forward and (8 or 9)) or refuses or compile_module"
note "tests (fcfast=8/9 vs fcfast=5 and float64, mixed schedules, refusals, compile, saved flag): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"

# 2. ncu, one launch per case
REP="$L/ncu_fc"
METRICS="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct"
METRICS+=",smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
METRICS+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
step 45 ncu.log ncu --nvtx --nvtx-include "ncu/" -k "$REGEX" --kernel-name-base demangled \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section LaunchStats --metrics "$METRICS" -f -o "$REP" python3 "$CASE" --mode ncu --cases "$CASES" --warmup 1
grep -E "gemm plan|measured order|check |case done|Error|error:|==ERROR==|^rc=" "$L/ncu.log" | cut -c1-200 >> "$S"
if [ -f "$REP.ncu-rep" ]; then
    step 15 ncu_raw.csv ncu -i "$REP.ncu-rep" --page raw --csv --print-units base
    step 15 ncu_details.txt ncu -i "$REP.ncu-rep" --page details --print-details all
    { echo "--- ncu, one launch per case, M = 32768"; python3 "$CASE" --summarize "$L/ncu_raw.csv" --cases "$CASES" 2>&1; } >> "$S"
    rm -f "$REP.ncu-rep"
else
    note "ncu: no report (see ncu.log)"
fi

# 3. per kernel at boost clocks
step 25 time.log python3 "$CASE" --mode time --cases "$CASES" --M 32768,16384 --rounds 5 --iters 20
{ echo "--- per kernel (no ncu)"; grep -vE "^===|^rc=0|UserWarning|_warn_once|warnings.warn" "$L/time.log" | cut -c1-220; } >> "$S"

# 4. the MLP, default vs fcfast=8 and 9
step 40 bench.log python3 -m kernels.mlp_bench --graphs --compile --no-bias --M 16384,32768 --trials 7 --iters 8 \
    --settle-ms 25 --show-trials --schedules "0;fcfast=8;fcfast=9"
{ echo "--- mlp_bench --graphs --compile --no-bias (GPT-2's MLP): default vs fcfast=8, 9"
  grep -vE "^===|^rc=0|UserWarning|_warn_once|^MLP fwd" "$L/bench.log"; } >> "$S"
kill "$SMI" 2>/dev/null
python3 - "$L/smi.csv" >> "$S" 2>&1 <<'PY'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(", ") >= 2]
num = lambda t: float(t.split()[0]) if t.split() and t.split()[0].replace(".", "").isdigit() else None
busy = sorted(num(r[1]) for r in rows if num(r[2]) and num(r[2]) > 300 and num(r[1]))
print(f"nvidia-smi: {len(rows)} samples, {len(busy)} above 300 W" + (
      f"; SM clock MHz of those min {busy[0]:.0f} median {busy[len(busy) // 2]:.0f} max {busy[-1]:.0f}" if busy else ""))
PY

# 5. source counters, if time is left
if [ $(( LIMIT - ($(date +%s) - START) )) -ge 30 ]; then
    step 30 ncu_src.log ncu --nvtx --nvtx-include "ncu/" -k "$REGEX" --kernel-name-base demangled \
        --section SourceCounters --section WarpStateStats -f -o "$L/ncu_src" \
        python3 "$CASE" --mode ncu --cases "$SRC_CASES" --warmup 1
    if [ -f "$L/ncu_src.ncu-rep" ]; then
        step 15 ncu_source.csv ncu -i "$L/ncu_src.ncu-rep" --page source --csv --print-source sass
        { echo "--- ncu source counters, M = 32768"; python3 "$CASE" --cases "$SRC_CASES" --source "$L/ncu_source.csv" 2>&1; } >> "$S"
        gzip -f "$L/ncu_source.csv"
        [ "$(stat -c %s "$L/ncu_source.csv.gz")" -gt 8000000 ] && { note "ncu_source.csv.gz over 8 MB: dropped"; rm -f "$L/ncu_source.csv.gz"; }
        rm -f "$L/ncu_src.ncu-rep"
    else
        note "ncu source counters: no report (see ncu_src.log)"
    fi
else
    note "ncu source counters skipped: under 30 s left"
fi

note "done in $(( $(date +%s) - START )) s"
pack

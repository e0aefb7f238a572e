#!/bin/bash
# tests/gpu_mlp_dgelu_ncu.sh OUT — engineer M2, session 7 (prepared for the NEXT session's first
# call; not run in session 7). Question: why does the MLP's dGELU GEMM (dpre = (dy·W2) ⊙ gelu'(pre),
# M x 3072 out, K = 768) take ~170 µs at M = 16384 when a plain product of the same shape on step 4
# v8 takes ~100? Session 7 showed it is not the GELU' arithmetic (fcfast=5, one product per value,
# did not move it). Left: the extra reads/writes beside the operand loads (pre or gelu'(pre) 100 MB,
# db1 partials 13 MB, the side jobs' dW-buffer zeroing 19 MB and dy column sums), the epilogue's
# placement (not under the k-loop), or the kernel's schedule. kernels/NOTES.md, session 7 M,
# "Next session's first measurement (M2)" has the predictions and what each outcome means.
# The cases (tests/mlp_dgelu_ncu_case.py --list): a default dGELU, b fcfast=5, c fast=3, d plain 4v8
# (matmul(step=0)), e plain 4v0, f plain 4v6, g a with side=0, h a without bias grads, i fcfast=5
# with side=0 and no bias grads, j b and k c without bias grads (GPT-2's bias=False); M = 16384,
# C = 768, H = 3072, bf16. (With bias grads the side job's dy column sums, one dependent load per
# row, may set a floor under a, b and c alike: g-k test that.)
# ONE H200, within 120 s (LANE_LIMIT, default 115); no .cu changes, no default changed:
#   1. build tk_mlp and tk_gemm (a no-op when the call prebuilt this tree)
#   2. ncu, ONE launch per case after a warm-up outside the NVTX range 'ncu' (ncu --nvtx
#      --nvtx-include ncu/, kernel regex 'dgelu|plain_epilogue|linear_epilogue': from the
#      backward only its dGELU kernel); sections SpeedOfLight, MemoryWorkloadAnalysis,
#      WarpStateStats, SchedulerStats, Occupancy, LaunchStats (+ DRAM bytes, L2 hit rate, issue
#      slots, tensor pipe); clocks locked and caches flushed by ncu (its defaults). If the NVTX
#      filter profiled nothing: again without it (no warm-up, the first launch of each case).
#      Summary: duration, DRAM MB and GB/s, L2 hit rate, issue-slot use, tensor pipe, top stalls.
#   3. CUDA events (no ncu, boost clocks): 5 interleaved rounds of 20 calls per case (a-c, g-i:
#      the whole backward; d-f: the kernel alone), then the profiler's per-kernel time; nvidia-smi
#      clock / power sampled beside it
#   4. if >= 35 s are left: ncu SourceCounters (PC sampling per SASS line) of a, b, c, d, i; summary:
#      per kernel the stall samples by reason and the 12 SASS lines with the most samples
# Results: OUT/summary.txt (compact), OUT/logs.tgz (every log: ncu details, raw CSV, source CSV gz).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/mlp_dgelu_ncu_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
CASE=tests/mlp_dgelu_ncu_case.py
CASES=${DGELU_CASES:-a,b,c,d,e,f,g,h,i,j,k}
SRC_CASES=${DGELU_SOURCE_CASES:-a,b,c,d,i}     # no two neighbours with one kernel name (the source page is matched by order)
REGEX="regex:dgelu|plain_epilogue|linear_epilogue"   # = mlp_dgelu_ncu_case.NCU_REGEX
SECTIONS=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
          --section Occupancy --section LaunchStats)
METRICS="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct"
METRICS+=",smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
METRICS+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
note "gpu_mlp_dgelu_ncu.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1); cases $CASES"
python3 "$CASE" --list --cases "$CASES" >> "$S" 2>&1

# 1. build (no-op when prebuilt)
step 60 build.log python3 -m kernels --build tk_mlp tk_gemm
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# 2. ncu, one launch per case
REP="$L/ncu_dgelu"
FILTER=(--nvtx --nvtx-include "ncu/")          # what step 4 uses too: the NVTX range, or the fallback's
NOWARM=()
step 60 ncu.log ncu "${FILTER[@]}" -k "$REGEX" --kernel-name-base demangled "${SECTIONS[@]}" \
    --metrics "$METRICS" -f -o "$REP" python3 "$CASE" --mode ncu --cases "$CASES" --verbose
if [ ! -f "$REP.ncu-rep" ] || grep -q "No kernels were profiled" "$L/ncu.log"; then
    N=$(echo "$CASES" | tr ',' '\n' | grep -c .)
    note "ncu with the NVTX filter left no report: again without it and without --metrics (first $N launches, no warm-up)"
    step 50 ncu.log ncu -k "$REGEX" --kernel-name-base demangled --launch-count "$N" "${SECTIONS[@]}" \
        -f -o "$REP" python3 "$CASE" --mode ncu --cases "$CASES" --warmup 0 --no-nvtx
    FILTER=(--launch-count "$(echo "$SRC_CASES" | tr ',' '\n' | grep -c .)")
    NOWARM=(--warmup 0 --no-nvtx)
fi
grep -E "gemm plan|schedule|measured order|check |case done|mlp_dgelu_ncu_case.py:|Error|error:|==ERROR==|^rc=" "$L/ncu.log" | cut -c1-200 >> "$S"
if [ -f "$REP.ncu-rep" ]; then
    # (a step's log gets its command line and rc= around the CSV: the summary skips those lines)
    step 20 ncu_raw.csv ncu -i "$REP.ncu-rep" --page raw --csv --print-units base \
        || { mv "$L/ncu_raw.csv" "$L/ncu_raw_failed.log"; step 20 ncu_raw.csv ncu -i "$REP.ncu-rep" --page raw --csv; }
    step 20 ncu_details.txt ncu -i "$REP.ncu-rep" --page details --print-details all
    { echo "--- ncu, one launch per case"; python3 "$CASE" --summarize "$L/ncu_raw.csv" --cases "$CASES" 2>&1; } >> "$S"
    # a report under 12 MB comes back beside the logs (ncu -i on the device reads it); larger ones are dropped
    [ "$(stat -c %s "$REP.ncu-rep")" -lt 12000000 ] && mv "$REP.ncu-rep" "$OUT/" || rm -f "$REP.ncu-rep"
else
    note "ncu: no report (see ncu.log)"
fi

# 3. CUDA events at boost clocks, nvidia-smi sampled beside them
nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 100 > "$L/smi_time.csv" 2>&1 &
SMI=$!
step 30 time.log python3 "$CASE" --mode time --cases "$CASES" --rounds 5 --iters 20
kill "$SMI" 2>/dev/null
{ echo "--- timing (no ncu)"; grep -vE "^===|^rc=0|UserWarning|_warn_once|warnings.warn" "$L/time.log" | cut -c1-200; } >> "$S"
python3 - "$L/smi_time.csv" >> "$S" 2>&1 <<'EOF'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(", ") >= 2]
num = lambda t: float(t.split()[0]) if t.split() and t.split()[0].replace(".", "").isdigit() else None
busy = sorted(num(r[1]) for r in rows if num(r[2]) and num(r[2]) > 300 and num(r[1]))   # samples while the GPU worked
print(f"nvidia-smi during the timing: {len(rows)} samples, {len(busy)} above 300 W" + (
      f"; SM clock MHz of those min {busy[0]:.0f} median {busy[len(busy) // 2]:.0f} max {busy[-1]:.0f}" if busy else ""))
EOF

# 4. source counters of a, b, c, d, i, if time is left
if [ $(( LIMIT - ($(date +%s) - START) )) -ge 35 ]; then
    step 35 ncu_src.log ncu "${FILTER[@]}" -k "$REGEX" --kernel-name-base demangled \
        --section SourceCounters --section WarpStateStats -f -o "$L/ncu_src" \
        python3 "$CASE" --mode ncu --cases "$SRC_CASES" --warmup 1 "${NOWARM[@]}"
    ncu_source_page 20 "ncu source counters" python3 "$CASE" --summarize "" --cases "$SRC_CASES"
else
    note "ncu source counters skipped: under 35 s left"
fi

note "done in $(( $(date +%s) - START )) s"
pack

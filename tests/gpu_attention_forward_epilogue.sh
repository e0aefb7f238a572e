#!/usr/bin/env bash
# tests/gpu_attention_forward_epilogue.sh OUT_DIR — the Hopper forward's per-item costs (session 6,
# engineer A; kernels/NOTES.md "Session 6: A"). Session 6's call 2 ran it at d87342f with the
# candidates below (logs /work/gpu_logs/call2/gpu_attention_forward_epilogue/); 21 won and is the
# default now, 22-24 were taken out, so CANDIDATES is empty by default (give numbers to time new
# opt-in variants the same way). As written for that call: forward variants 21 (O through shared memory and a
# TMA store, items decoded by the producer, approximate 1/l and log2 l) and 22 (the same without
# the TMA store), 23 (21 with the loop's ping-pong turn around S's issue only) and 24 (13, one
# consumer and two CTAs per SM, with 21's epilogue) beside the default (12 / 11) and cuDNN, on ONE
# H200 in <= 150 s
# (TORCH_EXTENSIONS_DIR=/tmp/ext; LANE_LIMIT bounds every step, tests/gpu_lib.sh; logs in OUT/logs,
# packed into OUT/logs.tgz; figures in OUT/summary.txt). Order, riskiest information first:
#   1 build (cached when the caller prebuilt)
#   2 smoke: the default and CANDIDATES (call 2: "21 23 24 22"; empty by default now) with more work items than SMs, one
#     process under a hard limit; only the candidates that print "ok" go on
#   3 the decision: forward at the issue's three shapes, default against the candidates and cuDNN
#     timed in turns (kernels.attention_bench --interleave, CUDA-graph replay, 9 rounds)
#   4 racecheck of the default and the candidates (Q-slot reuse: the TMA store reads the slot the
#     producer refills), then the float64 tests of the candidates and the default (forward only:
#     the backward is unchanged), then memcheck
#   5 ncu (WarpStateStats, SourceCounters) of the first candidate at the GPT-2 shape
#   6 host microseconds per forward call, layer by layer (kernels.attention_bench --host)
#   7 bench.py's issue rows (fwd, fwd+bwd; tk, tk-hopper, the candidates, cuDNN, FA2) for the
#     record and issue 5's target lines (cut short if the time is gone: step 3 decides)
# Checked here without a GPU: bash -n; LANE_LIMIT=20 runs every step to its failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-148}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_forward_epilogue.sh OUT_DIR}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
note "gpu_attention_forward_epilogue.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}

# 1. build
step 60 build.log python3 -m kernels --build tk_attention_hopper tk_attention_hopper_bwd tk_attention \
    || note "a build FAILED (logs/build.log)"
note "$(grep -E '^build |^built' "$L/build.log" | tr '\n' ' ')"

# 2. smoke (session 5's variant 20 missed a 10 s limit here; the default alone took 9 s in the probe)
CANDIDATES=${CANDIDATES:-}
step 30 smoke.log python3 tests/attention_sanitize_case.py items 0 $CANDIDATES
NEW=$(grep -oE "^variant [0-9]+ ok" "$L/smoke.log" | awk '$2 != 0 {printf "%s ", $2}' | sed 's/ $//')
note "smoke of the default and ${CANDIDATES}: passed: ${NEW:-none}; $(tail -1 "$L/smoke.log")"
grep -q "^variant 0 ok" "$L/smoke.log" || { note "THE DEFAULT FORWARD FAILED ITS SMOKE RUN: stopping"; pack; exit 1; }

# 3. the decision: in turns, same process
IMPLS="tk-hopper"
for v in $NEW; do IMPLS="$IMPLS,tk-hopper-v$v"; done
step 40 interleaved.log python3 -m kernels.attention_bench --interleave gpt2,shakespeare-char,t4096-d128 \
    --impls "$IMPLS,sdpa-cudnn" --rounds 9 --reps 20 "$L/interleaved_fwd.json"
grep -E "interleaved|ms " "$L/interleaved.log" | while read -r line; do note "$line"; done

# 4. racecheck, tests, memcheck
step 30 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py all 0 $NEW
note "racecheck (small; forward 0 $NEW, many items): $(grep -E 'RACECHECK SUMMARY|attention case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"
TK_ATTENTION_HOPPER_VARIANTS="${NEW:-12}" step 35 tests.log $PYT $XDIST tests/test_attention_hopper.py \
    -k "not nvcc and not bindings_parse and not gpu_script"
summary "tests (forward ${NEW:-12} + default)" tests.log
step 20 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_sanitize_case.py all 0 $NEW
note "memcheck: $(grep -E 'ERROR SUMMARY|attention case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"

# 5. ncu of the first candidate: where its warps stall, per SASS instruction (session 5's default: call 3)
FIRST=${NEW%% *}
if [ -n "$FIRST" ] && step 25 ncu.log ncu --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis \
        -k regex:persistent_kernel --launch-count 1 -f -o "$L/ncu_fwd_v$FIRST" python3 tests/attention_sanitize_case.py gpt2 "$FIRST"; then
    ncu --import "$L/ncu_fwd_v$FIRST.ncu-rep" --page source --print-source sass --csv > "$L/ncu_fwd_v${FIRST}_source.csv" 2>&1 \
        || ncu --import "$L/ncu_fwd_v$FIRST.ncu-rep" --page source --csv > "$L/ncu_fwd_v${FIRST}_source.csv" 2>&1
    ncu --import "$L/ncu_fwd_v$FIRST.ncu-rep" --page details --print-details all > "$L/ncu_fwd_v${FIRST}_details.txt" 2>&1
    note "ncu v$FIRST: $(grep -E 'Warp Cycles Per Issued|Issue Slots Busy' "$L/ncu_fwd_v${FIRST}_details.txt" | tr -s ' ' | tr '\n' ' ')"
fi

# 6. host cost per call
step 12 host.log python3 -m kernels.attention_bench --host gpt2
grep -E "^host" "$L/host.log" | while read -r line; do note "$line"; done

# 7. bench.py's rows for the record (one implementation after the other: step 3 decides)
BIMPLS="tk,tk-hopper,sdpa-cudnn,sdpa-flash"
for v in $NEW; do BIMPLS="$BIMPLS,tk-hopper-v$v"; done
TK_BENCH_ATTENTION_SHAPES=gpt2,shakespeare-char,t4096-d128 TK_BENCH_ATTENTION_IMPLS="$BIMPLS" \
    step 45 bench.log python3 bench.py --ops attention --compile-modes "" --reps 20 --warmup 3 --json "$L/attention.json"
python3 -m kernels.attention_bench "$L/attention.json" > "$L/bench_tflops.txt" 2>&1
grep -E "^fwd|^    (tk|sdpa)|MISMATCH|targets|>=" "$L/bench_tflops.txt" | head -40 | while read -r line; do note "$line"; done

pack

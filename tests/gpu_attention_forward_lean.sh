#!/usr/bin/env bash
# tests/gpu_attention_forward_lean.sh OUT_DIR — session 8's Hopper forward candidates, on ONE H200 in
# <= 118 s: variants 32 (P in two register buffers, converted between the exponentials), 33 (the
# softmax's mask decision once per item, consumer 1's diagonal tile masked on its second half only,
# the rescale factor by ex2.approx), 34 (both), 35 (34 + the exponentials against the running max
# before the tile's max is known) and 36 (35 + every 8th exponential on the FMA pipe), each = the
# default 30 plus those changes
# (kernels/attention_hopper.cu, persistent_kernel's DOUBLE_P / LEAN_SOFTMAX / STALE_MAX / POLY_EXP;
# kernels/NOTES.md, "Session 8: A"). TORCH_EXTENSIONS_DIR=/tmp/ext (the caller's prebuild; else the smoke step builds).
# LANE_LIMIT bounds every step (tests/gpu_lib.sh); logs in OUT/logs, packed into OUT/logs.tgz;
# figures in OUT/summary.txt. Order, what decides first:
#   1 smoke: CANDIDATES with more work items than SMs (Q-slot reuse), D 64 and 128, T 256/1000/300
#   2 float64 tests of the candidates (test_attention_hopper.py parametrized over them: the issue's
#     T list 1..4096, D 64/128, full attention, large logits, strided views, many items, the
#     CUDA-graph tests), outputs poisoned; meanwhile, racecheck and memcheck of the last candidate
#     that passed (36: every change; none touches shared memory or the barriers)
#   3 forward timing in turns (kernels.attention_bench --interleave, CUDA-graph replay): the default
#     (tk-hopper = 30), the candidates, cuDNN, at the issue's three shapes
#   4 host microseconds per forward call at the GPT-2 shape (kernels.attention_bench --host)
#   5 ncu (WarpStateStats, SourceCounters, ComputeWorkloadAnalysis) of 35 (else the last candidate
#     that passed) and of the default, one GPT-2 launch each: stall samples per SASS instruction
# Checked here without a GPU: bash -n; LANE_LIMIT=20 runs every step to its failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-118}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_forward_lean.sh OUT_DIR}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
note "gpu_attention_forward_lean.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
CANDIDATES=${CANDIDATES:-32 33 34 35 36}

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}

# 1. smoke (builds the forward extension if the caller did not)
step 18 smoke.log python3 tests/attention_sanitize_case.py items $CANDIDATES
NEW=$(grep -oE "^variant [0-9]+ ok" "$L/smoke.log" | awk '{printf "%s ", $2}' | sed 's/ $//')
note "smoke of ${CANDIDATES}: passed: ${NEW:-none}; $(tail -1 "$L/smoke.log")"
[ -n "$NEW" ] || { note "NO CANDIDATE PASSED ITS SMOKE RUN: stopping"; pack; exit 1; }

# 2. float64 tests of the candidates; the sanitizers (mostly CPU) meanwhile, on the last candidate
LAST=${NEW##* }
step 28 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py items $LAST &
step 28 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_sanitize_case.py items $LAST &
TK_ATTENTION_HOPPER_VARIANTS="$NEW" step 30 tests.log $PYT $XDIST tests/test_attention_hopper.py \
    -k "not nvcc and not bindings_parse and not gpu_script"
wait
summary "tests (forward variants $NEW)" tests.log
note "racecheck (forward $LAST, many items): $(grep -E 'RACECHECK SUMMARY|attention case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"
note "memcheck (forward $LAST, many items): $(grep -E 'ERROR SUMMARY|attention case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"

# 3. timing in turns
IMPLS="tk-hopper"
for v in $NEW; do IMPLS="$IMPLS,tk-hopper-v$v"; done
step 28 interleaved.log python3 -m kernels.attention_bench --interleave gpt2,shakespeare-char,t4096-d128 \
    --impls "$IMPLS,sdpa-cudnn" --rounds 9 --reps 20 "$L/interleaved_fwd.json"
grep -E "interleaved,|ms  \(|skipped" "$L/interleaved.log" | while read -r line; do note "$line"; done

# 4. host cost per call (the op path vs cuDNN's SDPA)
step 10 host.log python3 -m kernels.attention_bench --host gpt2
grep -E " us" "$L/host.log" | head -8 | while read -r line; do note "host: $line"; done

# 5. ncu of 35 (else the last candidate that passed) and of the default
NCU=$LAST; case " $NEW " in *" 35 "*) NCU=35;; esac
for v in $NCU 0; do
    if step 14 ncu.log ncu --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis \
            -k regex:persistent_kernel --launch-count 1 -f -o "$L/ncu_fwd_v$v" python3 tests/attention_sanitize_case.py gpt2 "$v"; then
        ncu --import "$L/ncu_fwd_v$v.ncu-rep" --page source --print-source sass --csv > "$L/ncu_fwd_v${v}_source.csv" 2>&1 \
            || ncu --import "$L/ncu_fwd_v$v.ncu-rep" --page source --csv > "$L/ncu_fwd_v${v}_source.csv" 2>&1
        ncu --import "$L/ncu_fwd_v$v.ncu-rep" --page details --print-details all > "$L/ncu_fwd_v${v}_details.txt" 2>&1
        rm -f "$L/ncu_fwd_v$v.ncu-rep"
        note "ncu v$v: $(grep -E 'Elapsed Cycles|Warp Cycles Per Issued|Issue Slots Busy' "$L/ncu_fwd_v${v}_details.txt" | tr -s ' ' | tr '\n' ' ')"
    fi
done
pack

#!/usr/bin/env bash
# tests/gpu_attention_forward_candidates.sh OUT_DIR — session 7's opt-in Hopper forward variants
# (kernels/NOTES.md "Session 7: A"): 26 = the default 21 launched as a programmatic dependent (PDL),
# 27 = 26 + the first item asked of L2 before the dependency wait, 28 / 29 = 27 + every 8th / 4th
# exponential on the FMA pipe; measurements, not default candidates: 30 = 21 without the per-call
# zeroing of its work counter, 31 = 21 with it zeroed by a memset node instead of a fill kernel.
# Tested against float64 and timed in turns beside the default (21)
# and cuDNN, on ONE H200 in <= 120 s (TORCH_EXTENSIONS_DIR=/tmp/ext; expects the caller's prebuild,
# else the smoke step builds; LANE_LIMIT bounds every step, tests/gpu_lib.sh; logs in OUT/logs,
# packed into OUT/logs.tgz; figures in OUT/summary.txt). Order, what decides first:
#   1 smoke: the candidates with more work items than SMs, in their own process under a hard
#     limit (a hang drops the candidates after it, never the whole run)
#   2 tests/test_attention_hopper.py for the candidates that passed the smoke: float64 over the
#     issue's T list, D 64/128, full attention, large logits, strided views, many items per CTA,
#     poisoned outputs; and each captured in a CUDA graph behind the copies that write its inputs
#     (30 and 31: the causal T list and the graph test only)
#   3 the forward timed in turns (kernels.attention_bench --interleave, CUDA-graph replay) at the
#     issue's three shapes: the default (tk-hopper = 21), the candidates, cuDNN
#   4 racecheck of 27 and 29 (every new line in shared memory's use), memcheck of 27, 29, 30, with
#     Q-slot reuse
# CANDIDATES="26 27 28 29 30 31" by default. Checked here without a GPU: bash -n; LANE_LIMIT=20 runs
# every step to its failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-118}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_forward_candidates.sh OUT_DIR}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
note "gpu_attention_forward_candidates.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}

# 1. smoke (builds the forward extension if the caller did not)
CANDIDATES=${CANDIDATES:-26 27 28 29 30 31}
step 18 smoke.log python3 tests/attention_sanitize_case.py items $CANDIDATES
NEW=$(grep -oE "^variant [0-9]+ ok" "$L/smoke.log" | awk '{printf "%s ", $2}' | sed 's/ $//')
note "smoke of ${CANDIDATES}: passed: ${NEW:-none}; $(tail -1 "$L/smoke.log")"
[ -n "$NEW" ] || { note "NO CANDIDATE PASSED ITS SMOKE RUN: stopping"; pack; exit 1; }

# 2. float64 tests of the candidates
FULL=$(for v in $NEW; do case $v in 30|31) ;; *) printf "%s " $v;; esac; done)
MEASURE=$(for v in $NEW; do case $v in 30|31) printf "%s " $v;; esac; done)
if [ -n "$FULL" ]; then
    TK_ATTENTION_HOPPER_VARIANTS="$FULL" step 32 tests.log $PYT $XDIST tests/test_attention_hopper.py \
        -k "not nvcc and not bindings_parse and not gpu_script"
    summary "tests (forward variants $FULL)" tests.log
fi
if [ -n "$MEASURE" ]; then
    TK_ATTENTION_HOPPER_VARIANTS="$MEASURE" step 14 tests_measure.log $PYT $XDIST tests/test_attention_hopper.py \
        -k "test_causal or cuda_graph"
    summary "tests (measurement variants $MEASURE: causal T list, graph)" tests_measure.log
fi

# 3. timing in turns
IMPLS="tk-hopper"
for v in $NEW; do IMPLS="$IMPLS,tk-hopper-v$v"; done
step 26 interleaved.log python3 -m kernels.attention_bench --interleave gpt2,shakespeare-char,t4096-d128 \
    --impls "$IMPLS,sdpa-cudnn" --rounds 9 --reps 20 "$L/interleaved_fwd.json"
grep -E "interleaved,|ms  \(|skipped" "$L/interleaved.log" | while read -r line; do note "$line"; done

# 4. sanitizers on the new code paths
RACE=$(for v in $NEW; do case $v in 27|29) printf "%s " $v;; esac; done)
MEM=$(for v in $NEW; do case $v in 27|29|30) printf "%s " $v;; esac; done)
step 18 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py items ${RACE:-$NEW}
note "racecheck (forward ${RACE:-$NEW}, many items): $(grep -E 'RACECHECK SUMMARY|attention case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"
step 12 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_sanitize_case.py items ${MEM:-$NEW}
note "memcheck (forward ${MEM:-$NEW}): $(grep -E 'ERROR SUMMARY|attention case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
pack

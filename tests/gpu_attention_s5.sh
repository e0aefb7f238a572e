#!/usr/bin/env bash
# tests/gpu_attention_s5.sh OUT_DIR — session 5, engineer A (attention), on ONE H200 in <= 150 s
# with the builds (TORCH_EXTENSIONS_DIR=/tmp/ext; LANE_LIMIT bounds every step, tests/gpu_lib.sh;
# logs in OUT/logs, packed into OUT/logs.tgz; figures in OUT/summary.txt).
# Third version, NOT run as it stands: call 2 ran the first (logs in
# /work/gpu_logs/call2/gpu_attention_s5/: racecheck fix verified, variants 15-17 timed, ncu),
# call 3 the second (f67542b's; /work/gpu_logs/call3/gpu_attention_s5/: 15-19 timed, sanitizers,
# tests). This one was written for an epilogue change (variant 20, taken out at 24c13ae: it hung)
# and has since lost its candidates, variants 15-19 and the portable kernel's L2 order (none beat
# the default on the H200; removed). It checks:
#   - the default forward with its per-launch work counter (tests/test_attention_hopper.py::
#     test_two_streams_at_once: two default forwards at once on two streams)
#   - the forward variants named in CANDIDATES (none now; e.g. CANDIDATES="12 13"): a smoke run
#     under a hard limit (many items per CTA, T = 1000), bench, racecheck, tests vs float64, memcheck
#   - issue 5's rows in one bench.py run with cuDNN and FA2 (GPT-2, shakespeare-char,
#     t4096-d128; fwd and fwd+bwd), and tk-portable against FA2, plus its block-shape tests
# Order: build, smoke, bench, racecheck, tests, memcheck (each step is cut to the lane's time left).
# Checked here without a GPU: bash -n; LANE_LIMIT=20 runs every step to its failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-148}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_s5.sh OUT_DIR}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
note "gpu_attention_s5.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}

# 1. builds (forward, backward, portable: the op module may ask for any of them)
step 70 build.log python3 -m kernels --build tk_attention_hopper tk_attention_hopper_bwd tk_attention \
    || note "a build FAILED (logs/build.log)"
note "$(grep -E '^build |^built' "$L/build.log" | tr '\n' ' ')"

# 2. smoke: the default (its work counter is per launch since call 2) and the
#    CANDIDATES, many items per CTA, T = 1000 (one process, riskiest last; a hang stops
#    it there, and only the variants that printed "ok" go on)
CANDIDATES=${CANDIDATES:-}
step 25 smoke.log python3 tests/attention_sanitize_case.py items 0 $CANDIDATES
NEW=$(grep -oE "^variant [0-9]+ ok" "$L/smoke.log" | awk '$2 != 0 {printf "%s ", $2}' | sed 's/ $//')
note "smoke of the default and variants ${CANDIDATES:-(none)}: passed: $(grep -oE '^variant [0-9]+ ok' "$L/smoke.log" | tr '\n' ' '); $(tail -1 "$L/smoke.log")"
grep -q "^variant 0 ok" "$L/smoke.log" || { note "THE DEFAULT FORWARD FAILED ITS SMOKE RUN: stopping"; pack; exit 1; }

# 3. speed: issue 5's rows (GPT-2, shakespeare-char, t4096-d128; fwd, fwd+bwd), one process with
#    cuDNN and FA2; the candidates as tk-hopper-vN; tk-portable (its default block shapes)
IMPLS="tk,sdpa-cudnn,sdpa-flash,tk-portable"
for v in $NEW; do IMPLS="$IMPLS,tk-hopper-v$v"; done
TK_BENCH_ATTENTION_SHAPES=gpt2,shakespeare-char,t4096-d128 \
    TK_BENCH_ATTENTION_IMPLS="$IMPLS" \
    step 50 bench.log python3 bench.py --ops attention --compile-modes "" --reps 20 --warmup 3 --json "$L/attention.json"
python3 -m kernels.attention_bench "$L/attention.json" > "$L/bench_tflops.txt" 2>&1
grep -E "^fwd|^    (tk|sdpa)|MISMATCH|targets|>=" "$L/bench_tflops.txt" | head -48 | while read -r line; do note "$line"; done

# 4. racecheck: the small case (the backward's fix, the default forward), then the forward with
#    more items than SMs: the default and the candidates that passed the smoke
step 40 racecheck.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py all 0 $NEW
note "racecheck (small; forward 0 $NEW, many items): $(grep -E 'RACECHECK SUMMARY|attention case ran|rc=' "$L/racecheck.log" | tr '\n' ' ')"

# 5. tests: the backward (defaults), the forward (default incl. two streams at once, and the
#    candidates), the portable kernel's block shapes (block-shape tests)
TK_ATTENTION_HOPPER_VARIANTS="${NEW:-12}" step 45 tests.log $PYT $XDIST tests/test_attention_hopper_bwd.py \
    tests/test_attention_hopper.py tests/test_attention.py \
    -k "not nvcc and not bindings_parse and not gpu_script and (not test_attention.py or block_shape)"
summary "tests (backward defaults; forward ${NEW:-12} + default; portable variants)" tests.log

# 6. memcheck of the same cases as racecheck
step 25 memcheck.log compute-sanitizer --tool memcheck python3 tests/attention_sanitize_case.py all 0 $NEW
note "memcheck: $(grep -E 'ERROR SUMMARY|attention case ran|rc=' "$L/memcheck.log" | tr '\n' ' ')"
pack

#!/bin/bash
# tests/gpu_mlp_new_default.sh OUT — engineer M, session 8, call 3 (the last helper call): verifies
# the MLP default proposed after call 2 against the old one (OLD_DEFAULT below, a spec that restores
# it), in one run:
#   1. build tk_mlp (a no-op when the call prebuilt this tree)
#   2. compute-sanitizer memcheck of the new default (tests/mlp_sanitize_case.py: tails, C = 128 and
#      1600, with and without biases); no racecheck: its kernels' shared memory use is session 7's,
#      racechecked then (fcfast=5: 0 hazards), and side=2 touches global memory only
#   3. GPU tests: tests/test_mlp.py without the sessions 3-6 schedule sweeps and the evaluation sweep
#      (the new default's path vs float64 at tails, every session 7-8 path, the mixed-schedule
#      backward, autograd, opcheck, the model's loss and gradients, refusals)
#   4. issue 6's table: mlp_bench --graphs --compile, biases on, M = 16384 and 65536, 7 interleaved
#      trials, new default ("0") vs OLD_DEFAULT (x first = paired ratio to the new default)
#   5. GPT-2's case (no biases): M = 16384, 32768, 65536, new vs old
# ONE H200, within 110 s (LANE_LIMIT, default 105). Results: OUT/summary.txt and OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-105}
source tests/gpu_lib.sh "${1:-/tmp/mlp_new_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
OLD_DEFAULT=${OLD_DEFAULT:-side=1,fcfast=4}
note "gpu_mlp_new_default.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1); new default $(python3 -c 'from kernels import mlp_op; print(mlp_op.parse_schedule("0"))'), old '$OLD_DEFAULT' = $(python3 -c "from kernels import mlp_op; print(mlp_op.parse_schedule('$OLD_DEFAULT'))")"

# 1. build
step 60 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
    --format=csv,noheader -lms 100 > "$L/smi.csv" 2>&1 &
SMI=$!

# 2. memcheck
step 14 memcheck.log compute-sanitizer --tool memcheck --print-limit 5 python3 tests/mlp_sanitize_case.py "0"
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|finite: False|rc=' "$L/memcheck.log" | tr '\n' ' ')"

# 3. tests
step 34 tests.log python3 -m pytest -q -n 8 -p no:cacheprovider --maxfail=8 -rf tests/test_mlp.py \
    -k "not test_schedules_vs_float64 and not session6_schedules and not inference_forward_matches"
note "tests (test_mlp.py without the sessions 3-6 sweeps and the evaluation sweep): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"

# 4. issue 6's table
step 28 bench_bias.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 7 --iters 10 \
    --schedules "0;$OLD_DEFAULT"
{ echo "--- mlp_bench --graphs --compile, WITH biases (issue 6)"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/bench_bias.log"; } | tee -a "$S"

# 5. GPT-2's case
step 13 bench_nobias.log python3 -m kernels.mlp_bench --graphs --no-bias --M 16384,32768,65536 --trials 7 --iters 8 \
    --schedules "0;$OLD_DEFAULT"
{ echo "--- mlp_bench --graphs --no-bias (GPT-2's bias=False)"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/bench_nobias.log"; } | tee -a "$S"

kill "$SMI" 2>/dev/null
python3 - "$L/smi.csv" >> "$S" 2>&1 <<'PY'
import sys
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l.count(",") >= 3]
num = lambda s: float(s.split()[0]) if s.split() and s.split()[0].replace(".", "").isdigit() else None
clk = [num(r[1]) for r in rows]; pw = [num(r[2]) for r in rows]
busy = [c for c, p in zip(clk, pw) if c is not None and p is not None and p > 300]
if busy:
    q = lambda v, f: sorted(v)[int(f * (len(v) - 1))]
    print(f"nvidia-smi: {len(rows)} samples, {len(busy)} above 300 W; SM clock MHz of those: min {min(busy):.0f} "
          f"p10 {q(busy, .1):.0f} median {q(busy, .5):.0f}; power W max {max(p for p in pw if p is not None):.0f}")
else:
    print("nvidia-smi sampling: no busy samples;", open(sys.argv[1]).read()[:200])
PY

note "done in $(( $(date +%s) - START )) s"
pack

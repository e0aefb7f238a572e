#!/bin/bash
# tests/gpu_mlp_new_default.sh OUT — engineer M, session 8, call 3 (the last helper call): verifies
# the MLP default proposed after call 2, fcfast=5 (c_fc saves gelu'(pre) in pre's place; the dGELU
# GEMM's epilogue is one product per value; the backward is told what its forward saved), against
# the old one (OLD_DEFAULT, the spec that restores it: fcfast=4), in one run:
#   1. GPU tests of tests/test_mlp.py that run the default path or the paths this session touched:
#      the default vs float64 at tails with and without bias, no-bias backward, determinism, the
#      backward reading what its forward saved (schedule changed in between; eager and custom op;
#      fcfast=4/5/6, with and without biases), the default's saved tensor, refusals, opcheck, the
#      model's loss and gradients, torch.compile of a module, fcfast=5 vs fcfast=3 and float64. (Builds
#      tk_mlp if the call did not.)
#   2. issue 6's table: mlp_bench --graphs --compile, biases on, M = 16384 and 65536, 7 trials in a
#      fresh random order each, 25 ms idle before each burst; new default ("0") vs OLD_DEFAULT
#      (x first = paired ratio to the new default) and dw=5 (opt-in); every trial printed
#   3. GPT-2's case (no biases): M = 16384, 32768, 65536, new vs old
#   4. compute-sanitizer memcheck of the new default (tests/mlp_sanitize_case.py, two cases), if time
#      is left (its kernels passed memcheck in call 2 as fcfast=5,side=2)
# ONE H200, within 90 s (LANE_LIMIT, default 88). Results: OUT/summary.txt and OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-88}
source tests/gpu_lib.sh "${1:-/tmp/mlp_new_default_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
OLD_DEFAULT=${OLD_DEFAULT:-fcfast=4}
note "gpu_mlp_new_default.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1); old default = '$OLD_DEFAULT'"

nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
    --format=csv,noheader -lms 100 > "$L/smi.csv" 2>&1 &
SMI=$!

# 1. tests
step 36 tests.log python3 -m pytest -q -n 10 -p no:cacheprovider --maxfail=8 -rf tests/test_mlp.py \
    -k "forward_backward_vs_float64 or no_bias_grads or deterministic or reads_what_forward or intermediates or refuses or opcheck or model_loss or gelu_grad_saved or compile_module"
note "tests (default path, no-bias, determinism, mixed schedules, saved tensor, refusals, opcheck, model, fcfast=5): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"

# 2. issue 6's table
step 26 bench_bias.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 7 --iters 10 \
    --settle-ms 25 --show-trials --schedules "0;$OLD_DEFAULT;dw=5"
{ echo "--- mlp_bench --graphs --compile, WITH biases (issue 6)"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/bench_bias.log"; } | tee -a "$S"

# 3. GPT-2's case
step 12 bench_nobias.log python3 -m kernels.mlp_bench --graphs --no-bias --M 16384,32768,65536 --trials 7 --iters 8 \
    --settle-ms 25 --show-trials --schedules "0;$OLD_DEFAULT"
{ echo "--- mlp_bench --graphs --no-bias (GPT-2's bias=False)"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/bench_nobias.log"; } | tee -a "$S"

kill "$SMI" 2>/dev/null

# 4. memcheck, if time is left
step 12 memcheck.log compute-sanitizer --tool memcheck --print-limit 5 python3 tests/mlp_sanitize_case.py "0" 2
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|finite: False|rc=' "$L/memcheck.log" | tr '\n' ' ')"

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

#!/bin/bash
# tests/gpu_mlp_side_fcfast5.sh OUT — engineer M, session 8, call 2. Two questions, measured whole
# (forward + backward, CUDA graphs, interleaved trials, paired ratios against the default):
#   (1) fcfast=5 (c_fc saves gelu'(pre) in pre's place; the dGELU epilogue is one product): the first
#       call measured its dGELU kernel 35-40 µs faster at M = 16384, yet session 7 saw no MLP gain.
#       Whole fwd+bwd vs the default, with biases (issue 6) and without (GPT-2, issue 7), at
#       M = 16384, 32768, 65536, and per kernel (c_fc's forward cost of writing gelu'(pre)).
#   (2) side=2 (new, opt-in): the dGELU GEMM's side job sums dy's columns with 8 row loads in flight
#       instead of one dependent load per row (bit-identical sums); the first call measured the
#       bias-gradient work at +16..21 µs of the dGELU kernel.
# ONE H200, within 120 s (LANE_LIMIT, default 115):
#   1. build tk_mlp (a no-op when the call prebuilt this tree)
#   2. compute-sanitizer memcheck of side=2 on the default and on fcfast=5 (tests/mlp_sanitize_case.py:
#      tails, C = 128 and 1600, with biases: the side job sums dy only then)
#   3. GPU tests: side=2 vs side=1 bit for bit and vs float64 on four dGELU policies, fcfast=5's, the
#      backward reading what its forward saved (schedule changed in between; eager and custom op), opcheck,
#      the default vs float64, no-bias, determinism, refusals
#   4. issue 6's table: mlp_bench --graphs --compile, biases on, M = 16384 and 65536, 7 trials:
#      default, side=2, fcfast=5, fcfast=5,side=2 (x first = paired ratio to the default)
#   5. GPT-2's case: mlp_bench --graphs --no-bias, M = 16384, 32768, 65536: default vs fcfast=5
#   6. per kernel (eager launches, profiler) at M = 16384, with and without biases
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-115}
source tests/gpu_lib.sh "${1:-/tmp/mlp_side_fcfast5_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
note "gpu_mlp_side_fcfast5.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. build
step 60 build.log python3 -m kernels --build tk_mlp
note "$(grep -E '^build|^built' "$L/build.log" | tr '\n' ' ')"

# nvidia-smi clock / power beside everything that follows
nvidia-smi -i "$GPU" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu \
    --format=csv,noheader -lms 100 > "$L/smi.csv" 2>&1 &
SMI=$!

# 2. memcheck
step 16 memcheck.log compute-sanitizer --tool memcheck --print-limit 5 python3 tests/mlp_sanitize_case.py "side=2;fcfast=5,side=2" 3
note "memcheck: $(grep -E 'ERROR SUMMARY|case ran|finite: False|rc=' "$L/memcheck.log" | tr '\n' ' ')"

# 3. tests
step 20 tests.log python3 -m pytest -q -n 8 -p no:cacheprovider --maxfail=8 -rf tests/test_mlp.py \
    -k "side_job_pipelined or gelu_grad_saved or forward_backward_vs_float64 or no_bias_grads or deterministic or refuses or reads_what_forward or opcheck or intermediates or session5_opt_ins"
note "tests (side=2, fcfast=5, default vs float64, no-bias, determinism, refusals): $(grep -E 'passed|failed|error' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"

# 4. issue 6's table (biases on)
step 34 bench_bias.log python3 -m kernels.mlp_bench --graphs --compile --M 16384,65536 --trials 7 --iters 10 \
    --schedules "0;side=2;fcfast=5;fcfast=5,side=2;fcfast=5,side=2,dw=5"
{ echo "--- mlp_bench --graphs --compile, WITH biases"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/bench_bias.log"; } | tee -a "$S"

# 5. GPT-2's case (no biases)
step 16 bench_nobias.log python3 -m kernels.mlp_bench --graphs --no-bias --M 16384,32768,65536 --trials 7 --iters 8 \
    --schedules "0;fcfast=5"
{ echo "--- mlp_bench --graphs --no-bias (GPT-2's bias=False)"; grep -vE "^===|^rc=|UserWarning|_warn_once|^MLP fwd" "$L/bench_nobias.log"; } | tee -a "$S"

# 6. per kernel
step 10 kernels_bias.log python3 -m kernels.mlp_bench --kernels --M 16384 --trials 1 --iters 5 \
    --schedules "0;side=2;fcfast=5;fcfast=5,side=2;fcfast=5,side=2,dw=5"
step 8 kernels_nobias.log python3 -m kernels.mlp_bench --kernels --no-bias --M 16384 --trials 1 --iters 5 --schedules "0;fcfast=5"
for f in kernels_bias kernels_nobias; do
    { echo "--- mlp_bench --kernels ($f; µs per launch, eager)"; grep -E "^M=|^  tk|kernels of|gemm|parts|finish|reduce|elementwise|Memset|Fill|rc=" \
        "$L/$f.log" | cut -c1-150; } >> "$S"
done

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

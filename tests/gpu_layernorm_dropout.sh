#!/bin/bash
# The residual dropout fused into add_layernorm (session 4), on ONE H200, ~200 s (cold build
# included; LANE_LIMIT, default 235 s, bounds the whole script so `pack` always runs):
#   1. the shakespeare_char data (from .gpu_carry/input.txt) and the extensions train.py uses
#      (python -m kernels --build, one process each: ~30-40 s cold; tk_gemm is not needed)
#   2. pytest tests/test_layernorm_dropout.py: the kernel's mask is the numpy twin's, values and
#      gradients vs float64 with that mask, dr == dx * mask / (1 - p), fresh masks per call and per
#      CUDA-graph replay, p=0 bit-identical to no dropout, opcheck, torch.compile, bad inputs
#   3. python -m kernels.layernorm_bench --dropout: per call fwd+bwd at 16384x384, fused vs
#      tk + F.dropout vs no dropout vs PyTorch eager, same process; the kernels with/without mask
#   4. python train.py config/shakespeare.py --kernels=tk (standard evals, CUDA graphs): the
#      end-to-end wall time (session 3's final check: 40.7 s; torch 57.7 s)
#   5. what lane time is left: the no-dropout layernorm tests at the model widths (the p=0 path
#      after this session's changes to the bindings and launchers)
# Usage: bash tests/gpu_layernorm_dropout.sh OUT. Logs: OUT/logs.tgz (logs/*.log), OUT/summary.txt.
# FINAL=1 (the second call, ~220 s): 1, the GPU tests of the masks' independence (in the model,
# across layers and steps; per graph replay; per call), then an A/B of the mask: shakespeare --kernels=tk,
# 1500 iterations, seeds AB_SEEDS (default 1337 1 2 3 4 5), each with the fused mask and with
# F.dropout's (TK_LAYERNORM_DROPOUT=unfused), AB_PARALLEL (6) runs at once: logs/ab_summary.txt
# compares the best val losses; then, if time is left, ncu of the layernorm kernels at 16384x768 /
# 65536x768 bf16 (issue 4: where the backward's fixed ~10 us go).
cd "$(dirname "$0")/.." || exit 1
LANE_LIMIT=${LANE_LIMIT:-235}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_dropout.sh OUT}"
status=0

setup_shakespeare
timeout 120 python3 -m kernels --build tk_layernorm tk_attention tk_attention_hopper tk_attention_hopper_bwd tk_mlp \
    tk_lm_head > "$L/build.log" 2>&1 || { note "a build FAILED: see build.log"; status=1; }
note "$(tail -1 "$L/build.log")"

if [ -n "${FINAL:-}" ]; then
    # A/B of the mask (call 2's fused run: best val 1.5033 against 1.4860-1.4967 unfused): the same
    # 1500 iterations (best val is at 1250-1500; lr schedule as in the 5000-iteration run) for each
    # seed with the fused mask and with F.dropout's (TK_LAYERNORM_DROPOUT=unfused), AB_PARALLEL runs
    # at once on the GPU (only the losses are read here, not the times).
    step 45 pytest.log python3 -m pytest -q -rfEs --tb=short tests/test_layernorm_dropout.py \
        -k "model_masks or graph_replays or keep_rate_on_the_gpu" || status=1
    note "pytest (masks in the model, per replay, per call): $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1)"
    SEEDS=${AB_SEEDS:-1337 1 2 3 4 5}
    PAR=${AB_PARALLEL:-6}
    run_ab() {   # run_ab SEED ARM
        TK_LAYERNORM_DROPOUT=$2 timeout -k 5 "$3" python3 train.py config/shakespeare.py --kernels=tk \
            --always_save_checkpoint=False --seed=$1 --max_iters=1500 --out_dir=/tmp/ab_$2_$1 > "$L/ab_$2_$1.log" 2>&1
    }
    set -- $SEEDS
    while [ $# -gt 0 ]; do
        left=$(( LIMIT - ($(date +%s) - START) - 20 ))
        [ "$left" -lt 40 ] && { note "A/B: no time left for seeds $*"; break; }
        [ "$left" -gt 110 ] && left=110
        batch=()
        for _ in $(seq $(( PAR / 2 ))); do [ $# -gt 0 ] && { batch+=("$1"); shift; }; done
        for seed in "${batch[@]}"; do for arm in fused unfused; do run_ab "$seed" "$arm" "$left" & done; done
        wait
        note "A/B seeds ${batch[*]} done"
    done
    python3 - "$L" > "$L/ab_summary.txt" 2>&1 <<'PY'
import glob, os, re, statistics, sys
runs = {}
for path in glob.glob(os.path.join(sys.argv[1], "ab_*_*.log")):
    arm, seed = re.match(r"ab_(\w+?)_(\d+)\.log", os.path.basename(path)).groups()
    vals = {int(s): float(v) for s, v in re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", open(path).read(), re.M)}
    if 1500 in vals:
        runs[(arm, seed)] = vals
print("seed    " + "".join(f"{a + ' ' + str(s):>16}" for a in ("fused", "unfused") for s in (1000, 1250, 1500)) + f"{'best f':>9}{'best u':>9}")
diffs = []
for seed in sorted({s for _, s in runs}, key=int):
    f, u = runs.get(("fused", seed)), runs.get(("unfused", seed))
    if not (f and u):
        print(seed, "incomplete"); continue
    bf, bu = min(f.values()), min(u.values())
    diffs.append(bf - bu)
    print(f"{seed:<8}" + "".join(f"{r[s]:16.4f}" for r in (f, u) for s in (1000, 1250, 1500)) + f"{bf:9.4f}{bu:9.4f}")
for arm in ("fused", "unfused"):
    best = [min(v.values()) for (a, _), v in runs.items() if a == arm]
    if best:
        print(f"{arm}: best val mean {statistics.mean(best):.4f} (sd {statistics.pstdev(best):.4f}, n {len(best)}; min {min(best):.4f}, max {max(best):.4f})")
if len(diffs) > 1:
    m, sd = statistics.mean(diffs), statistics.stdev(diffs)
    print(f"paired best-val difference fused - unfused: mean {m:+.4f}, sd {sd:.4f}, n {len(diffs)}, t = {m / (sd / len(diffs) ** 0.5):+.2f}")
PY
    note "A/B: $(tail -3 "$L/ab_summary.txt" | tr '\n' '|')"
    cat > /tmp/ln_probe.py <<'PY'
import sys, torch
from kernels import layernorm as L
rows, cols = int(sys.argv[1]), 768
g = torch.Generator(device="cuda").manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=g, device="cuda").bfloat16()
x, r, w, b = rnd(rows, cols).requires_grad_(), rnd(rows, cols).requires_grad_(), rnd(cols).requires_grad_(), rnd(cols).requires_grad_()
dy, dh = rnd(rows, cols), rnd(rows, cols)
for _ in range(3):
    y, h = L.add_layernorm(x, r, w, b, 1e-5)
    torch.autograd.grad((y, h), (x, r, w, b), (dy, dh))
torch.cuda.synchronize()
print("probe ran", rows)
PY
    for rows in 16384 65536; do   # issue 4, if time is left: where the backward's fixed ~10 us go
        step 30 ncu.log ncu --launch-skip 3 --launch-count 3 -k regex:"forward_kernel|backward_kernel|column_sum" \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis env PYTHONPATH="$PWD" python3 /tmp/ln_probe.py $rows || status=1
    done
    grep -E "backward_kernel|forward_kernel|column_sum|Duration|DRAM Throughput|Achieved Occupancy|Memory Throughput" \
        "$L/ncu.log" > "$L/ncu_summary.txt" 2>/dev/null
    note "done (FINAL), status $status"
    pack
    exit $status
fi

step 90 pytest.log python3 -m pytest -q -rfEs --tb=short tests/test_layernorm_dropout.py || status=1
note "pytest test_layernorm_dropout: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1)"

step 40 bench.log python3 -m kernels.layernorm_bench --dropout --json "$OUT/ln_dropout.json" || status=1
note "bench: $(grep -E 'fused saves' "$L/bench.log" | tr -s ' ' | tr '\n' '|')"

step 80 train_tk.log python3 train.py config/shakespeare.py --kernels=tk --always_save_checkpoint=False \
    --out_dir=/tmp/o_tk || status=1
note "train tk: $(grep -E "^summary:" "$L/train_tk.log" | tail -1)"

step 60 pytest_nodrop.log python3 -m pytest -q -rfEs --tb=short tests/test_layernorm.py \
    -k "model_widths_many_rows or opcheck or mixed_call or unused_h or bad_inputs" || status=1
note "pytest test_layernorm (p=0 path): $(grep -E '(passed|failed|error)' "$L/pytest_nodrop.log" | tail -1)"

note "done, status $status"
pack
exit $status

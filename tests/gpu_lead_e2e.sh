#!/usr/bin/env bash
# The lead's mid-session look at the whole step, on ONE H200 (~200 s):
#
#   bash tests/gpu_lead_e2e.sh OUT
#
#   1. bench.py --e2e at GPT-2: tk (train.py's per-op settings), tk with the linear op on, tk on
#      CUDA graphs (train.py --cuda_graphs=True), 30 timed steps each, each variant in its own
#      process; E2E_VARIANTS overrides the list
#   2. the LM head's logits product (4096x768x50304 per chunk) on cuBLAS vs the tk GEMM's default,
#      CUDA graphs, interleaved (tests/lm_head_logits_case.py)
#   3. where tk + torch.compile spends its compile time (tests/tk_compile_time.py: Python stacks
#      every 20 s, dynamo's recompile / graph-break logs, the compile-time breakdown)
# Logs in OUT/logs (packed into OUT/logs.tgz), headlines in OUT/summary.txt. LANE_LIMIT (s, 200).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_lead_e2e.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-200}
source tests/gpu_lib.sh "$1"
note "gpu_lead_e2e on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

step 110 e2e.log python3 bench.py --e2e --models gpt2 --variants "${E2E_VARIANTS:-tk,tk/linear=tk,tk+graphs}" \
    --warmup 8 --reps 30 --e2e-timeout 60 --json "$L/e2e.json"
note "e2e: rc=$?"
grep -E "^\| *gpt2|^\|.*variant|tok/s" "$L/e2e.log" | head -12 >> "$S"

step 40 lm_head_logits.log python3 tests/lm_head_logits_case.py --trials 5 --replays 20
tail -4 "$L/lm_head_logits.log" | sed 's/^/    /' >> "$S"

TORCH_LOGS=recompiles,graph_breaks step 80 tk_compile.log python3 tests/tk_compile_time.py "$L/tk_compile_stacks.txt" 20
note "tk+compile: rc=$? $(grep -E 'finished in' "$L/tk_compile.log")"
echo "    graph breaks / recompiles logged: $(grep -cE 'Graph break|Recompiling' "$L/tk_compile.log")" >> "$S"
pack

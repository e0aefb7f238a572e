#!/usr/bin/env bash
# A short look at where time goes, on a TWO-GPU machine (kind nvidia-h200-x2), ~4 min:
#
#   bash tests/gpu_probe.sh OUT
#
#   both:   every tk extension builds (in parallel)
#   GPU 0:  config/shakespeare.py, standard evals, back to back: --kernels=torch, then tk
#           (train.py's summary line says how much of the wall time the evals took)
#   GPU 1:  bench.py --profile of GPT-2 on tk (with the copy/cast table: shapes and calling
#           lines); the tk+compile shakespeare e2e row under TORCH_LOGS=recompiles,graph_breaks
#           and its profile; the GPU tests of train.py, the compile bookkeeping and the switch
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 300).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_probe.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-300}
source tests/gpu_lib.sh "$1"
note "gpu_probe"
setup_shakespeare
prebuild_all

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    for k in torch tk; do
        step 100 shk_$k.log python3 train.py config/shakespeare.py --kernels=$k --always_save_checkpoint=False --out_dir=/tmp/o_$k
        note "shakespeare $k: $(grep -E '^(summary|cuda_graphs|error)' "$L/shk_$k.log" | tr '\n' ' ')"
    done
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    step 90 profile_gpt2.log python3 bench.py --profile --models gpt2 --kernels tk --profile-rows 25 --json "$L/profile_gpt2.json"
    note "gpt2 tk profile: $(grep -E '^GPU kernels' "$L/profile_gpt2.log" | head -1)"
    TORCH_LOGS=recompiles,graph_breaks step 120 e2e_tk_compile.log python3 bench.py --e2e --models shakespeare-char \
        --variants tk,tk+compile --json "$L/e2e_tk_compile.json"
    note "tk+compile: $(grep -ciE 'graph break|recompil' "$L/e2e_tk_compile.log") graph-break/recompile lines"
    step 90 profile_shk_compile.log python3 bench.py --profile --models shakespeare-char --kernels tk \
        --profile-compile default --profile-rows 25 --json "$L/profile_shk_compile.json"
    step 90 pytest.log python3 -m pytest -q -p no:cacheprovider tests/test_train.py tests/test_compile_graph_breaks.py tests/test_dispatch.py
    note "pytest: $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
    grep -E "^(FAILED|ERROR)" "$L/pytest.log" | head -20 | tee -a "$S"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
pack

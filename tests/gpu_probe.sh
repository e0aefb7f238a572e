#!/usr/bin/env bash
# A session's first look, on a TWO-GPU machine (kind nvidia-h200-x2), ~6 min:
#
#   bash tests/gpu_probe.sh OUT
#
#   both:   every tk extension builds (in parallel)
#   GPU 0:  every GPU test in tests/ (12 workers, -v and -rf: a run cut by its limit still names
#           its failures), so that each test edit since the last GPU run is re-run
#   GPU 1:  bench.py --e2e of GPT-2 on tk with the defaults; bench.py --profile of the GPT-2 tk
#           step; config/shakespeare.py on tk (beside the tests: not comparable with a final
#           check's wall time). (Session 4's probe also timed the LM head's rows_in_shared and
#           rows_per_warp kernels here through TK_LM_HEAD_KERNEL_WIDE/_NARROW; they are the
#           defaults now, kernels/lm_head_op.py.)
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 420).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_probe.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-420}
source tests/gpu_lib.sh "$1"
note "gpu_probe"
setup_shakespeare
prebuild_all

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    step 400 pytest.log python3 -m pytest -v -rf -n 12 -p no:cacheprovider tests/
    note "pytest: $(grep -cE ' PASSED' "$L/pytest.log") passed, $(grep -cE ' FAILED' "$L/pytest.log") failed; $(grep -E '^=+ .*(passed|failed)' "$L/pytest.log" | tail -1)"
    grep -E " FAILED|^ERROR|^FAILED" "$L/pytest.log" | sort -u | head -30 | tee -a "$S"
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    step 90 e2e_tk.log python3 bench.py --e2e --models gpt2 --variants tk --json "$L/e2e_tk.json"
    note "e2e gpt2 tk: $(grep -E 'ms/step' "$L/e2e_tk.log" | tr '\n' ' ')"
    step 90 profile_gpt2.log python3 bench.py --profile --models gpt2 --kernels tk --profile-rows 30 --json "$L/profile_gpt2.json"
    note "gpt2 tk profile: $(grep -E '^GPU kernels' "$L/profile_gpt2.log" | head -1)"
    step 70 shk_tk.log python3 train.py config/shakespeare.py --kernels=tk --always_save_checkpoint=False --out_dir=/tmp/o_tk
    note "shakespeare tk: $(grep -E '^(summary|cuda_graphs|error)' "$L/shk_tk.log" | tr '\n' ' ')"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
pack

#!/usr/bin/env bash
# A session's first look, on a TWO-GPU machine (kind nvidia-h200-x2), ~4 min. Session 7's
# (kernels/NOTES.md, "Next session: what to do first", end of session 6, items 1, 2 and 7):
#
#   bash tests/gpu_probe.sh OUT
#
#   GPU 0:  bench.py --profile of the GPT-2 step on tk (train.py's per-op settings), then with
#           the linear op on (tk/linear=tk), which made the step slower in session 6's e2e
#   GPU 1:  the same profile for torch.compile (the issue's baseline). (Session 7's run also
#           tried tk under torch.compile here; the case failed on its own sys.path and the stall
#           it looked for was found in call 2 and fixed: kernels.prepare_for_compile.)
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 260).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_probe.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-260}
source tests/gpu_lib.sh "$1"
note "gpu_probe (session 7)"
setup_shakespeare
prebuild_all

profile() {   # $1 log name, then bench.py --profile's arguments
    local log=$1; shift
    step 120 "$log.log" python3 bench.py --profile --models gpt2 --warmup 8 --profile-steps 3 --profile-rows 45 \
        --json "$L/$log.json" "$@"
    note "$log: rc=$?"
    grep -E "^bench.py --profile|^GPU kernels:" "$L/$log.log" | head -8 >> "$S"
}

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    profile profile_tk --kernels tk
    profile profile_tk_linear --kernels tk/linear=tk
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    profile profile_compile --kernels torch --profile-compile default
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
pack

#!/usr/bin/env bash
# Issue 7's shakespeare comparison on one GPU, ~4 min: `python train.py config/shakespeare.py`
# (its standard evals, CUDA graphs as the config sets them) with --kernels=torch, then tk, back to
# back, after every tk extension is built (so tk's wall time holds no build).
#
#   bash tests/gpu_shakespeare_pair.sh OUT
#
# Logs in OUT/logs (shk_torch.log, shk_tk.log: their last line is train.py's summary with the wall
# time and best val loss), headlines in OUT/summary.txt. LANE_LIMIT (s, 300).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_shakespeare_pair.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-300}
source tests/gpu_lib.sh "$1"
note "gpu_shakespeare_pair"
setup_shakespeare
prebuild_all
for k in torch tk; do
    step 100 shk_$k.log python3 train.py config/shakespeare.py --kernels=$k --always_save_checkpoint=False --out_dir=/tmp/o_$k
    note "shakespeare $k: $(grep -E '^(summary|cuda_graphs|error)' "$L/shk_$k.log" | tr '\n' ' ')"
done
pack

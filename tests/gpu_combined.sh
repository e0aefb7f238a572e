#!/usr/bin/env bash
# Several engineers' GPU scripts in one device call, on a TWO-GPU machine (kind nvidia-h200-x2):
#
#   bash tests/gpu_combined.sh OUT "LANE0" "LANE1"
#
# Each LANE is a space-separated list of SCRIPT:SECONDS; the scripts of a lane run one after the
# other on that lane's GPU, each as `bash SCRIPT OUT/logs/<script name>` under gpu_lib.sh's `step`
# with a limit of SECONDS (LANE_LIMIT, which the gpu_lib.sh scripts honour, is set 10 s below it
# so they pack their own logs). A SCRIPT may also be a command line with its spaces written as @,
# e.g. python3@bench.py@--e2e@--models@gpt2:120; its output goes to OUT/logs/gpu<i>_cmd<n>.log.
# PREBUILD=0 leaves the building to the scripts (each builds what it needs; torch locks the cache).
# The logs are packed into OUT/logs.tgz; OUT/summary.txt holds each script's exit status and the
# tail of its output. The whole call is bounded by LANE_LIMIT_ALL (s, default 580).
# AFTER="SCRIPT:SECONDS ..." (same forms) runs on GPU 0 once both lanes are done, alone on the
# machine (e.g. bench.py --e2e, whose figures a neighbour's load would bend).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash tests/gpu_combined.sh OUT \"SCRIPT:SECONDS ...\" [\"SCRIPT:SECONDS ...\"]" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT_ALL:-580} source tests/gpu_lib.sh "$1"; shift
note "gpu_combined"
setup_shakespeare
[ "${PREBUILD:-1}" = 0 ] || prebuild_all

run_lane() {   # $1 GPU index, $2 the lane's list, $3 the name of its command logs (default gpu<index>)
    export CUDA_VISIBLE_DEVICES=$1
    run_items "$2" "${3:-gpu$1}"
}

run_lane 0 "$1" &
[ $# -ge 2 ] && run_lane 1 "$2" &
wait
[ -z "${AFTER:-}" ] || run_lane 0 "$AFTER" after
pack

#!/usr/bin/env bash
# Several engineers' GPU scripts in one device call, on a TWO-GPU machine (kind nvidia-h200-x2):
#
#   bash tests/gpu_combined.sh OUT "LANE0" "LANE1"
#
# Each LANE is a space-separated list of SCRIPT:SECONDS; the scripts of a lane run one after the
# other on that lane's GPU, each as `bash SCRIPT OUT/<script name>` under a hard limit of SECONDS
# (LANE_LIMIT, which the gpu_lib.sh scripts honour, is set 10 s below it so they pack their logs).
# A SCRIPT may also be a command line with its spaces written as @, e.g.
# python3@bench.py@--e2e@--models@gpt2:120; its output goes to OUT/gpu<i>_cmd<n>.log. Afterwards OUT is packed into OUT/all.tgz (the device tool returns only a
# few files); OUT/summary.txt holds each script's exit status and the tail of its output.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash tests/gpu_combined.sh OUT \"SCRIPT:SECONDS ...\" [\"SCRIPT:SECONDS ...\"]" >&2; exit 2; }
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
S="$OUT/summary.txt"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
START=$(date +%s)
note() { echo "[$(date -u +%T) +$(( $(date +%s) - START ))s] $*" | tee -a "$S"; }
[ -f data/shakespeare_char/input.txt ] || cp .gpu_carry/input.txt data/shakespeare_char/input.txt 2>/dev/null
python3 data/shakespeare_char/prepare.py > /dev/null 2>&1 || note "shakespeare_char prepare failed"
# PREBUILD=0 leaves the building to the scripts (each builds what it needs; torch locks the cache)
[ "${PREBUILD:-1}" = 0 ] || note "prebuild: $(timeout 200 python3 -m kernels --build 2>&1 | tail -1)"

run_lane() {   # $1 GPU index, $2 the lane's list
    export CUDA_VISIBLE_DEVICES=$1
    local n=0 item cmd seconds name
    while read -r item; do
        [ -n "$item" ] || continue
        n=$((n + 1)); cmd=${item%:*}; seconds=${item##*:}
        if [[ "$cmd" == *.sh ]]; then
            name=$(basename "$cmd" .sh)
            LANE_LIMIT=$((seconds - 10)) timeout -k 5 "$seconds" bash "$cmd" "$OUT/$name" > "$OUT/$name.log" 2>&1
        else
            name="gpu$1_cmd$n"
            timeout -k 5 "$seconds" bash -c "$cmd" > "$OUT/$name.log" 2>&1
        fi
        local rc=$?
        note "GPU $1: $cmd -> rc=$rc"
        tail -12 "$OUT/$name.log" | sed 's/^/    /' >> "$S"
    done < <(echo "$2" | tr ' ' '\n' | sed 's/@/ /g')
}

run_lane 0 "$1" & P0=$!
[ $# -ge 2 ] && { run_lane 1 "$2" & P1=$!; }
wait
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz --exclude summary.txt . 2>/dev/null
note "packed"

# tests/gpu_lib.sh: what the two-GPU check scripts (gpu_speed_check.sh, gpu_validate.sh,
# gpu_final_check.sh) share. Sourced from the repository root as `source tests/gpu_lib.sh OUT`:
# it makes OUT/logs (L) and OUT/summary.txt (S), starts the clock, and defines
#   note TEXT...            a timestamped line, to the terminal and S
#   step SECONDS LOG CMD... run CMD under min(SECONDS, the lane's time left), output appended to
#                           L/LOG with its exit status; refused (status 1) when under 15 s are left
#   prebuild_all            python -m kernels --build: every tk extension at once (cached in
#                           TORCH_EXTENSIONS_DIR), log in L/build.log
#   setup_shakespeare       prepare data/shakespeare_char from .gpu_carry/input.txt if needed
#   pack                    tar L into OUT/logs.tgz (the device tool returns only a few files)
# LANE_LIMIT (seconds, default 480) bounds each lane so that `pack` always runs before the
# device call's own time limit: keep it below that limit.
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
L="$OUT/logs"
S="$OUT/summary.txt"
mkdir -p "$L"
START=$(date +%s)
LIMIT=${LANE_LIMIT:-480}
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # shared machines

note() { echo "[$(date -u +%T) +$(( $(date +%s) - START ))s] $*" | tee -a "$S"; }

step() {
    local seconds=$1 log=$2; shift 2
    local t=$(( LIMIT - ($(date +%s) - START) ))
    if [ "$t" -lt 15 ]; then note "skipped (no time left): $*"; return 1; fi
    [ "$t" -gt "$seconds" ] && t=$seconds
    echo "=== $* (limit ${t}s)" >> "$L/$log"
    timeout -k 5 "$t" "$@" >> "$L/$log" 2>&1
    local rc=$?
    echo "rc=$rc" >> "$L/$log"
    return $rc
}

run_items() {   # $1 "ITEM:SECONDS ...", $2 the name of command logs (default gpu<CUDA_VISIBLE_DEVICES>)
    # Runs the items one after the other on this lane's GPU, each under `step` with its SECONDS: an
    # ITEM ending in .sh is an engineer's script, run as `bash SCRIPT OUT/logs/<name>` with LANE_LIMIT
    # 10 s below SECONDS (so it packs its own logs); any other ITEM is a command line with its
    # spaces written as @ (python3@bench.py@--e2e), its output in OUT/logs/<$2>_cmd<n>.log.
    local n=0 item cmd seconds name
    while read -r item; do
        [ -n "$item" ] || continue
        n=$((n + 1)); cmd=${item%:*}; seconds=${item##*:}
        if [[ "$cmd" == *.sh ]]; then
            name=$(basename "$cmd" .sh)
            LANE_LIMIT=$((seconds - 10)) step "$seconds" "$name.log" bash "$cmd" "$L/$name"
        else
            name="${2:-gpu${CUDA_VISIBLE_DEVICES:-0}}_cmd$n"
            step "$seconds" "$name.log" bash -c "$cmd"
        fi
        note "GPU ${CUDA_VISIBLE_DEVICES:-0}: $cmd -> rc=$?"
        tail -12 "$L/$name.log" | sed 's/^/    /' >> "$S"
    done < <(echo "$1" | tr ' ' '\n' | sed 's/@/ /g')
}

ncu_source_page() {   # $1 seconds, $2 a title, then the command that summarizes the page (gets --source CSV)
    # After `ncu ... --section SourceCounters -o "$L/ncu_src"`: export the report's SASS source page
    # as CSV, append the summary to the headlines, keep the CSV gzipped (dropped over 8 MB: the
    # device returns nothing bigger) and delete the report (it is larger still).
    local seconds=$1 title=$2; shift 2
    if [ -f "$L/ncu_src.ncu-rep" ]; then
        step "$seconds" ncu_source.csv ncu -i "$L/ncu_src.ncu-rep" --page source --csv --print-source sass
        { echo "--- $title"; "$@" --source "$L/ncu_source.csv" 2>&1; } >> "$S"
        gzip -f "$L/ncu_source.csv"
        [ "$(stat -c %s "$L/ncu_source.csv.gz")" -gt 8000000 ] && { note "ncu_source.csv.gz over 8 MB: dropped"; rm -f "$L/ncu_source.csv.gz"; }
        rm -f "$L/ncu_src.ncu-rep"
    else
        note "ncu source counters: no report (see ncu_src.log)"
    fi
}

prebuild_all() {
    timeout 200 python3 -m kernels --build > "$L/build.log" 2>&1 || note "a build FAILED: see build.log"
    note "$(tail -1 "$L/build.log")"
}

setup_shakespeare() {
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$S"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$S"
    [ -f data/shakespeare_char/input.txt ] || cp .gpu_carry/input.txt data/shakespeare_char/input.txt
    python3 data/shakespeare_char/prepare.py > /dev/null || note "prepare failed"
}

pack() {
    tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
    note "packed"
}

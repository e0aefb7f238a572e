#!/usr/bin/env bash
# A session's first look, on a TWO-GPU machine (kind nvidia-h200-x2), ~4 min. Session 7's
# (kernels/NOTES.md, "Next session: what to do first", end of session 6, items 1, 2 and 7):
#
#   bash tests/gpu_probe.sh OUT
#
#   GPU 0:  bench.py --profile of the GPT-2 step on tk (train.py's per-op settings), then with
#           the linear op on (tk/linear=tk), which made the step slower in session 6's e2e
#   GPU 1:  the same profile for torch.compile (the issue's baseline), then tk under
#           torch.compile (config/gpt2.py's compile=True), which did not finish compiling in
#           130 s in session 6: Python stacks are dumped every 30 s to say where the time goes
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
    # tk + torch.compile: where does the compile spend its time? (stacks every 30 s, dynamo's
    # recompile and graph-break logs, compile-time breakdown at the end if it finishes)
    cat > "$L/tk_compile.py" <<'PY'
import faulthandler, runpy, sys, time
faulthandler.dump_traceback_later(30, repeat=True, file=open(sys.argv[1], "w"))
sys.argv = ["bench.py", "--profile", "--models", "gpt2", "--kernels", "tk", "--profile-compile", "default",
            "--warmup", "3", "--profile-steps", "1", "--profile-rows", "20", "--json", sys.argv[2]]
t = time.time()
try:
    runpy.run_path("bench.py", run_name="__main__")
except SystemExit:
    pass
print(f"tk + compile: finished in {time.time() - t:.0f} s")
import torch._dynamo.utils as u
print(u.compile_times(repr="str", aggregate=True))
PY
    TORCH_LOGS=recompiles,graph_breaks step 110 tk_compile.log python3 "$L/tk_compile.py" "$L/tk_compile_stacks.txt" "$L/tk_compile.json"
    note "tk+compile: rc=$? $(grep -E 'finished in' "$L/tk_compile.log")"
    grep -cE "Recompiling|Graph break" "$L/tk_compile.log" | sed 's/^/    recompiles+graph breaks: /' >> "$S"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
pack

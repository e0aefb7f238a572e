#!/usr/bin/env bash
# The extensions' bad-input tests on an H200, and nothing else:
#
#   bash tests/gpu_bindings_check.sh OUT        -> OUT/bindings.log (summary first, then each log)
#
# Each test hands bad inputs straight to an extension (past the Python checks) in a child
# process and wants a Python error naming the argument, never a crash: the layernorm and MLP
# versions died with SIGSEGV on the H200 before kernels/bindings_checks.h (kernels/NOTES.md,
# LayerNorm, "Session 2: bad-input crash fix"). One pytest per extension, all at once, so cold
# builds overlap: expected under 90 s with every extension cold (the five built in parallel in
# 57 s on the H200 before), about 20 s warm. Each pytest is cut off at 150 s. Exit status: 0 when
# every group passed.
set -u
OUT=${1:?usage: bash tests/gpu_bindings_check.sh OUT}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)      # absolute: the script moves to the repo root next
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
LOG="$OUT/bindings.log"
PARTS=$(mktemp -d)
t0=$(date +%s)

group() {   # group NAME SELECTION TEST_FILE...: one extension's bad-input tests -> $PARTS/NAME.log
    local name=$1 select=$2; shift 2
    timeout -k 5 150 python3 -m pytest -v -rsx --tb=short -p no:cacheprovider -k "$select" "$@" \
        > "$PARTS/$name.log" 2>&1
    echo "rc=$? after $(( $(date +%s) - t0 )) s" >> "$PARTS/$name.log"
}

NAMES=(layernorm mlp attention attention_hopper gemm)
group layernorm "bad_inputs" tests/test_layernorm.py &
group mlp "bad_inputs" tests/test_mlp.py &
group attention "bad_inputs" tests/test_attention.py &            # the portable kernels (tk_attention)
group attention_hopper "hopper and (bad_inputs or unsupported_inputs)" \
    tests/test_bindings_bad_inputs.py tests/test_attention_hopper.py &
group gemm "gemm and bad_inputs" tests/test_bindings_bad_inputs.py tests/test_gemm.py &
wait

{
    echo "gpu_bindings_check $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - t0 )) s in all"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')" 2>&1
    failed=0
    for n in "${NAMES[@]}"; do
        rc=$(grep -o '^rc=[0-9]*' "$PARTS/$n.log" | tail -1)
        summary=$(grep -E '(passed|failed|error|skipped|deselected).* in [0-9.]+s' "$PARTS/$n.log" | tail -1)
        echo "$n: $rc | $summary"
        # A skip (no CUDA, not sm_90) is not a pass: every selected test must have run and passed.
        [ "$rc" = "rc=0" ] && [[ "$summary" == *passed* ]] && [[ "$summary" != *skipped* ]] || failed=1
    done
    echo "verdict: $([ $failed = 0 ] && echo 'all groups passed' || echo 'FAILED (see the group logs below)')"
    for n in "${NAMES[@]}"; do echo; echo "===== $n"; cat "$PARTS/$n.log"; done
} > "$LOG"
rm -rf "$PARTS"
head -8 "$LOG"
grep -q "^verdict: all groups passed" "$LOG"

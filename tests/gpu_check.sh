#!/usr/bin/env bash
# tests/gpu_check.sh: the whole GPU check in one command, for a machine with a CUDA GPU.
# Builds the kernels, runs the GPU tests, runs compute-sanitizer (memcheck + racecheck) on the
# kernel tests, and runs bench.py; every step logs to OUTDIR (at most 7 files, so the whole
# folder comes back from a lent GPU machine), and a summary is printed last.
#
#   tests/gpu_check.sh OUTDIR [--ops layernorm,attention] [-k PYTEST_EXPR] [--quick]
#                             [--no-sanitizer] [--no-bench] [--no-tests]
#
#   --ops       which op families to build, test, sanitize and bench (default: all).
#               Tests are tests/test_<op>*.py plus tests/test_dispatch.py; all of tests/ without it.
#   -k          passed to pytest for the test step
#   --quick     bench headline shapes only, and a smaller sanitizer subset
# Environment: TORCH_EXTENSIONS_DIR (default /tmp/ext), PYTHON (default python3),
#   BENCH_ARGS (extra bench.py arguments, e.g. "--compile-modes default"),
#   SANITIZER_TOOLS (default "memcheck racecheck").
set -u -o pipefail
OUT=${1:?usage: tests/gpu_check.sh OUTDIR [--ops a,b] [-k EXPR] [--quick] [--no-sanitizer] [--no-bench] [--no-tests]}
shift
OPS=""; KEXPR=""; QUICK=""; SANITIZE=1; BENCH=1; TESTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ops) OPS="$2"; shift 2 ;;
    -k) KEXPR="$2"; shift 2 ;;
    --quick) QUICK="--quick"; shift ;;
    --no-sanitizer) SANITIZE=0; shift ;;
    --no-bench) BENCH=0; shift ;;
    --no-tests) TESTS=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
declare -a SUMMARY
step() {   # step NAME LOGFILE COMMAND...: run, log, remember the outcome
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$OUT/$log"
  "$@" 2>&1 | tee -a "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  SUMMARY+=("$(printf '%-12s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$OUT/$log")")
  return $rc
}

# Test files for the chosen ops (all of tests/ when none are chosen).
TEST_FILES="tests/"
if [ -n "$OPS" ]; then
  TEST_FILES="tests/test_dispatch.py"
  for op in ${OPS//,/ }; do TEST_FILES="$TEST_FILES $(ls tests/test_${op}*.py 2>/dev/null | tr '\n' ' ')"; done
fi

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; \
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; \
  git rev-parse HEAD 2>/dev/null; } > "$OUT/build.log" 2>&1

# 1. Build (each family's cold build time is printed) and the status table.
step build build.log $PY - "$OPS" <<'EOF'
import sys, torch, kernels
ops = [o for o in sys.argv[1].split(",") if o] or list(kernels.OPS)
failed = False
for op in ops:
    check = kernels._preflight_checks.get(op)
    reason = kernels._missing_reason(op) if check is None else check(
        batch_size=16, block_size=1024, n_embd=768, n_head=12, dtype=torch.bfloat16, device="cuda")
    print(f"{op}: {'tk available' if reason is None else 'NOT available: ' + reason}")
    failed |= reason is not None
sys.exit(1 if failed else 0)
EOF
$PY -m kernels --no-build >> "$OUT/build.log" 2>&1

# 2. GPU tests (they skip nothing here: a CUDA device is present).
if [ $TESTS = 1 ]; then
  step pytest pytest.log $PY -m pytest -q -rs $TEST_FILES ${KEXPR:+-k "$KEXPR"}
fi

# 3. Benchmarks (JSON with every figure).
if [ $BENCH = 1 ]; then
  step bench bench.log $PY bench.py ${OPS:+--ops "$OPS"} $QUICK ${BENCH_ARGS:-} --json "$OUT/bench.json"
fi

# 4. compute-sanitizer on a small subset of the kernel tests (every launch is checked, so keep
#    shapes small): memcheck (out-of-bounds, misaligned) and racecheck (shared-memory hazards).
if [ $SANITIZE = 1 ]; then
  SAN_FILES=""; SAN_K=""
  if [ -z "$OPS" ] || [[ ",$OPS," == *",layernorm,"* ]]; then
    SAN_FILES="tests/test_layernorm.py"
    if [ -n "$QUICK" ]; then SAN_K="bias_and_residual and (384-residual-bias or 1600-residual-bias)"
    else SAN_K="bias_and_residual and (7-384 or 5-1600 or 333-4096)"; fi
  fi
  if [ -n "$SAN_FILES" ]; then
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
      step "$tool" "sanitizer_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        --target-processes all $PY -m pytest -q -x -p no:cacheprovider $SAN_FILES -k "$SAN_K"
    done
  fi
fi

echo; echo "== summary (logs in $OUT)"; printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
! grep -q "rc=[1-9]" "$OUT/summary.txt"

#!/usr/bin/env bash
# One GPU call for the Hopper attention forward: SASS check, a smoke run of every variant (hard
# timeout; a variant that hangs is retried alone and then left out of the rest), the pytest suite
# through the prebuilt library, the benchmark, and the torch-extension path (built in the
# background meanwhile) on a few tests. The prebuilt library (see tests/attention_hopper_ctypes.py
# for how to build it) keeps nvcc off the critical path. Usage: tests/gpu_check_attention_hopper.sh OUT_DIR
set -u
OUT=${1:-/tmp/attention_hopper_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
LIB=$PWD/build/attention_hopper/libtk_attention_hopper.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( timeout -s KILL 170 python3 -c "from kernels import attention_hopper as a; print('jit build:', a._ext.why_not())" > "$OUT/jit_build.log" 2>&1 ) &
JIT=$!
cuobjdump --dump-sass "$LIB" | grep -oE "HGMMA\.[0-9x]+\.F32\.BF16|USETMAXREG\.[A-Z_.]+|UTMALDG\.[0-9A-Z]+|MUFU\.EX2|LDL|STL" | sort | uniq -c | tee "$OUT/sass.txt"
export TK_ATTENTION_HOPPER_LIB=$LIB
good="2 4"
if ! timeout -s KILL 40 python3 tests/attention_hopper_smoke.py 2 4 2>&1 | tee "$OUT/smoke.log"; then
  good=""
  for v in 2 4; do
    timeout -s KILL 20 python3 tests/attention_hopper_smoke.py $v >> "$OUT/smoke.log" 2>&1 && good="$good $v" || echo "SMOKE variant $v FAILED/HUNG"
  done
fi
export TK_ATTENTION_HOPPER_VARIANTS="$good"; echo "variants run: $good"
timeout -s KILL 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/test_attention_hopper.py 2>&1 | tee "$OUT/pytest.log" | tail -30
timeout -s KILL 120 python3 tests/bench_attention_hopper.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
unset TK_ATTENTION_HOPPER_LIB
wait $JIT; tail -5 "$OUT/jit_build.log"
timeout -s KILL 60 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/test_attention_hopper.py -k "default_variant or refused or packed_qkv_views or batch_head" 2>&1 | tee "$OUT/pytest_jit.log" | tail -8

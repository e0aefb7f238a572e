#!/usr/bin/env bash
# One GPU call for the Hopper attention forward: SASS check, smoke runs (each variant in its own
# process with a hard timeout, so a hung pipeline costs seconds, not the call), the pytest suite,
# the benchmark. Uses the prebuilt library (see tests/attention_hopper_ctypes.py for how to build
# it) so no nvcc runs on the GPU machine. Usage: tests/gpu_check_attention_hopper.sh OUT_DIR
set -u
OUT=${1:-/tmp/attention_hopper_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TK_ATTENTION_HOPPER_LIB=$PWD/build/attention_hopper/libtk_attention_hopper.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cuobjdump --dump-sass "$TK_ATTENTION_HOPPER_LIB" | grep -oE "HGMMA\.[0-9x]+\.F32\.BF16|USETMAXREG\.[A-Z.]+ *0x[0-9a-f]+|UTMALDG\.[0-9A-Z]+|MUFU\.EX2" | sort | uniq -c | tee "$OUT/sass.txt"
ok=1
for pp in 0 1; do
  timeout -s KILL 25 python3 tests/attention_hopper_smoke.py $pp 2>&1 | tee -a "$OUT/smoke.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "SMOKE pingpong=$pp FAILED/HUNG"; ok=0; }
done
[ $ok = 1 ] || exit 1
timeout -s KILL 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/test_attention_hopper.py 2>&1 | tee "$OUT/pytest.log" | tail -40
timeout -s KILL 90 python3 tests/bench_attention_hopper.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"

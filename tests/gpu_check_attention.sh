#!/bin/bash
# tests/gpu_check_attention.sh OUT_DIR: the whole GPU check of the portable attention kernel in
# one command: build, compute-sanitizer (memcheck, racecheck) on the torch-free harness, the
# pytest GPU tests, and the benchmark. Logs go to OUT_DIR.
set -o pipefail
OUT=${1:-/tmp/attention_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

# The torch-free harness (tests/attention_emu/main.cpp built by nvcc), beside the extension build.
ARCH=$(python -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')")
( nvcc -x cu -std=c++20 -O3 -lineinfo -I. -gencode=arch=compute_${ARCH},code=sm_${ARCH} \
    tests/attention_emu/main.cpp -o /tmp/attention_gpu_main > "$OUT/harness_build.log" 2>&1 ) &
python -c "import kernels.attention_op as A; r = A._portable.why_not(); print('build:', r or 'ok'); assert r is None" \
    2>&1 | tee "$OUT/build.log"
wait

{
  echo "== harness on the GPU (relative errors vs float64)"
  /tmp/attention_gpu_main 2 3 1000 64 1 1
  /tmp/attention_gpu_main 1 2 255 128 0 2
  echo "== compute-sanitizer memcheck"
  compute-sanitizer --tool memcheck --print-limit 5 /tmp/attention_gpu_main 1 2 130 64 1 3 | tail -3
  echo "== compute-sanitizer racecheck"
  compute-sanitizer --tool racecheck --print-limit 5 /tmp/attention_gpu_main 1 1 130 128 1 4 | tail -3
  TK_ATTENTION_FWD_VARIANT=3 TK_ATTENTION_BWD_VARIANT=1 compute-sanitizer --tool racecheck --print-limit 5 \
    /tmp/attention_gpu_main 1 1 200 64 1 4 | tail -3
  TK_ATTENTION_FWD_VARIANT=1 TK_ATTENTION_BWD_VARIANT=1 compute-sanitizer --tool memcheck --print-limit 5 \
    /tmp/attention_gpu_main 1 2 150 128 0 4 | tail -3
} 2>&1 | tee "$OUT/sanitizer.log"

python -m pytest -q -rfE tests/test_attention.py 2>&1 | tee "$OUT/pytest.log"
python bench.py --ops attention --compile-modes "" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"

#!/bin/bash
# tests/gpu_mlp_dw_gemm.sh OUT — engineer W, session 10 (final check): TK_MLP_DW_GEMM=planned (opt-in),
# the MLP backward's two weight gradients on kernels/gemm.py's step 4 variant 9 instead of the
# extension's split-K weight_grad (kernels/mlp_op.py section 1b; mlp_bindings.cpp dw_outside):
#   1. tests/test_mlp_dw_gemm.py: gradients vs float64 at M = 1, 333, 4099 (old path under the flag),
#      4112, 32752, 32768 (fp32-weight path, bf16 weights, with biases), agreement with the default
#      path, the custom op, other schedules (side=0/2, fcfast=9/4), a CUDA-graph capture + replay
#      (warmed up; first call inside the capture), which kernels ran (torch.profiler names)
#   2. the A/B: MLP fwd+bwd as GPT-2 trains it (no biases, fp32 weights under bf16 autocast), CUDA
#      graphs, M = 32768 and 16384, 9 interleaved trials, flag on vs off (tests/mlp_dw_gemm_ab.py)
#   3. the default path's own tests that the binding change touches (no-bias backward, fp32-weight
#      gradients), if time is left
# ONE H200, within 110 s (LANE_LIMIT, default 105). Results: OUT/summary.txt and OUT/logs.tgz.
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-105}
source tests/gpu_lib.sh "${1:-/tmp/mlp_dw_gemm_out}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TK_MLP_DW_GEMM
GPU=${CUDA_VISIBLE_DEVICES:-0}; GPU=${GPU%%,*}
note "gpu_mlp_dw_gemm.sh on $(nvidia-smi -i "$GPU" --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1)"

# 1. the flag's tests
step 45 tests.log python3 -m pytest -q -p no:cacheprovider -rf tests/test_mlp_dw_gemm.py
note "tests/test_mlp_dw_gemm.py: $(grep -E 'passed|failed|error|skipped' "$L/tests.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -8 | cut -c1-220 >> "$S"

# 2. the A/B (prediction in kernels/NOTES.md, session 10 W: planned/off 0.97-0.99 at 32768)
step 35 ab.log python3 tests/mlp_dw_gemm_ab.py --M 32768,16384 --trials 9 --iters 20 --settle-ms 25
{ echo "--- mlp_dw_gemm_ab (fwd+bwd, no biases, fp32 weights under autocast, CUDA graphs; us per step)"
  grep -E "^M=|^RESULT|Error|error" "$L/ab.log" | cut -c1-400; } | tee -a "$S"

# 3. the default path after the binding change
step 25 default.log python3 -m pytest -q -p no:cacheprovider -rf tests/test_mlp_dw_float.py tests/test_mlp.py \
    -k "test_fp32 or test_gradients_accumulate or test_models_with_biases or test_extension_refuses or no_bias_grads or forward_backward_vs_float64"
note "default path (test_mlp_dw_float.py, test_mlp.py no-bias / vs float64): $(grep -E 'passed|failed|error|skipped' "$L/default.log" | tail -1)"
grep -E "^FAILED|^ERROR" "$L/default.log" | head -8 | cut -c1-220 >> "$S"

note "done in $(( $(date +%s) - START )) s"
pack

#!/bin/bash
# The residual dropout fused into add_layernorm (session 4), on ONE H200, ~200 s (cold build
# included; LANE_LIMIT, default 235 s, bounds the whole script so `pack` always runs):
#   1. the shakespeare_char data (from .gpu_carry/input.txt) and the extensions train.py uses
#      (python -m kernels --build, one process each: ~30-40 s cold; tk_gemm is not needed)
#   2. pytest tests/test_layernorm_dropout.py: the kernel's mask is the numpy twin's, values and
#      gradients vs float64 with that mask, dr == dx * mask / (1 - p), fresh masks per call and per
#      CUDA-graph replay, p=0 bit-identical to no dropout, opcheck, torch.compile, bad inputs
#   3. python -m kernels.layernorm_bench --dropout: per call fwd+bwd at 16384x384, fused vs
#      tk + F.dropout vs no dropout vs PyTorch eager, same process; the kernels with/without mask
#   4. python train.py config/shakespeare.py --kernels=tk (standard evals, CUDA graphs): the
#      end-to-end wall time (session 3's final check: 40.7 s; torch 57.7 s)
#   5. what lane time is left: the no-dropout layernorm tests at the model widths (the p=0 path
#      after this session's changes to the bindings and launchers)
# Usage: bash tests/gpu_layernorm_dropout.sh OUT. Logs: OUT/logs.tgz (logs/*.log), OUT/summary.txt.
cd "$(dirname "$0")/.." || exit 1
LANE_LIMIT=${LANE_LIMIT:-235}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_dropout.sh OUT}"
status=0

setup_shakespeare
timeout 120 python3 -m kernels --build tk_layernorm tk_attention tk_attention_hopper tk_attention_hopper_bwd tk_mlp \
    tk_lm_head > "$L/build.log" 2>&1 || { note "a build FAILED: see build.log"; status=1; }
note "$(tail -1 "$L/build.log")"

step 90 pytest.log python3 -m pytest -q -rfEs --tb=short tests/test_layernorm_dropout.py || status=1
note "pytest test_layernorm_dropout: $(grep -E '(passed|failed|error)' "$L/pytest.log" | tail -1)"

step 40 bench.log python3 -m kernels.layernorm_bench --dropout --json "$OUT/ln_dropout.json" || status=1
note "bench: $(grep -E 'fused saves' "$L/bench.log" | tr -s ' ' | tr '\n' '|')"

step 80 train_tk.log python3 train.py config/shakespeare.py --kernels=tk --always_save_checkpoint=False \
    --out_dir=/tmp/o_tk || status=1
note "train tk: $(grep -E "^summary:" "$L/train_tk.log" | tail -1)"

step 60 pytest_nodrop.log python3 -m pytest -q -rfEs --tb=short tests/test_layernorm.py \
    -k "model_widths_many_rows or opcheck or mixed_call or unused_h or bad_inputs" || status=1
note "pytest test_layernorm (p=0 path): $(grep -E '(passed|failed|error)' "$L/pytest_nodrop.log" | tail -1)"

note "done, status $status"
pack
exit $status

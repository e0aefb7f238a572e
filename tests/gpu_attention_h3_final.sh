#!/usr/bin/env bash
# tests/gpu_attention_h3_final.sh OUT_DIR — session 4 (H3), the second call: the attention
# kernels AS THE DEFAULTS NOW ARE (after call 2 picked them), on ONE H200, in <= 230 s with the
# builds (TORCH_EXTENSIONS_DIR=/tmp/ext). Each step under its own limit and the lane's
# (tests/gpu_lib.sh; logs in OUT/logs, packed into OUT/logs.tgz; figures in OUT/summary.txt):
#   1 build the three attention extensions at once
#   2 a smoke run of the default forward and backward under a hard limit (a hang stops here)
#   3 the forward's tests (every variant in FWD_VARIANTS, and the default) vs float64
#   4 the backward's tests (every variant in BWD_VARIANTS, and the default) vs float64
#   5 the model's path: loss and gradients tk vs torch, torch.compile, opcheck
#   6 compute-sanitizer memcheck of the default forward + backward on small awkward shapes
#   7 bench.py --quick attention rows: tk (the defaults), tk-hopper, tk-portable, cuDNN, FA2, eager
# Checked here without a GPU: bash -n; LANE_LIMIT=60 runs every step to its failure.
set -uo pipefail
LANE_LIMIT=${LANE_LIMIT:-230}
FWD_VARIANTS=${FWD_VARIANTS:-"4 6 9"}
BWD_VARIANTS=${BWD_VARIANTS:-"2 4 5"}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_h3_final.sh OUT_DIR}"
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

step 100 build.log python3 -m kernels --build tk_attention_hopper tk_attention_hopper_bwd tk_attention \
    || note "a build FAILED (logs/build.log)"
note "$(grep -E '^build |^built' "$L/build.log" | tr '\n' ' ')"

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}

if ! step 30 smoke.log $PYT tests/test_attention_hopper.py tests/test_attention_hopper_bwd.py \
        -k "test_default_variant or test_after_the_hopper_forward"; then
    summary "SMOKE FAILED OR HUNG (the default forward / backward); stopping" smoke.log; pack; exit 1
fi
summary "smoke (defaults)" smoke.log

TK_ATTENTION_HOPPER_VARIANTS="$FWD_VARIANTS" step 50 forward_tests.log $PYT tests/test_attention_hopper.py
summary "forward tests (variants $FWD_VARIANTS + default)" forward_tests.log
TK_ATTENTION_HOPPER_BWD_VARIANTS="$BWD_VARIANTS" step 50 backward_tests.log $PYT tests/test_attention_hopper_bwd.py \
    -k "not nvcc and not bindings_parse"
summary "backward tests (variants $BWD_VARIANTS + default)" backward_tests.log
step 40 model_tests.log $PYT tests/test_attention.py -k "model_loss or torch_compile or opcheck"
summary "model loss+grads tk vs torch / torch.compile / opcheck" model_tests.log

cat > "$L/sanitize_case.py" <<'PY'
import sys, torch
sys.path.insert(0, ".")
from kernels import attention_hopper as H
for D, T, causal in ((64, 70, True), (64, 200, False), (128, 200, True), (64, 300, True)):
    qkv = torch.randn(2, T, 3, 3, D, device="cuda").bfloat16()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    o, lse = H.forward(q, k, v, causal, D ** -0.5)
    dqkv = torch.empty_like(qkv)
    H.backward(torch.randn_like(o), q, k, v, o, lse, causal, D ** -0.5, out=tuple(dqkv.permute(2, 0, 3, 1, 4).unbind(0)))
torch.cuda.synchronize(); print("sanitize case ran")
PY
step 45 memcheck.log compute-sanitizer --tool memcheck python3 "$L/sanitize_case.py"
note "memcheck: $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck.log" | tr '\n' ' ')"

TK_BENCH_ATTENTION_IMPLS=tk,tk-hopper,tk-portable,eager,sdpa-cudnn,sdpa-flash \
    step 60 bench.log python3 bench.py --ops attention --quick --compile-modes "" --reps 20 --warmup 3 \
    --json "$L/attention.json"
python3 -m kernels.attention_bench "$L/attention.json" > "$L/bench_tflops.txt" 2>&1
grep -E "^fwd|^    (tk|sdpa)|targets|>=" "$L/bench_tflops.txt" | head -50 | while read -r line; do note "$line"; done
pack

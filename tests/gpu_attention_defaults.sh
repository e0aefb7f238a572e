#!/usr/bin/env bash
# tests/gpu_attention_defaults.sh OUT_DIR — the attention kernels with their defaults (whatever the
# .cu files' DEFAULT_* say: since session 8 Hopper forward 37, backward 15 / 5 for D = 64 / 128,
# portable forward 9 for D = 64; when written, forward 12 / 11, backward 4 / 5, portable 3) and the
# dynamically scheduled forward variants 11-13, on ONE H200, in <= 230 s with the builds
# (TORCH_EXTENSIONS_DIR=/tmp/ext). Session 4's call 3 ran it when the forward defaults were still
# 8 / 5 (kernels/NOTES.md, H3 section); the smoke and memcheck steps test whatever the defaults
# are. Each step under
# its own limit and the lane's (tests/gpu_lib.sh; logs in OUT/logs, packed into OUT/logs.tgz;
# figures in OUT/summary.txt):
#   1 build the three attention extensions at once
#   2 smoke: the default forward and backward, then variants 11-13 (one process), each under a
#     hard limit (a hang of the defaults stops the script; of 11-13, drops them)
#   3 the forward's tests vs float64: the defaults, 5, 8 and the new variants that passed
#   4 the backward's tests vs float64: the defaults and variants 4, 5
#   5 bench.py attention rows (gpt2, shakespeare-char, t4096-d128; fwd, fwd+bwd): tk (the
#     defaults), the forward variants one by one, tk-portable, eager, cuDNN, FA2
#   6 tests/test_attention.py: the portable kernel (its new default forward), the model's loss and
#     gradients tk vs torch, torch.compile, opcheck
#   7 compute-sanitizer memcheck of the default forward + backward on small awkward shapes
# Checked here without a GPU: bash -n; LANE_LIMIT=60 runs every step to its failure.
set -uo pipefail
LANE_LIMIT=${LANE_LIMIT:-230}
source tests/gpu_lib.sh "${1:?usage: tests/gpu_attention_defaults.sh OUT_DIR}"
PYT="python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

step 100 build.log python3 -m kernels --build tk_attention_hopper tk_attention_hopper_bwd tk_attention \
    || note "a build FAILED (logs/build.log)"
note "$(grep -E '^build |^built' "$L/build.log" | tr '\n' ' ')"

summary() {   # pytest's last line and its FAILED lines into the summary
    note "$1: $(grep -E 'passed|failed|skipped|rc=' "$L/$2" | tail -2 | tr '\n' ' ')"
    grep -E "^FAILED" "$L/$2" | head -12 | while read -r line; do note "  $line"; done
}
passed() { grep -q " passed" "$L/$1" && ! grep -qE " failed|^FAILED" "$L/$1"; }

if ! step 30 smoke.log $PYT tests/test_attention_hopper.py tests/test_attention_hopper_bwd.py \
        -k "test_default_variant or test_after_the_hopper_forward" || ! passed smoke.log; then
    summary "SMOKE FAILED OR HUNG (the default forward / backward); stopping" smoke.log; pack; exit 1
fi
summary "smoke (defaults)" smoke.log
NEW=""
if TK_ATTENTION_HOPPER_VARIANTS="11 12 13" step 25 smoke_dynamic.log $PYT tests/test_attention_hopper.py \
        -k "test_causal and 1000" && passed smoke_dynamic.log; then NEW="11 12 13"; fi
summary "smoke of variants 11-13 (dynamic scheduling)" smoke_dynamic.log

TK_ATTENTION_HOPPER_VARIANTS="5 8 $NEW" step 40 forward_tests.log $PYT tests/test_attention_hopper.py
summary "forward tests (variants 5 8 $NEW + default)" forward_tests.log
TK_ATTENTION_HOPPER_BWD_VARIANTS="4 5" step 50 backward_tests.log $PYT tests/test_attention_hopper_bwd.py \
    -k "not nvcc and not bindings_parse"
summary "backward tests (variants 4 5 + default)" backward_tests.log

IMPLS="tk,tk-hopper-v2,tk-hopper-v5,tk-hopper-v8"
for v in $NEW; do IMPLS="$IMPLS,tk-hopper-v$v"; done
TK_BENCH_ATTENTION_SHAPES=gpt2,shakespeare-char,t4096-d128 TK_BENCH_ATTENTION_IMPLS="$IMPLS,tk-portable,eager,sdpa-cudnn,sdpa-flash" \
    step 70 bench.log python3 bench.py --ops attention --compile-modes "" --reps 20 --warmup 3 --json "$L/attention.json"
python3 -m kernels.attention_bench "$L/attention.json" > "$L/bench_tflops.txt" 2>&1
grep -E "^fwd|^    (tk|sdpa)|MISMATCH|targets|>=" "$L/bench_tflops.txt" | head -64 | while read -r line; do note "$line"; done

step 45 attention_tests.log $PYT tests/test_attention.py
summary "tests/test_attention.py (portable, model tk vs torch, compile, opcheck)" attention_tests.log

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
pack

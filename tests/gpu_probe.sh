#!/usr/bin/env bash
# A session's first look, on a TWO-GPU machine (kind nvidia-h200-x2), ~7 min. Written at the end of
# session 4 for session 5's first call (kernels/NOTES.md, "Next session", items 1-3):
#
#   bash tests/gpu_probe.sh OUT
#
#   both:   every tk extension builds (in parallel)
#   GPU 0:  every test in tests/ (12 workers, -v and -rf: a run cut by its limit still names its
#           failures): the reviewers' test and host-code changes after session 4's final call,
#           never run on a GPU, are among them
#   GPU 1:  bench.py --profile of the GPT-2 tk step with session 4's attention defaults (never
#           profiled in the step); ncu with stall sampling (WarpStateStats, SourceCounters) of
#           the Hopper attention forward at the GPT-2 shape (latency-bound, cause unknown) and of
#           the MLP's dGELU GEMM at M=16384 (1.3x c_fc's time, cause unknown); compute-sanitizer
#           memcheck and racecheck of the attention defaults (forward 12 / 11, backward 4 / 5),
#           which no sanitizer has run on
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 420).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_probe.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
LANE_LIMIT=${LANE_LIMIT:-420}
source tests/gpu_lib.sh "$1"
note "gpu_probe"
setup_shakespeare
prebuild_all

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    step 400 pytest.log python3 -m pytest -v -rf -n 12 -p no:cacheprovider tests/
    note "pytest: $(grep -cE ' PASSED' "$L/pytest.log") passed, $(grep -cE ' FAILED' "$L/pytest.log") failed; $(grep -E '^=+ .*(passed|failed)' "$L/pytest.log" | tail -1)"
    grep -E " FAILED|^ERROR|^FAILED" "$L/pytest.log" | sort -u | head -30 | tee -a "$S"
}

# The calls the profilers look at: small scripts, so that ncu and compute-sanitizer see only them.
write_cases() {
    cat > "$L/attention_case.py" <<'PY'
import sys, torch
sys.path.insert(0, ".")
from kernels import attention_hopper as H
shapes = {"gpt2": [(16, 1024, 12, 64)], "small": [(2, 70, 3, 64), (2, 300, 3, 64), (2, 200, 3, 128)]}[sys.argv[1]]
for B, T, nh, D in shapes:
    qkv = torch.randn(B, T, 3, nh, D, device="cuda").bfloat16()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    o, lse = H.forward(q, k, v, True, D ** -0.5)            # the default variant for D
    if sys.argv[1] == "small":
        dqkv = torch.empty_like(qkv)
        H.backward(torch.randn_like(o), q, k, v, o, lse, True, D ** -0.5,
                   out=tuple(dqkv.permute(2, 0, 3, 1, 4).unbind(0)))
torch.cuda.synchronize()
print("attention case ran", sys.argv[1])
PY
    cat > "$L/dgelu_case.py" <<'PY'
import sys, torch
sys.path.insert(0, ".")
from kernels import mlp_op
r = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)
M, C = 16384, 768
x, w1, b1, w2, b2, dy = r(M, C), r(4 * C, C) * 0.03, r(4 * C), r(C, 4 * C) * 0.02, r(C), r(M, C)
y, pre, h = mlp_op.mlp_fwd(x, w1, b1, w2, b2)
mlp_op.mlp_bwd(dy, x, pre, h, w1, w2)                      # the default schedule's dGELU GEMM
torch.cuda.synchronize()
print("dgelu case ran")
PY
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    write_cases
    step 90 profile_gpt2.log python3 bench.py --profile --models gpt2 --kernels tk --profile-rows 40 --json "$L/profile_gpt2.json"
    note "gpt2 tk profile: $(grep -E '^GPU kernels' "$L/profile_gpt2.log" | head -1)"
    local sections="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy"
    step 70 ncu_attention.log ncu $sections -k "regex:persistent_kernel|forward_kernel" --launch-count 1 \
        python3 "$L/attention_case.py" gpt2
    grep -E "Duration|Stall|Warp Cycles|Issue Slots|Compute \(SM\)|ERR" "$L/ncu_attention.log" | head -40 > "$L/ncu_attention_summary.txt"
    note "ncu attention forward: $(grep -E 'Duration' "$L/ncu_attention.log" | head -1 | tr -s ' ')"
    step 70 ncu_dgelu.log ncu $sections -k "regex:dgelu" --launch-count 1 python3 "$L/dgelu_case.py"
    grep -E "Duration|Stall|Warp Cycles|Issue Slots|Compute \(SM\)|ERR" "$L/ncu_dgelu.log" | head -40 > "$L/ncu_dgelu_summary.txt"
    note "ncu dGELU: $(grep -E 'Duration' "$L/ncu_dgelu.log" | head -1 | tr -s ' ')"
    for tool in memcheck racecheck; do
        step 60 sanitizer_$tool.log compute-sanitizer --tool $tool python3 "$L/attention_case.py" small
        note "attention $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|case ran' "$L/sanitizer_$tool.log" | tr '\n' ' ')"
    done
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
pack

#!/usr/bin/env bash
# Every kernel's GPU tests plus the op, attention and e2e benches, in one call on a TWO-GPU
# machine (kind nvidia-h200-x2); the check to run after a kernel change. Logs in OUT/logs, packed
# into OUT/logs.tgz; headlines in OUT/summary.txt.
#
#   bash tests/gpu_validate.sh OUT
#
#   both:   every tk extension builds (in parallel) before anything else
#   GPU 0:  pytest of every GPU test file (4 workers), then config/shakespeare.py on tk (its
#           config turns CUDA graphs on; standard evals), then the GEMM step-5 (ping-pong) check
#   GPU 1:  bench.py --ops layernorm,mlp --quick; tests/gpu_attention_bench.sh; bench.py --e2e
#           (shakespeare-char: torch+graphs, tk+graphs; gpt2: torch, tk, tk+compile); a profile
#           of one tk GPT-2 step
#           and tests/gpu_layernorm_check.sh (casts + kernel vs the mixed-dtype kernel)
# Needs .gpu_carry/input.txt (or data/shakespeare_char/input.txt). LANE_LIMIT (s, default 480).
# SKIP="gemm5 attention ..." leaves parts out (gemm5, shakespeare, ops, layernorm, attention, e2e,
# profile). PYTEST_FILES="tests/a.py tests/b.py" replaces lane 0's list of test files.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_validate.sh OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
source tests/gpu_lib.sh "$1"
SKIP=" ${SKIP:-} "
want() { [[ "$SKIP" != *" $1 "* ]]; }
note "gpu_validate"
setup_shakespeare
CUDA_VISIBLE_DEVICES=1 prebuild_all

lane0() {
    export CUDA_VISIBLE_DEVICES=0
    local files=(tests/test_input_checks.py tests/test_fast_path.py tests/test_layernorm.py tests/test_layernorm_model.py
                 tests/test_mlp.py tests/test_attention.py tests/test_attention_hopper.py tests/test_gemm.py
                 tests/test_train.py tests/test_bindings_bad_inputs.py tests/test_model.py tests/test_linear.py)
    [ -n "${PYTEST_FILES:-}" ] && read -r -a files <<< "$PYTEST_FILES"   # override: a space-separated list
    local have=(); for f in "${files[@]}"; do [ -f "$f" ] && have+=("$f"); done
    step 200 pytest.log python3 -m pytest -q -n 4 -p no:cacheprovider "${have[@]}"
    note "pytest: $(grep -E 'passed|failed|error' "$L/pytest.log" | tail -1)"
    grep -E "^(FAILED|ERROR)" "$L/pytest.log" | head -20 | tee -a "$S"
    want shakespeare && step 100 shk_tk.log python3 train.py config/shakespeare.py --always_save_checkpoint=False --out_dir=/tmp/o_tk
    note "shakespeare tk: $(grep -E '^(summary|error|cuda_graphs)' "$L/shk_tk.log" | tr '\n' ' ')"
    want gemm5 || return 0
    step 30 gemm5.log python3 -c "
import torch; from kernels import gemm
x = torch.randn(1000, 768, device='cuda', dtype=torch.bfloat16); W = torch.randn(3072, 768, device='cuda', dtype=torch.bfloat16)
c = gemm.matmul(x, W.t(), step=5, out_dtype=torch.float32); torch.cuda.synchronize()
ref = x.float() @ W.float().t(); print('smoke step 5 rel err', ((c - ref).norm() / ref.norm()).item())"
    if grep -q "smoke step 5" "$L/gemm5.log"; then
        step 90 gemm5.log env TK_GEMM_STEP5=1 python3 -m pytest -q --maxfail=4 --tb=short -k step5 tests/test_gemm.py
        step 120 gemm5.log python3 -m kernels.gemm_bench --steps 4,5
    fi
    note "gemm step 5: $(grep -E 'smoke step 5|passed|failed' "$L/gemm5.log" | tr '\n' ' ')"
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    want ops && step 90 bench_ops.log python3 bench.py --ops layernorm,mlp --quick --compile-modes "" --json "$L/ops.json"
    note "op bench rc=$?"
    want layernorm && step 150 layernorm_check.log bash tests/gpu_layernorm_check.sh "$L/layernorm"
    want layernorm && note "layernorm check rc=$?"
    want attention && step 150 attention_bench.log bash tests/gpu_attention_bench.sh "$L/attention"
    want attention && note "attention bench rc=$?"
    want e2e && step 90 e2e.log python3 bench.py --e2e --models shakespeare-char --variants torch+graphs,tk+graphs \
        --compile-modes default --reps 30 --warmup 8 --e2e-timeout 60 --json "$L/e2e_shk.json"
    want e2e && step 150 e2e.log python3 bench.py --e2e --models gpt2 --variants torch,tk,tk+compile \
        --compile-modes default --reps 20 --warmup 6 --e2e-timeout 100 --json "$L/e2e_gpt2.json"
    want profile && step 50 profile.log python3 bench.py --profile --models gpt2 --kernels tk --warmup 4 --profile-steps 3 \
        --json "$L/prof.json"
    note "lane 1 done"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
grep -hE "^(shakespeare-char|gpt2) " "$L"/e2e.log >> "$S" 2>/dev/null
grep -A12 "^GPU kernels" "$L"/prof_profile_gpt2_tk.txt >> "$S" 2>/dev/null
pack

#!/usr/bin/env bash
# The closing check of a session on a TWO-GPU machine (kind nvidia-h200-x2), sized for ~8 min:
#
#   bash tests/gpu_final_check.sh OUT ["GPU0 SCRIPT:SECONDS ..."] ["GPU1 SCRIPT:SECONDS ..."]
#
#   both:   every tk extension builds (in parallel)
#   GPU 0:  the engineers' closing scripts of the second argument (each run as
#           `bash SCRIPT OUT/logs/<name>` with its own limit); bench.py's attention rows and the check
#           of issue 5's targets on them (ATTN_BENCH=0 leaves it out), after compute-sanitizer runs of
#           the attention defaults (SANITIZE=0 leaves them and the MLP's out); then the GPU tests of the model,
#           training, layernorm, lm_head, the switch, attention, the MLP, the GEMM, the linear op and
#           the input checks (PYTEST_FILES to choose, PYTEST_SECONDS, default 150);
#           SHK=1 first runs config/shakespeare.py with its standard evals, --kernels=torch then tk,
#           back to back (issue 7's shakespeare comparison; ~200 s more)
#   GPU 1:  tests/gpu_loss_curves.sh (500 iterations of GPT-2 124M, torch then tk); the GEMM bench
#           (issue 3: eager, CUDA-graph and kernel-alone timing against torch.matmul; GEMM_BENCH=0
#           leaves it out); memcheck of the MLP's default; the GPU test files of PYTEST_FILES1 (a
#           second half of the suite); then the closing scripts of the third argument
#   then:   bench.py --e2e on GPT-2 124M (issue 7's comparison) on GPU 0 of an otherwise idle
#           machine: torch.compile (default mode), tk, tk with CUDA graphs (E2E_VARIANTS to choose;
#           E2E_MODELS=gpt2,shakespeare-char adds the small model).
#           Session 4's final ran it
#           beside the other lane's tests: the eager tk path launches ~660 kernels per step from
#           Python, and with the host's CPUs shared its steps ranged 59-78 ms (median 61.7) where
#           the profile's GPU span was ~58 ms. DDP=1 adds the DDP run and its one-GPU baseline.
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 310;
# SHK=1 adds 200; the part after the lanes gets E2E_SECONDS (140) + 10 more, and 80 with DDP=1).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/gpu_final_check.sh OUT [\"GPU0 SCRIPT:SECONDS ...\"] [\"GPU1 SCRIPT:SECONDS ...\"]" >&2; exit 2; }
cd "$(dirname "$0")/.."
[ "${SHK:-0}" = 1 ] && LANE_LIMIT=${LANE_LIMIT:-510}
LANE_LIMIT=${LANE_LIMIT:-310}
source tests/gpu_lib.sh "$1"
SCRIPTS0=${2:-}
SCRIPTS1=${3:-}
note "gpu_final_check"
setup_shakespeare
prebuild_all
G2="config/gpt2.py --dataset=synthetic --batch_size=32 --gradient_accumulation_steps=1 --max_iters=60
    --eval_interval=100000 --eval_iters=1 --log_interval=10 --compile=False --kernels=tk --out_dir=/tmp/o_gpt2"


lane0() {
    export CUDA_VISIBLE_DEVICES=0
    if [ "${SHK:-0}" = 1 ]; then
        for k in torch tk; do
            step 100 shk_$k.log python3 train.py config/shakespeare.py --kernels=$k --always_save_checkpoint=False --out_dir=/tmp/o_$k
            note "shakespeare $k: $(grep -E '^(summary|cuda_graphs|error)' "$L/shk_$k.log" | tr '\n' ' ')"
        done
    fi
    run_items "$SCRIPTS0"
    # the attention defaults under compute-sanitizer (SANITIZE=0 leaves it out): racecheck of the
    # forward with more work items than SMs and of the small fwd+bwd cases, memcheck of the latter
    if [ "${SANITIZE:-1}" = 1 ]; then
        step 35 racecheck_attention.log compute-sanitizer --tool racecheck python3 tests/attention_sanitize_case.py all 0
        note "racecheck, attention defaults: $(grep -E 'RACECHECK SUMMARY' "$L/racecheck_attention.log" | tr '\n' ' ')"
        step 25 memcheck_attention.log compute-sanitizer --tool memcheck python3 tests/attention_sanitize_case.py small
        note "memcheck, attention defaults: $(grep -E 'ERROR SUMMARY' "$L/memcheck_attention.log" | tr '\n' ' ')"
    fi
    # issue 5's criteria in one bench run: bench.py's attention rows (tk, the Hopper forward, the
    # portable kernel, SDPA's backends), then kernels.attention_bench's check of every target
    if [ "${ATTN_BENCH:-1}" = 1 ]; then
        step 60 attention_bench.log python3 bench.py --ops attention --compile-modes "" --reps 20 --warmup 3 \
            --json "$L/attention.json"
        step 15 attention_targets.log python3 -m kernels.attention_bench "$L/attention.json"
        grep -E "met|measured" "$L/attention_targets.log" | tee -a "$S"
    fi
    local files=${PYTEST_FILES:-"tests/test_model.py tests/test_train.py tests/test_layernorm.py tests/test_layernorm_model.py
        tests/test_layernorm_dropout.py tests/test_lm_head.py tests/test_dispatch.py tests/test_sample.py tests/test_attention.py
        tests/test_attention_hopper.py tests/test_attention_hopper_bwd.py tests/test_input_checks.py tests/test_mlp.py
        tests/test_gemm.py tests/test_gemm_plan.py tests/test_gemm_splitk.py tests/test_linear.py
        tests/test_layernorm_variants.py tests/test_gemm_schedule.py"}
    step ${PYTEST_SECONDS:-150} pytest.log python3 -m pytest -v -n ${PYTEST_WORKERS:-8} -p no:cacheprovider $files
    local rc=$?   # 124: the step's time ran out, so the counts below miss the tests that never finished
    note "pytest: $(grep -cE ' PASSED' "$L/pytest.log") passed, $(grep -cE ' FAILED' "$L/pytest.log") failed" \
         "of $(grep -oE '[0-9]+ items' "$L/pytest.log" | head -1), status $rc$([ $rc = 124 ] && echo ' (TIMED OUT)');" \
         "$(grep -E '^=+ .*(passed|failed)' "$L/pytest.log" | tail -1)"
    grep -E " FAILED|^ERROR" "$L/pytest.log" | sort -u | head -20 | tee -a "$S"
}

lane1() {
    export CUDA_VISIBLE_DEVICES=1
    step 170 curves.log bash tests/gpu_loss_curves.sh "$L/curves" --timeout 160
    note "loss curves: $(grep -iE 'verdict|PASS|FAIL' "$L/curves/summary.txt" 2>/dev/null | tail -2 | tr '\n' ' ')"
    # issue 3's table: tk GEMM vs torch.matmul, launched from Python, replayed from CUDA graphs, and
    # the tk kernel alone (engineer G, session 5)
    [ "${GEMM_BENCH:-1}" = 1 ] && step 45 gemm_bench.log python3 -m kernels.gemm_bench --steps 0,4 --modes eager,graph,kernel --host --trials 5 \
        --json "$L/gemm_bench.json"
    [ -f "$L/gemm_bench.log" ] && grep -E "x$|graph - kernel" "$L/gemm_bench.log" | tail -12 | tee -a "$S"
    if [ "${SANITIZE:-1}" = 1 ]; then   # the MLP's default schedule under memcheck
        step 25 memcheck_mlp.log compute-sanitizer --tool memcheck --print-limit 5 python3 tests/mlp_sanitize_case.py 0 2
        note "memcheck, MLP default: $(grep -E 'ERROR SUMMARY|sanitize case ran' "$L/memcheck_mlp.log" | tr '\n' ' ')"
    fi
    # PYTEST_FILES1: a second group of GPU test files here, after the curves (8 workers,
    # PYTEST_SECONDS1, default 120), so that the two lanes share a full run of the suite
    if [ -n "${PYTEST_FILES1:-}" ]; then
        step ${PYTEST_SECONDS1:-120} pytest1.log python3 -m pytest -v -n 8 -p no:cacheprovider $PYTEST_FILES1
        local rc=$?
        note "pytest (GPU 1): $(grep -cE ' PASSED' "$L/pytest1.log") passed, $(grep -cE ' FAILED' "$L/pytest1.log") failed" \
             "of $(grep -oE '[0-9]+ items' "$L/pytest1.log" | head -1), status $rc$([ $rc = 124 ] && echo ' (TIMED OUT)');" \
             "$(grep -E '^=+ .*(passed|failed)' "$L/pytest1.log" | tail -1)"
        grep -E " FAILED|^ERROR" "$L/pytest1.log" | sort -u | head -20 | tee -a "$S"
    fi
    run_items "$SCRIPTS1"
}

lane0 & P0=$!
lane1 & P1=$!
wait $P0 $P1
LIMIT=$((LIMIT + ${E2E_SECONDS:-140} + 10))   # the part after the lanes
CUDA_VISIBLE_DEVICES=0 step ${E2E_SECONDS:-140} e2e_gpt2.log python3 bench.py --e2e --models ${E2E_MODELS:-gpt2} --variants ${E2E_VARIANTS:-torch+compile,tk,tk+graphs} \
    --compile-modes default --json "$L/e2e_gpt2.json"
note "e2e: $(grep -E '^  [a-z0-9-]+ .*ms/step' "$L/e2e_gpt2.log" | tr '\n' ' ')"
if [ "${DDP:-0}" = 1 ]; then
    LIMIT=$((LIMIT + 80))
    CUDA_VISIBLE_DEVICES=0 step 40 gpt2_1gpu.log python3 train.py $G2
    note "gpt2 tk, one GPU: $(grep -E '^summary' "$L/gpt2_1gpu.log")"
    step 40 ddp.log python3 -m torch.distributed.run --standalone --nproc_per_node=2 train.py $G2 --gradient_accumulation_steps=2
    note "ddp tk: $(grep -E '^(summary|device)' "$L/ddp.log" | tr '\n' ' ')"
fi
pack


#!/usr/bin/env bash
# tests/gpu_loss_curves_bisect.sh OUT — which session-8 default moved the tk path's loss curve?
# (lead, end of session 8; NOT yet run). Session 8's final check (kernels/NOTES.md, "Session 8
# (lead)") measured the 500-iteration GPT-2 loss curves at 1.371% apart (tolerance 1%): from
# iteration ~250 on, tk's 10-iteration running mean sat 0.65% above torch's, where sessions 3-7's
# finals sat 0.11-0.39% above it (max 0.46-0.61%). The two new defaults on GPT-2's training path
# that change arithmetic: the MLP's fcfast=5 (c_fc saves gelu'(pre) in bf16 for the backward) and
# the Hopper attention forward's variant 37 (a stale running max, P double-buffered). The
# backward's dQ atomics make the tk path nondeterministic, so one curve is one draw: run A measures
# the spread. On a TWO-GPU machine (one path per GPU), ~6 min:
#   A  the defaults again (the spread between two draws of the same tree)
#   B  TK_MLP_SCHEDULE=fcfast=4 (session 7's MLP numerics)
#   C  TK_ATTENTION_HOPPER_FWD_VARIANT=30 (session 7's attention forward)
# Each: tests/loss_curves.py --paths torch,auto --gpu-per-path, 500 iterations, as gpu_loss_curves.sh.
# Reading: if B (or C) sits back at 0.1-0.4% while A repeats ~0.65%, that default moved it.
set -uo pipefail
OUT=${1:?usage: bash tests/gpu_loss_curves_bisect.sh OUT}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
S="$OUT/summary.txt"
for run in A B C; do
    case $run in
        A) envs=() ;;
        B) envs=(TK_MLP_SCHEDULE=fcfast=4) ;;
        C) envs=(TK_ATTENTION_HOPPER_FWD_VARIANT=30) ;;
    esac
    echo "[$(date -u +%T)] run $run: ${envs[*]:-defaults}" | tee -a "$S"
    env "${envs[@]}" bash tests/gpu_loss_curves.sh "$OUT/$run" > "$OUT/$run.log" 2>&1
    grep -E "PASS|FAIL" "$OUT/$run/summary.txt" | tail -1 | tee -a "$S"
done

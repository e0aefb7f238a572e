#!/bin/bash
# tests/gpu_layernorm_s5.sh OUT — session 5, engineer L (issue 4: residual + LayerNorm fwd+bwd
# >= 3x torch eager at 16384x768), the closing run on ONE H200 within 60 s (LANE_LIMIT, default
# 55 s, bounds every step so that `pack` always runs):
#   1. build tk_layernorm (python -m kernels --build; ~10-20 s, or a cached load)      -> build.log
#   2. python -m kernels.layernorm_bench --s5: fwd, fwd+bwd (and bwd = the difference) at
#      16384x768 and 32768x768 bf16, the default plan (session 5 also timed default,bwd_reverse: the default since session 6),
#      PyTorch eager and torch.compile in the same process; then the kernels alone at the bench,
#      GPT-2 and shakespeare shapes                                                    -> bench.log
# Calls 2 and 3 of session 5 ran earlier versions of this script (in git history) with the opt-in
# kernels that lost (cp.async rows ahead, dw/db sums in shared memory), ncu and the sanitizers;
# kernels/NOTES.md, "Session 5: L", has what they showed.
# Results: OUT/summary.txt (compact) and OUT/logs.tgz (every log).
cd "$(dirname "$0")/.." || exit 1
export LANE_LIMIT=${LANE_LIMIT:-55}
source tests/gpu_lib.sh "${1:?usage: bash tests/gpu_layernorm_s5.sh OUT}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
note "gpu_layernorm_s5.sh on $(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- kernels tests 2>/dev/null || echo ' (dirty)')"

step 30 build.log python3 -m kernels --build tk_layernorm || { note "build FAILED: see build.log"; status=1; }
note "$(grep -E '^build|^built|tk_layernorm' "$L/build.log" | tail -2 | tr '\n' ' ')"

step 40 bench.log python3 -m kernels.layernorm_bench --s5 --reps 30 --json "$L/s5.json" || status=1
sed -n '/^--s5/,$p' "$L/bench.log" | head -30 >> "$S"

note "done, status $status"
pack
exit $status

#!/usr/bin/env bash
# bench.py's attention rows on one H200 (issue 5): tk as model.py dispatches it (Hopper forward +
# Hopper backward on sm_90), the Hopper forward alone, the portable kernel, and SDPA forced to
# FA2, cuDNN and memory-efficient; causal bf16, fwd and fwd+bwd, at 5 shapes (the issue's 3 and
# T=2048 at D 64/128). See kernels/attention_bench.py for what is measured.
#
#   bash tests/gpu_attention_bench.sh OUT       (one GPU; ~40-60 s warm, estimate, never run yet,
#                                                plus ~30-45 s to build the two attention
#                                                extensions in parallel when /tmp/ext is cold)
# OUT/ gets:
#   build.log            GPU, commit, the two extension builds and their time
#   bench.log            bench.py's log: skipped backends with reasons, both timing tables
#   attention.json       every figure (bench.py's JSON), attention_ops.png (bench.py's op table)
#   ratios.txt           TFLOP/s per implementation, x sdpa-cudnn, x best SDPA backend, per row
#   attention_tflops.png the same as bars
# One failing implementation is recorded in its row (bench.py's "errors") and the rest run on. If
# the whole run dies or hangs (a CUDA fault ends the process), each shape is rerun in its own
# process (attention_<shape>.json, bench_<shape>.log) so one bad row cannot hide the others; that
# fallback adds up to 5 x 60 s.
set -u
OUT=${1:?usage: bash tests/gpu_attention_bench.sh OUT}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)   # absolute: the script moves to the repo root next
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
SHAPES="gpt2 shakespeare-char t4096-d128 t2048-d64 t2048-d128"   # kernels/attention_bench.py's SHAPES
BENCH=(python3 bench.py --ops attention --compile-modes "")        # no torch.compile rows: same kernels

{ date -u; git rev-parse --short HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/build.log" 2>&1

# Build the portable and the Hopper extension first, side by side, so no row's warm-up pays for
# nvcc. A failed build only shows up as skipped tk rows (with the build's reason).
timeout -k 10 240 python3 -m kernels --build tk_attention tk_attention_hopper >> "$OUT/build.log" 2>&1
tail -3 "$OUT/build.log"

t0=$(date +%s)
timeout -k 10 180 "${BENCH[@]}" --json "$OUT/attention.json" > "$OUT/bench.log" 2>&1
rc=$?
echo "bench.py rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/bench.log"
JSONS=("$OUT/attention.json")
# A CUDA fault inside one implementation is caught and recorded, but leaves the GPU unusable for
# the rest of that process: every later row would only record errors. Rerun per shape then too.
if grep -q "CUDA error" "$OUT/attention.json" 2>/dev/null; then
    echo "a CUDA error is recorded in attention.json" | tee -a "$OUT/bench.log"; rc=99
fi
if [ $rc -ne 0 ] || [ ! -s "$OUT/attention.json" ]; then
    echo "the single run failed: one process per shape" | tee -a "$OUT/bench.log"
    JSONS=()
    for shape in $SHAPES; do
        TK_BENCH_ATTENTION_SHAPES=$shape timeout -k 10 60 "${BENCH[@]}" --json "$OUT/attention_$shape.json" \
            > "$OUT/bench_$shape.log" 2>&1
        echo "$shape rc=$?" | tee -a "$OUT/bench.log"
        [ -s "$OUT/attention_$shape.json" ] && JSONS+=("$OUT/attention_$shape.json")
    done
fi
if [ ${#JSONS[@]} -gt 0 ]; then
    python3 -m kernels.attention_bench "${JSONS[@]}" --png "$OUT/attention_tflops.png" > "$OUT/ratios.txt" 2>&1
    cat "$OUT/ratios.txt"
else
    echo "no JSON written: see $OUT/bench*.log"; tail -20 "$OUT/bench.log"
fi

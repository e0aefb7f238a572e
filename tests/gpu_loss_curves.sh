#!/usr/bin/env bash
# The tk-vs-torch loss curves on the H200 (issue 7: "training losses agree within 1%, 10-iteration
# running means, over the first 500 iterations of GPT-2 124M").
#
#   bash tests/gpu_loss_curves.sh OUT [more loss_curves.py flags, which win over the ones below]
#
# GPT-2 124M (12/12/768, block 1024, batch 32, no accumulation, dropout 0, seed 1337) on
# shakespeare_char (vocab 65: the machine has no GPT-2 BPE files), 500 iterations per path,
# --kernels=torch and --kernels=auto (tk where it can run; the JSON and the verdict say what each
# op really ran on, and flag any op that fell back to torch: auto rather than tk so that one
# refused op is reported instead of ending the run). With two GPUs the paths run at once, one GPU
# each; with one, back to back (torch first, while the tk extensions build).
# Writes OUT/loss_curves.{json,png}, OUT/torch.log, OUT/auto.log, OUT/summary.txt (build lines too).
# Expected: ~2 min on two GPUs (torch ~1 min; tk waits 25-45 s, up to ~60 s, for the cold builds,
# then ~1 min of training), ~2.5 min on one; the timeouts below stop it by 7 min at the worst.
# Warm builds (TORCH_EXTENSIONS_DIR already holding them) take ~1 s each.
# Needs the Tiny Shakespeare text at .gpu_carry/input.txt (or data/shakespeare_char/input.txt).
set -uo pipefail
OUT=${1:?usage: bash tests/gpu_loss_curves.sh OUT}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
S="$OUT/summary.txt"
echo "[$(date -u +%T)] gpu_loss_curves $(git rev-parse --short HEAD 2>/dev/null)" | tee -a "$S"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$S"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$S"

# The tk families the training step uses, built side by side in the background (one family at a
# time inside the tk run would cost their sum). The tk run's first call on a family waits on
# kernels/build.py's flock while one of these builds it, then loads it warm.
(timeout 240 python3 -m kernels --build tk_layernorm tk_attention tk_attention_hopper tk_mlp >> "$S" 2>&1) &

TEXT=.gpu_carry/input.txt
[ -f "$TEXT" ] || TEXT=data/shakespeare_char/input.txt
timeout 420 python3 tests/loss_curves.py --out "$OUT" --text "$TEXT" --iters 500 \
    --paths torch,auto --gpu-per-path --timeout 400 "${@:2}" 2>&1 | tee -a "$S"
echo "[$(date -u +%T)] rc=${PIPESTATUS[0]}" | tee -a "$S"
wait

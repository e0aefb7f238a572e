#!/usr/bin/env bash
# A/B of one environment setting on the whole GPT-2 training step, on ONE GPU:
#
#   E2E_AB="TK_MLP_DW_FLOAT=0" bash tests/gpu_e2e_env_ab.sh OUT
#
# Runs `bench.py --e2e --models gpt2 --variants tk` ROUNDS times (default 2) with the setting and
# ROUNDS times without, alternating (A B A B ...: the GPU's clocks drift over minutes, so neither
# side gets all the early or all the late runs), each in a fresh process, and prints every run's
# ms/step and the two medians. VARIANT (default tk) picks another e2e variant; E2E_ARGS adds bench.py
# arguments (a '+compile' variant needs E2E_ARGS="--compile-modes default").
# Logs in OUT/logs, packed into OUT/logs.tgz; headlines in OUT/summary.txt. LANE_LIMIT (s, 120).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: E2E_AB=NAME=VALUE bash tests/gpu_e2e_env_ab.sh OUT" >&2; exit 2; }
[ -n "${E2E_AB:-}" ] && [[ "$E2E_AB" == *=* ]] || { echo "gpu_e2e_env_ab.sh: set E2E_AB=NAME=VALUE" >&2; exit 2; }
cd "$(dirname "$0")/.."
export LANE_LIMIT=${LANE_LIMIT:-120}
source tests/gpu_lib.sh "$1"
note "gpu_e2e_env_ab: $E2E_AB vs unset, variant ${VARIANT:-tk}, ${ROUNDS:-2} rounds"
for r in $(seq "${ROUNDS:-2}"); do
    for side in with without; do
        log=e2e_${side}_$r.log
        if [ $side = with ]; then
            step 60 "$log" env "$E2E_AB" python3 bench.py --e2e --models gpt2 --variants "${VARIANT:-tk}" ${E2E_ARGS:-}
        else
            step 60 "$log" env -u "${E2E_AB%%=*}" python3 bench.py --e2e --models gpt2 --variants "${VARIANT:-tk}" ${E2E_ARGS:-}
        fi
        note "round $r $side $E2E_AB: $(grep -E '^  gpt2 .*ms/step' "$L/$log" | sed 's/(warm-up.*//' | head -1)"
    done
done
python3 - "$S" "$E2E_AB" <<'EOF' | tee -a "$S"
import re, statistics, sys
text = open(sys.argv[1]).read()
ms = {side: [float(v) for v in re.findall(rf"round \d+ {side} .*?: +gpt2 \S+: ([\d.]+) ms/step", text)]
      for side in ("with", "without")}
if all(ms.values()):
    a, b = statistics.median(ms["with"]), statistics.median(ms["without"])
    print(f"median ms/step: with {sys.argv[2]} {a:.2f}, without {b:.2f} (with/without {a / b:.4f}); runs {ms}")
else:
    print(f"incomplete: {ms}")
EOF
pack

"""The MLP's forward and backward under given schedules, for compute-sanitizer (tests/gpu_mlp_*.sh):
    python3 tests/mlp_sanitize_case.py "side=2;fcfast=5,side=2" [cases]
Shapes chosen for the kernels' edges: several tiles per CTA with tails (M = 4077, C = 768), short K
(C = 128: 2 k-steps; 32 column groups of dy for 96 side-job threads) and C = 1600 (400 groups: a
partial last round of the side job's thread loop), with biases (the side job's dy column sums run
only when bias gradients are wanted) and without. Prints one line per run and 'mlp sanitize case
ran' at the end; a NaN or inf in dx is printed as 'finite: False'."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernels import mlp_op  # noqa: E402

CASES = ((4000 + 77, 768, True), (20000 + 5, 128, True), (300 + 33, 1600, True), (4000 + 77, 768, False))


def main(argv):
    if len(argv) < 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    specs = [s for s in argv[0].split(";") if s.strip()]
    for spec in specs:
        mlp_op.parse_schedule(spec)               # a typo fails before any launch
    n = int(argv[1]) if len(argv) > 1 else len(CASES)
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)
    mlp_op.set_dw_gemm("tk")   # the tk weight-gradient kernel under the sanitizer, not cuBLAS (the default since session 13)
    for spec in specs:
        mlp_op.set_schedule(spec)
        for M, C, bias in CASES[:n]:
            H = 4 * C
            x, w1, w2, dy = r(M, C), r(H, C, scale=C ** -0.5), r(C, H, scale=H ** -0.5), r(M, C)
            b1, b2 = (r(H), r(C)) if bias else (None, None)
            y, pre, h = mlp_op.mlp_fwd(x, w1, b1, w2, b2)
            dx, dw1, db1, dw2, db2 = mlp_op.mlp_bwd(dy, x, pre, h, w1, w2, bias_grads=bias)
            torch.cuda.synchronize()
            print(spec, M, C, bias, "dx finite:", bool(torch.isfinite(dx).all()))
    mlp_op.set_schedule("0")
    print("mlp sanitize case ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

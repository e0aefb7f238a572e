"""Case for compute-sanitizer (tests/gpu_gemm_schedule.sh): step 5 variant 10 and step 4
variant 9 (the planned schedule, kernels/gemm_splitk_epilogue.cuh) on small products that take both of
stream_schedule's cases, bf16 and fp32, each result checked against float64.
    python3 tests/gemm_schedule_sanitize_case.py          # memcheck: every variant, shape and dtype, twice
    python3 tests/gemm_schedule_sanitize_case.py quick    # racecheck: 5v10 and 4v9, the two small shapes, bf16, once
Shapes (M, K, N) of dW = dyᵀ·x on 132 SMs, as step 5 cuts them into 128x128 tiles (step 4's
128x256 tiles give other counts, and both of the schedule's cases as well):
  (640, 1280, 528): 25 tiles < 62 CTAs: heads of 8 k-tiles, the tails shared by 37 CTAs, some with
      two pieces
  (1408, 256, 1408): 121 tiles >= 60 CTAs: two whole tiles per CTA, the one left over in pieces
  (1000, 2048, 528): 40 tiles < 132 CTAs: heads of 9 k-tiles, tails shared by 92 CTAs
  (1664, 512, 1408): 143 tiles >= 132: one whole tile per CTA after a piece of the 11 left over
  (2560, 2048, 1024): 160 tiles: the same with longer pieces
  (300, 1040, 96): tails in M, N and K (a partial last k-tile), 6 CTAs
"""
import sys

import torch

sys.path.insert(0, ".")
from kernels import gemm  # noqa: E402

quick = sys.argv[1:] == ["quick"]
shapes = [(640, 1280, 528), (1408, 256, 1408), (1000, 2048, 528), (1664, 512, 1408), (2560, 2048, 1024), (300, 1040, 96)]
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
checks = []
for step, variant in ((5, 10), (4, 9)):
    for (M, K, N) in shapes[:2] if quick else shapes:
        for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32):
            for rep in range(1 if quick else 2):
                dy, x = r(K, M), r(K, N)
                c = gemm.matmul(dy.t(), x, step=step, variant=variant, out_dtype=dtype)
                checks.append((f"{step}v{variant} {M}x{K}x{N} {dtype} call {rep}", c, dy.double().t() @ x.double()))
torch.cuda.synchronize()
bad = 0
for name, c, ref in checks:
    err = ((c.double() - ref).norm() / ref.norm()).item()
    bad += not err < 1e-2
    print(f"{name}: rel err {err:.2e}", "OK" if err < 1e-2 else "BAD")
print(f"gemm schedule sanitize case ran, {bad} bad")

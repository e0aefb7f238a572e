"""Quick diagnostic run of the Hopper attention forward (GPU): one call per head dim, errors
printed with WHERE they are (first bad rows / columns), for debugging on a rationed GPU.
    python tests/attention_hopper_smoke.py [variant ...]   (kernels/attention_hopper.py VARIANTS; default: 0)
Uses TK_ATTENTION_HOPPER_LIB (ctypes) if set, else the torch extension."""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("TK_ATTENTION_HOPPER_LIB"):
    import attention_hopper_ctypes as impl
else:
    from kernels import attention_hopper as impl

cases = [(variant, D, T, causal) for variant in (map(int, sys.argv[1:]) if len(sys.argv) > 1 else [0])
         for D, T, causal in ((64, 1000, True), (128, 1000, True), (64, 300, False))]
for variant, D, T, causal in cases:
    B, H = 2, 3
    g = torch.Generator(device="cuda").manual_seed(D + T)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    scale = 1 / math.sqrt(D)
    o, lse = impl.forward(q, k, v, causal, scale, variant)
    torch.cuda.synchronize()
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    lse_ref = torch.logsumexp(s, -1)
    o_ref = torch.exp(s - lse_ref[..., None]) @ v.double()
    err = ((o.double() - o_ref).norm() / o_ref.norm()).item()
    row_err = (o.double() - o_ref).abs().amax(dim=-1)            # (B, H, T)
    bad = (row_err > 0.05) | torch.isnan(row_err)
    print(f"variant={variant} D={D} T={T} causal={causal}: rel err O {err:.3e}, "
          f"NaN O {torch.isnan(o).sum().item()}, NaN lse {torch.isnan(lse).sum().item()}, "
          f"max |lse err| {(lse.double() - lse_ref).abs().nan_to_num(1e9).max().item():.3e}, "
          f"bad rows {bad.sum().item()}/{bad.numel()}", flush=True)
    if bad.any():
        idx = bad.nonzero()[:8].tolist()
        print("  first bad (b, h, row):", idx)
        b_, h_, r_ = idx[0]
        col_err = (o[b_, h_, r_].double() - o_ref[b_, h_, r_]).abs()
        print("  that row's bad cols:", (col_err > 0.05).nonzero().flatten()[:16].tolist())
        print("  rows bad per 64-row block:", bad[0, 0].view(-1)[: (T // 64) * 64].view(-1, 64).sum(1).tolist())

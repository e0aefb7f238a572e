"""The Hopper attention kernels on a few inputs, for compute-sanitizer and ncu (no checks here:
tests/test_attention_hopper*.py compare against float64). Run from the repository root:

  python3 tests/attention_sanitize_case.py small       forward + backward (defaults), D 64/128,
                                                      T 70/300/200: the backward reuses its
                                                      (Q, dO, lse, Di) slots (5 query blocks > 3)
  python3 tests/attention_sanitize_case.py items V...  forward variants V (0 = default) with more
                                                      work items than SMs (100-200 heads x 2-8
                                                      query blocks), so a persistent CTA reuses
                                                      its Q slots and item_of (racecheck)
  python3 tests/attention_sanitize_case.py all V...    small, then items V...
  python3 tests/attention_sanitize_case.py gpt2 V      one forward of variant V at (16, 12, 1024, 64)
                                                      (ncu: --launch-count 1)
"""
import sys

import torch

sys.path.insert(0, ".")
from kernels import attention_hopper as H  # noqa: E402


def qkv_views(B, T, nh, D):
    qkv = torch.randn(B, T, 3, nh, D, device="cuda").bfloat16()
    return qkv, qkv.permute(2, 0, 3, 1, 4).unbind(0)


def main(argv):
    what = argv[1]
    if what == "all":
        main([argv[0], "small"])
        main([argv[0], "items"] + argv[2:])
        return
    if what == "small":
        for B, T, nh, D in ((2, 70, 3, 64), (2, 300, 3, 64), (2, 200, 3, 128)):
            qkv, (q, k, v) = qkv_views(B, T, nh, D)
            o, lse = H.forward(q, k, v, True, D ** -0.5)
            dqkv = torch.empty_like(qkv)
            H.backward(torch.randn_like(o), q, k, v, o, lse, True, D ** -0.5,
                       out=tuple(dqkv.permute(2, 0, 3, 1, 4).unbind(0)))
    elif what == "items":
        for variant in [int(x) for x in argv[2:]] or [0]:
            # T = 1000: a tail (the last query block is part past T); session 5's 192-row variants
            # (18/19, removed) had warpgroups there that skipped 7 key tiles
            for B, T, D in ((2, 256, 64), (1, 1000, 64), (2, 300, 128)):
                _, (q, k, v) = qkv_views(B, T, 100, D)
                H.forward(q, k, v, True, D ** -0.5, variant)
            torch.cuda.synchronize()
            print(f"variant {variant} ok", flush=True)   # the GPU script keeps the variants that get here
    elif what == "gpt2":
        _, (q, k, v) = qkv_views(16, 1024, 12, 64)
        H.forward(q, k, v, True, 64 ** -0.5, int(argv[2]) if len(argv) > 2 else 0)
    else:
        raise SystemExit(f"unknown case {what!r}: small, items or gpt2")
    torch.cuda.synchronize()
    print("attention case ran", " ".join(argv[1:]))


if __name__ == "__main__":
    main(sys.argv)

"""The Hopper attention backward's variants on small inputs, for compute-sanitizer (memcheck,
racecheck). No checks here: tests/test_attention_hopper_bwd.py compares against float64.
Run from the repository root:

  python3 tests/attention_bwd_sanitize_case.py [V ...]     backward variants V (default: 0, 8-15)

Shapes: D = 64 at T = 70 (one key block per head, a tail past T in the last chunk) and T = 300
(5 query blocks through 3 slots: every slot reused, consumer 1's skipped first block, 3 key blocks
adding into a dQ chunk); D = 128 at T = 200 (8-10 run 5 there, 11-15 5 with prep_kernel).
B = 2, H = 3, packed views as the model has them.
"""
import sys

import torch

sys.path.insert(0, ".")
from kernels import attention_hopper as H  # noqa: E402


def main(argv):
    variants = [int(x) for x in argv[1:]] or [0] + list(range(8, 16))
    ext = H._bwd_ext.module
    for B, T, nh, D in ((2, 70, 3, 64), (2, 300, 3, 64), (2, 200, 3, 128)):
        qkv = torch.randn(B, T, 3, nh, D, device="cuda").bfloat16()
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        o, lse = H.forward(q, k, v, True, D ** -0.5)
        d_o = torch.randn(B, T, nh, D, device="cuda").bfloat16().transpose(1, 2)
        for variant in variants:
            dqkv = torch.empty_like(qkv)
            ext.backward_into(d_o, q, k, v, o, lse, True, D ** -0.5, *dqkv.permute(2, 0, 3, 1, 4).unbind(0), variant)
            torch.cuda.synchronize()
            print(f"  T={T} D={D} variant {variant} ran", flush=True)   # a sanitizer cut by time shows how far
    torch.cuda.synchronize()
    print("sanitize case ran: variants", variants)


if __name__ == "__main__":
    main(sys.argv)

"""bench.py's MLP rows: tk vs torch eager (cuBLAS GEMMs + a separate GELU kernel) vs torch.compile.

    python bench.py --ops mlp [--quick]

Registered into bench.py's registry by kernels/mlp_op.py when bench.py is the running script.
Cases: forward and forward+backward at M = 16384 and 65536 tokens, C = 768 (GPT-2 small),
hidden 4C, bf16 parameters and activations, biases on. Work counted: 2·2·M·C·4C flops for the
forward (two GEMMs), 3x that for forward+backward (shared/docs/anchors.md's convention; the
bias and GELU work is not counted).
"""
import torch


def cases(Case, quick):
    from kernels import mlp_op, reference

    def fwd(f, inp):
        with torch.no_grad():
            f(*inp[:5])

    def fwd_bwd(f, inp):
        x, w_fc, b_fc, w_proj, b_proj, dy = inp
        y = f(x, w_fc, b_fc, w_proj, b_proj)
        torch.autograd.grad(y, (x, w_fc, b_fc, w_proj, b_proj), dy)   # grads returned, never accumulated

    C = 768
    for M in (16384, 65536):
        def make(M=M):
            def t(*shape, scale=1.0, grad=True):
                return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16).requires_grad_(grad)
            return (t(M, C), t(4 * C, C, scale=C ** -0.5), t(4 * C, scale=0.5), t(C, 4 * C, scale=(4 * C) ** -0.5),
                    t(C, scale=0.5), t(M, C, grad=False))
        flops = 2 * 2 * M * C * 4 * C
        steps = [("fwd+bwd", fwd_bwd, 3)] if quick else [("fwd", fwd, 1), ("fwd+bwd", fwd_bwd, 3)]
        for name, step, mult in steps:
            yield Case("mlp", f"{name} {M}x{C} bf16", "TFLOP/s", mult * flops, make, step,
                       impls={"tk": mlp_op.mlp, "eager": reference.mlp},
                       note="c_fc -> GELU(tanh) -> c_proj; flops of the GEMMs only")

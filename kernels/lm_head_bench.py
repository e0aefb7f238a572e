"""bench.py's LM head rows: tk (chunked, gradient computed in the forward, kernels/lm_head_op.py)
vs eager F.linear + F.cross_entropy (reference.lm_head_loss, what model.py did) vs torch.compile
of that.

    python bench.py --ops lm_head [--quick] [--compile-modes default]

Registered by bench.py (lm_head_cases). Everything runs as the model runs it: bf16 autocast
(cache off, as train.py under CUDA graphs), x bf16 (the final layernorm's output), the tied
weight an fp32 parameter, targets int64 with none ignored. Cases: fwd+bwd at GPT-2's training
shape (N = 32·1024 tokens, C = 768, V = 50304), and with --quick off also the loss alone under
no_grad (evaluation) and shakespeare-char's shape (N = 64·256, C = 384, V = 65). Work counted:
the GEMMs' flops, 2·N·C·V forward, 3x that for forward+backward (the softmax is not counted).
"""
import torch


def cases(Case, quick):
    from kernels import lm_head_op, reference

    def fwd(f, inp):
        x, w, t = inp
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            f(x, w, t)

    def fwd_bwd(f, inp):
        x, w, t = inp
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = f(x, w, t)
        torch.autograd.grad(loss, (x, w))   # grads returned, never accumulated

    shapes = [("gpt2", 32 * 1024, 768, 50304)]
    if not quick:
        shapes.append(("shakespeare-char", 64 * 256, 384, 65))
    for model, N, C, V in shapes:
        def make(N=N, C=C, V=V):
            x = torch.randn(N, C, device="cuda").to(torch.bfloat16).requires_grad_()
            w = (torch.randn(V, C, device="cuda") * 0.5 / C ** 0.5).requires_grad_()   # logits of std ~0.5
            t = torch.randint(0, V, (N,), device="cuda")
            return x, w, t
        flops = 2 * N * C * V
        steps = [("fwd+bwd", fwd_bwd, 3)]
        if not quick and model == "gpt2":
            steps.append(("fwd no_grad", fwd, 1))
        for name, step, mult in steps:
            yield Case("lm_head", f"{name} {N}x{C}x{V}", "TFLOP/s", mult * flops, make, step,
                       impls={"tk": lm_head_op.lm_head_loss, "eager": reference.lm_head_loss},
                       note=f"{model}: x·Wᵀ + cross-entropy, bf16 autocast, fp32 W; flops of the GEMMs only")

"""`python -m kernels`: what this machine can run. Prints the GPU, the build state of each
kernel family, and per op whether the tk kernel is available at a GPT-2 shape and why not.

    python -m kernels              builds the extensions if needed (prints each build's time)
    python -m kernels --no-build   reports without compiling anything
"""
import sys

import torch

import kernels

# The shape we ask each op's preflight about: GPT-2 124M training (B=16, T=1024, C=768, 12 heads).
SHAPE = dict(batch_size=16, block_size=1024, n_embd=768, n_head=12, dtype=torch.bfloat16,
             attn_dropout=0.0, bias=True)


def extensions_of(op):
    """The LazyExtension objects kept by the op's modules (kernels.<op>, kernels.<op>_*)."""
    from kernels.build import LazyExtension
    found = []
    for name, module in list(sys.modules.items()):
        if name == f"kernels.{op}" or name.startswith(f"kernels.{op}_"):
            found += [v for v in vars(module).values() if isinstance(v, LazyExtension) and v not in found]
    return found


def main(argv):
    build = "--no-build" not in argv
    cuda = torch.cuda.is_available()
    from torch.utils.cpp_extension import CUDA_HOME
    if cuda:
        p = torch.cuda.get_device_properties(0)
        gpu = f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB"
    else:
        gpu = "no CUDA device (tk kernels cannot run; every op uses its PyTorch reference)"
    print(f"GPU      {gpu}")
    print(f"torch    {torch.__version__} (CUDA {torch.version.cuda}), nvcc at {CUDA_HOME or 'not found'}")
    if kernels._import_errors:
        for name, err in kernels._import_errors.items():
            print(f"IMPORT   kernels/{name}.py failed: {err}")
    device = "cuda" if cuda else "cpu"
    rows = []
    for op in kernels.OPS:
        exts = extensions_of(op)
        if op not in kernels._tk_impls:
            available, why = "no", kernels._missing_reason(op)
        elif not build and cuda:
            available, why = "?", "not checked (--no-build)"
        else:
            check = kernels._preflight_checks.get(op)
            why = check(device=device, **SHAPE) if check else None
            available = "yes" if why is None else "no"
        state = "; ".join(f"{e.name}: {e.state()}" for e in exts) or "-"
        rows.append((op, kernels.choice()[op], available, state, why or ""))
    header = ("op", "choice", "tk here", "build", "why not")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(4)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths + [0])))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths + [0])))
    print(f"\n(tk availability asked at GPT-2 shape B={SHAPE['batch_size']}, T={SHAPE['block_size']}, "
          f"C={SHAPE['n_embd']}, bf16, on {device}; each call is checked again at run time)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

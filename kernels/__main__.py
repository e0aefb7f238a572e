"""`python -m kernels`: what this machine can run. Prints the GPU, the build state of each
kernel family, and per op whether the tk kernel is available at a GPT-2 shape and why not.

    python -m kernels              builds the extensions if needed (prints each build's time)
    python -m kernels --no-build   reports without compiling anything
    python -m kernels --build      builds every extension now, all at once, and says which failed
    python -m kernels --build tk_attention tk_attention_hopper    only these

`--build` is what the GPU scripts run first: one process per extension (a process builds one
torch extension at a time), so a cold start costs the slowest build, not the sum of them.
"""
import subprocess
import sys
import time

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


def all_extensions():
    """{name: LazyExtension} of every kernel family the package registered."""
    from kernels.build import LazyExtension
    found = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("kernels."):
            found.update({v.name: v for v in vars(module).values() if isinstance(v, LazyExtension)})
    return found


def build_one(name):
    reason = all_extensions()[name].why_not()
    print(f"build {name}: {'ok' if reason is None else 'FAILED: ' + reason}", flush=True)
    return 0 if reason is None else 1


def build_all(names=()):
    """The named extensions (default: all), each built in its own process, all at once. Returns 0
    if all of them built."""
    known = all_extensions()
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown extension {', '.join(unknown)}; the extensions are {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    t0 = time.time()
    procs = {name: subprocess.Popen([sys.executable, "-m", "kernels", "--build-one", name])
             for name in sorted(names or known)}
    failed = [name for name, p in procs.items() if p.wait() != 0]
    print(f"built {len(procs) - len(failed)} of {len(procs)} extensions in {time.time() - t0:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


def main(argv):
    if argv[:1] == ["--build-one"] and len(argv) == 2:
        return build_one(argv[1])
    if argv[:1] == ["--build"]:
        return build_all(argv[1:])
    build = "--no-build" not in argv
    cuda = torch.cuda.is_available()
    from torch.utils.cpp_extension import CUDA_HOME
    if cuda:
        p = torch.cuda.get_device_properties(0)
        gpu = f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB"
    else:
        gpu = "no CUDA device (tk kernels cannot run; every op uses its PyTorch reference)"
    print(f"GPU      {gpu}")
    print(f"torch    {torch.__version__} (CUDA {torch.version.cuda}), CUDA toolkit {CUDA_HOME or 'not found by torch (set CUDA_HOME)'}")
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

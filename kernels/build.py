"""The JIT build: turn kernels/*.cu + a bindings .cpp into an importable extension, on first use.

Read this file top to bottom; the one thing op modules use is `LazyExtension`:

    _ext = LazyExtension("tk_layernorm", ["layernorm.cu", "layernorm_bindings.cpp"])
    _ext.why_not()   # None once built and loaded, else a one-line reason (builds on first call)
    _ext.module      # the loaded extension (raises KernelBuildError if it cannot be built)

Decisions, and why:
- One extension PER OP FAMILY (tk_layernorm, tk_attention, tk_gemm, ...), not one for all
  kernels: a half-written attention.cu cannot break the layernorm build, each family rebuilds
  alone when its files change, and ninja builds the families' objects in parallel anyway.
- ninja compiles the family's sources in parallel (all cores, or MAX_JOBS if set).
- Lazy: nothing is compiled at import. The first tk call (or preflight at start-up) builds,
  and only when CUDA is available. torch caches the result under TORCH_EXTENSIONS_DIR (or its
  default root); a warm load takes about a second.
- Flags: .cu files -O3 -std=c++20 -lineinfo (lineinfo costs nothing at run time and lets
  compute-sanitizer name source lines). The bindings .cpp gets -O3 and torch's own -std: it
  includes torch headers and hands c10 types (tensors, exceptions) to libtorch, so it must be
  compiled with the standard libtorch was (forcing C++20 there was the suspect when a bad-input
  error crashed instead of raising, torch 2.11). The .cu files see no torch types: they may
  use C++20 freely. NO --use_fast_math: it silently swaps every division,
  sqrt and exp in every file for approximations and flushes denormals; a kernel that wants an
  approximate instruction (rsqrtf, exp2f, ex2.approx) writes it where the reader can see it.
  torch adds -D__CUDA_NO_BFLOAT16_CONVERSIONS__ and friends, which plain nvcc does not; we
  undo them so tk/ headers compile the same here as in the CI's plain-nvcc check.
- Arch: the device's own (`sm_XY`) for portable code; `hopper=True` families (wgmma, TMA,
  setmaxnreg) build `-gencode=arch=compute_90a,code=sm_90a` and report "needs Hopper" elsewhere.
- torchrun: all local ranks call the same op at the same point, so they all arrive here
  together. An exclusive `flock` on a file beside the build directory lets the first rank
  build while the others block on the lock (no NCCL collective is in flight, so nothing can
  time out); each later rank then finds the build up to date and just loads it. flock is
  released by the kernel if the builder dies, unlike torch's own `lock` file, which we clear
  when we hold the flock (a stale one from a killed build would otherwise hang every rank).
- A failed build raises KernelBuildError with the compiler's error lines (not ninja's wall of
  command lines), the path of the full log, and how to fall back: --kernels=torch.
"""
import fcntl
import os
import re
import sys
import time
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
REPO_ROOT = KERNELS_DIR.parent                      # so sources can `#include "tk/tk.cuh"`

CUDA_FLAGS = [
    "-O3", "-std=c++20", "-lineinfo",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
]
CXX_FLAGS = ["-O3"]   # the bindings keep torch's own -std: c10 types and exceptions cross into libtorch
HOPPER_ARCH = "-gencode=arch=compute_90a,code=sm_90a"


class KernelBuildError(RuntimeError):
    """The extension could not be built or loaded here; the message says why and what to do."""


def arch_flags(hopper):
    """nvcc -gencode flag for the current device; `hopper` sources need sm_90 exactly."""
    import torch
    major, minor = torch.cuda.get_device_capability()
    if hopper:
        if (major, minor) != (9, 0):
            raise KernelBuildError(f"needs a Hopper GPU (sm_90); this one is sm_{major}{minor}")
        return [HOPPER_ARCH]
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def build_root():
    from torch.utils.cpp_extension import get_default_build_root
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def compiler_errors(log, max_lines=40):
    """The lines of a ninja log a person needs: which file failed and the compiler's errors."""
    keep = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("FAILED:"):
            keep.append(line[:200])
        elif re.search(r"\berror\b|ptxas (fatal|error)|undefined reference|fatal:", line, re.IGNORECASE):
            keep.extend(lines[i:i + 3])           # the error and the source line/caret after it
    keep = list(dict.fromkeys(keep))               # de-duplicate, keep order
    if not keep:                                   # unknown format: show the tail
        keep = lines[-max_lines:]
    if len(keep) > max_lines:
        keep = keep[:max_lines] + [f"... ({len(keep) - max_lines} more lines in the full log)"]
    return "\n".join(keep)


def load_extension(name, sources, hopper=False, extra_cuda_cflags=(), verbose=False):
    """Build (if needed) and import the extension `name` from `sources` (paths relative to
    kernels/). Prints one line: the cold build time, or the warm load time. Raises
    KernelBuildError with the compiler's errors on failure."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, load
    if not torch.cuda.is_available():
        raise KernelBuildError("no CUDA device is available")
    if CUDA_HOME is None:
        raise KernelBuildError("nvcc / CUDA_HOME not found (torch cannot build CUDA extensions here)")
    cuda_flags = CUDA_FLAGS + arch_flags(hopper) + list(extra_cuda_cflags)
    paths = [str(KERNELS_DIR / s) for s in sources]
    build_dir = build_root() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    library = build_dir / f"{name}.so"
    before = library.stat().st_mtime if library.exists() else None

    t0 = time.time()
    with open(build_root() / f"{name}.flock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)           # other local ranks wait here while we build
        stale = build_dir / "lock"                 # torch's own lock; we hold the real one
        if stale.exists():
            stale.unlink()
        try:
            module = load(name=name, sources=paths, extra_cflags=CXX_FLAGS, extra_cuda_cflags=cuda_flags,
                          extra_include_paths=[str(REPO_ROOT)], build_directory=str(build_dir),
                          verbose=verbose)
        except Exception as e:                     # build or import failed
            log = str(e)
            (build_dir / "build_error.log").write_text(log)
            raise KernelBuildError(
                f"building {name} ({', '.join(sources)}) failed:\n{compiler_errors(log)}\n"
                f"full log: {build_dir / 'build_error.log'}\n"
                f"Run with --kernels=torch (or the op's --kernels_<op>=torch) to use the PyTorch reference.") from None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    seconds = time.time() - t0
    after = library.stat().st_mtime if library.exists() else None
    how = "built (cold)" if after != before else "loaded (cached)"
    print(f"kernels: {how} {name} in {seconds:.1f} s [{build_dir}]", file=sys.stderr)
    return module


class LazyExtension:
    """An extension built on first use and remembered, success or failure, for the process."""

    def __init__(self, name, sources, hopper=False, extra_cuda_cflags=()):
        self.name, self.sources, self.hopper = name, list(sources), hopper
        self.extra_cuda_cflags = list(extra_cuda_cflags)
        self._module = None
        self._error = None                         # KernelBuildError message once a build failed

    def why_not(self):
        """None if the extension is loaded (building it now if needed), else the reason it is not.
        Never builds without CUDA, so CPU runs never touch nvcc."""
        if self._module is not None:
            return None
        import torch
        if not torch.cuda.is_available():          # not a failure to remember: nothing was tried
            return "no CUDA device is available"
        if self._error is None:
            try:
                self._module = load_extension(self.name, self.sources, self.hopper, self.extra_cuda_cflags)
            except KernelBuildError as e:
                self._error = str(e)
        return self._error

    @property
    def module(self):
        reason = self.why_not()
        if reason is not None:
            raise KernelBuildError(reason)
        return self._module

    def state(self):
        """For `python -m kernels`: one short phrase, without building anything."""
        if self._module is not None:
            return "loaded"
        if self._error is not None:
            return "build failed: " + self._error.splitlines()[0]
        try:
            on_disk = (build_root() / self.name / f"{self.name}.so").exists()
        except Exception:                          # no torch.utils.cpp_extension root
            on_disk = False
        return "built, not loaded yet" if on_disk else "not built yet"

"""GPU tests of tk/'s warp-scope ops against PyTorch (skipped without CUDA).

The kernels live in tests/tk/tk_test_{memory,mma,ops}.cu: plain CUDA C++ with extern "C"
launchers, compiled by nvcc into one shared library (no torch headers, so it builds in seconds and
can be built ahead of time: `python tests/test_tk_ops.py build sm_90a`) and called through ctypes
on torch tensors. Every output is poisoned with NaN first; rows a kernel must not write must still
be NaN afterwards. Reference: float64 PyTorch on the same (rounded) inputs, compared by relative
norm error, or exactly where the op is exact (moves, masks, fills).
"""
import ctypes
import fcntl
import hashlib
import glob
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "tests", "tk", f"tk_test_{n}.cu") for n in ("memory", "mma", "ops")]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
DT_F32, DT_BF16, DT_F16 = 0, 1, 2
TORCH_DT = {DT_F32: torch.float32, DT_BF16: torch.bfloat16, DT_F16: torch.float16}

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or NVCC is None, reason="needs a CUDA device and nvcc")


# ---------------------------------------------------------------- building the test library
def _gencode(arch):
    num = arch.replace("sm_", "")
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def build(arch):
    """Compile the test library for `arch` (e.g. 'sm_90a') into build/tk_test/<hash>/ and return its path.

    pytest-xdist's workers all call this at once on a fresh machine: one builds under an exclusive
    lock on <hash>.lock while the others wait, then find the library and load it. (Unlocked, twelve
    workers compiled into the same object files and linked each other's half-written ones: session
    9's final check saw a segfault, an illegal instruction and 18 failed tests in test_tk_ops, the
    first test of each worker, on tk/ code whose 819 tests passed in session 5.)"""
    files = sorted(SOURCES + [os.path.join(ROOT, "tests", "tk", "tk_test.cuh")] +
                   glob.glob(os.path.join(ROOT, "tk", "**", "*.cuh"), recursive=True))
    h = hashlib.sha256(arch.encode())
    for f in files:
        h.update(os.path.relpath(f, ROOT).encode())
        h.update(open(f, "rb").read())
    out_dir = os.path.join(ROOT, "build", "tk_test", f"{arch}-{h.hexdigest()[:16]}")
    lib = os.path.join(out_dir, "libtk_test.so")
    if os.path.exists(lib):
        return lib
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    with open(out_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
        if not os.path.exists(lib):        # another process may have built it while this one waited
            _compile_and_link(arch, out_dir, lib)
    return lib


def _compile_and_link(arch, out_dir, lib):
    os.makedirs(out_dir, exist_ok=True)
    flags = ["-std=c++20", "-O2", f"-I{ROOT}", "-Xcompiler", "-fPIC", _gencode(arch)]

    def compile_one(src):
        obj = os.path.join(out_dir, os.path.basename(src) + ".o")
        r = subprocess.run([NVCC, *flags, "-c", src, "-o", obj], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"nvcc failed on {src}:\n{r.stderr[-4000:]}")
        return obj

    with ThreadPoolExecutor(len(SOURCES)) as pool:
        objs = list(pool.map(compile_one, SOURCES))
    r = subprocess.run([NVCC, "-shared", _gencode(arch), "-o", lib + ".tmp", *objs], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc link failed:\n{r.stderr[-4000:]}")
    os.replace(lib + ".tmp", lib)   # appears whole: a process that finds it can load it


_lib = None


def lib():
    global _lib
    if _lib is None:
        major, minor = torch.cuda.get_device_capability()
        arch = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
        path = build(arch)
        try:
            _lib = ctypes.CDLL(path)
        except OSError:   # built elsewhere (e.g. ahead of time on another machine) and does not load here
            shutil.rmtree(os.path.dirname(path))
            _lib = ctypes.CDLL(build(arch))
        P, I, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        _lib.tk_roundtrip.argtypes = [I, I, I, I, I, I, P, P, I, I, I]
        _lib.tk_swizzle_offsets.argtypes = [I, I, I, P]
        _lib.tk_mma.argtypes = [I, I, I, I, I, P, P, P, P, I]
        _lib.tk_tile_op.argtypes = [I, I, P, P, P, P, P, P, I, F, I]
        _lib.tk_error_name.argtypes, _lib.tk_error_name.restype = [I], ctypes.c_char_p
    return _lib


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def call(fn, *args):
    torch.cuda.synchronize()
    rc = fn(*args)
    assert rc != -1, "this combination is not instantiated in the test library"
    assert rc == 0, f"CUDA error {rc} ({lib().tk_error_name(rc).decode()})"


def poison(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


# ---------------------------------------------------------------- swizzle: the formula itself
def doc_offset(r, c, rows, cols, esize):
    """hopper-facts §3.3, written as the doc states it: chunk index XOR row bits, per column block."""
    span = 128 if (cols * esize) % 128 == 0 else 64 if (cols * esize) % 64 == 0 else 32
    shift, mask = {128: (0, 7), 64: (1, 3), 32: (2, 1)}[span]
    block_cols = span // esize
    b, cc = divmod(c, block_cols)
    chunk, inner = divmod(cc * esize, 16)
    return b * rows * span + r * span + ((chunk ^ ((r >> shift) & mask)) << 4) + inner


@needs_gpu
@pytest.mark.parametrize("dtype,rows,cols", [(DT_BF16, 16, 16), (DT_BF16, 32, 32), (DT_BF16, 64, 64),
                                             (DT_BF16, 32, 128), (DT_BF16, 16, 48), (DT_F32, 32, 32)])
def test_swizzle_offsets_match_hopper_facts(dtype, rows, cols):
    out = torch.full((rows * cols,), -1, dtype=torch.int32, device="cuda")
    call(lib().tk_swizzle_offsets, dtype, rows, cols, ptr(out))
    esize = 4 if dtype == DT_F32 else 2
    want = torch.tensor([doc_offset(k // cols, k % cols, rows, cols, esize) for k in range(rows * cols)], dtype=torch.int32)
    assert torch.equal(out.cpu(), want)
    assert len(set(want.tolist())) == rows * cols   # a permutation of the tile's bytes


# ---------------------------------------------------------------- round trips
ROUNDTRIPS = [  # (dtype in memory, register dtype, rows, cols, warps)
    (DT_BF16, DT_BF16, 16, 16, 1), (DT_BF16, DT_BF16, 32, 32, 1), (DT_BF16, DT_BF16, 32, 64, 1),
    (DT_BF16, DT_BF16, 32, 128, 1), (DT_BF16, DT_BF16, 16, 48, 1), (DT_BF16, DT_BF16, 64, 64, 4),
    (DT_F16, DT_F16, 32, 64, 1), (DT_F32, DT_F32, 16, 16, 1), (DT_F32, DT_F32, 32, 32, 1),
    (DT_F32, DT_F32, 64, 32, 4), (DT_BF16, DT_F32, 32, 64, 1),
]
MODES = {0: "load>st>rt>st>global", 1: "cp.async>st>rt>st>global", 2: "load>st>rt>global",
         3: "cp.async>st>rt>global", 4: "global>rt>st>global", 6: "global>rt>global"}


@needs_gpu
@pytest.mark.parametrize("case", ROUNDTRIPS, ids=lambda c: "{}-{}-{}x{}-w{}".format(*c))
@pytest.mark.parametrize("layout", [0, 1], ids=["row", "col"])
@pytest.mark.parametrize("mode", list(MODES), ids=list(MODES.values()))
@pytest.mark.parametrize("tail", [0, 5])
def test_roundtrip(case, layout, mode, tail):
    dtype, rt_dtype, rows, cols, warps = case
    torch.manual_seed(rows * 1000 + cols + mode + tail)
    tdt = TORCH_DT[dtype]
    stride = cols + 16 // tdt.itemsize            # padded rows: keeps 16 B alignment, catches stray writes
    rows_valid = rows - tail
    x = torch.randn(rows, stride, device="cuda").to(tdt)
    out = poison((rows, stride), tdt)
    call(lib().tk_roundtrip, dtype, rt_dtype, rows, cols, layout, warps, ptr(x), ptr(out), stride, rows_valid, mode)
    want = poison((rows, stride), tdt)
    want[:rows_valid, :cols] = x[:rows_valid, :cols]
    if not mode & 2:                              # whole tile went through shared: tail rows are zeros
        want[rows_valid:, :cols] = 0
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------- mma
MMAS = [(DT_BF16, 32, 48, 64), (DT_BF16, 16, 16, 16), (DT_F16, 16, 32, 32)]
VARIANTS = ["AB", "ABt", "AtB", "AtBt"]


@needs_gpu
@pytest.mark.parametrize("case", MMAS, ids=lambda c: "{}-{}x{}x{}".format(*c))
@pytest.mark.parametrize("variant", range(4), ids=VARIANTS)
@pytest.mark.parametrize("accumulate", [0, 1], ids=["mm", "mma"])
def test_mma(case, variant, accumulate):
    dtype, m, n, k = case
    torch.manual_seed(m * n + k + variant)
    tdt = TORCH_DT[dtype]
    a_t, b_t = variant >= 2, variant % 2 == 1
    a = torch.randn((k, m) if a_t else (m, k), device="cuda").to(tdt)   # stored operand
    b = torch.randn((n, k) if b_t else (k, n), device="cuda").to(tdt)
    c = torch.randn(m, n, device="cuda")
    d = poison((m, n), torch.float32)
    call(lib().tk_mma, dtype, m, n, k, variant, ptr(a), ptr(b), ptr(c), ptr(d), accumulate)
    A = a.double().T if a_t else a.double()
    B = b.double().T if b_t else b.double()
    ref = A @ B + (c.double() if accumulate else 0)
    assert rel_err(d, ref) < 1e-5


# ---------------------------------------------------------------- maps, reductions, broadcasts, masks, conversions
R, C = 32, 64


def _inputs(dtype, positive=False):
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(R, C, device="cuda", generator=g)
    if positive:
        a = a.abs() + 0.1
    b = torch.randn(R, C, device="cuda", generator=g)
    b = torch.where(b >= 0, b + 0.5, b - 0.5)          # away from 0, for div
    pr = torch.randn(R, device="cuda", generator=g)
    pc = torch.randn(C, device="cuda", generator=g)
    pr = torch.where(pr >= 0, pr + 0.5, pr - 0.5)
    pc = torch.where(pc >= 0, pc + 0.5, pc - 0.5)
    tdt = TORCH_DT[dtype]
    return [t.to(tdt).float().contiguous() for t in (a, b, pr, pc)]   # values the tile holds exactly


def run_tile_op(dtype, layout, op, scalar=0.0, iarg=0, positive=False, out_shape=(R, C)):
    a, b, pr, pc = _inputs(dtype, positive)
    out = poison(out_shape, torch.float32)
    vec = poison((max(R, C),), torch.float32)
    call(lib().tk_tile_op, dtype, layout, ptr(a), ptr(b), ptr(pr), ptr(pc), ptr(out), ptr(vec), op, scalar, iarg)
    return (a.double(), b.double(), pr.double(), pc.double()), out, vec


TILE = [  # (op code, name, reference(a, b, per_row, per_col, scalar), positive inputs)
    (0, "exp", lambda a, b, r, c, s: a.exp(), False),
    (1, "exp2", lambda a, b, r, c, s: torch.exp2(a), False),
    (2, "log", lambda a, b, r, c, s: a.log(), True),
    (22, "log2", lambda a, b, r, c, s: a.log2(), True),
    (3, "add", lambda a, b, r, c, s: a + b, False),
    (4, "sub", lambda a, b, r, c, s: a - b, False),
    (5, "mul", lambda a, b, r, c, s: a * b, False),
    (6, "div", lambda a, b, r, c, s: a / b, False),
    (7, "max", lambda a, b, r, c, s: torch.maximum(a, b), False),
    (8, "min", lambda a, b, r, c, s: torch.minimum(a, b), False),
    (9, "add_scalar", lambda a, b, r, c, s: a + s, False),
    (23, "sub_scalar", lambda a, b, r, c, s: a - s, False),
    (10, "mul_scalar", lambda a, b, r, c, s: a * s, False),
    (24, "div_scalar", lambda a, b, r, c, s: a / s, False),
    (25, "max_scalar", lambda a, b, r, c, s: a.clamp_min(s), False),
    (26, "min_scalar", lambda a, b, r, c, s: a.clamp_max(s), False),
    (11, "neg", lambda a, b, r, c, s: -a, False),
    (12, "abs", lambda a, b, r, c, s: a.abs(), False),
    (13, "relu", lambda a, b, r, c, s: a.relu(), False),
    (14, "sqrt", lambda a, b, r, c, s: a.sqrt(), True),
    (15, "rsqrt", lambda a, b, r, c, s: a.rsqrt(), True),
    (20, "fill", lambda a, b, r, c, s: torch.full_like(a, s), False),
    (16, "zero", lambda a, b, r, c, s: torch.zeros_like(a), False),
    (17, "one", lambda a, b, r, c, s: torch.ones_like(a), False),
    (18, "neg_infty", lambda a, b, r, c, s: torch.full_like(a, -float("inf")), False),
    (19, "pos_infty", lambda a, b, r, c, s: torch.full_like(a, float("inf")), False),
    (21, "copy", lambda a, b, r, c, s: a, False),
    (40, "add_row", lambda a, b, r, c, s: a + r[:, None], False),
    (41, "sub_row", lambda a, b, r, c, s: a - r[:, None], False),
    (42, "mul_row", lambda a, b, r, c, s: a * r[:, None], False),
    (43, "div_row", lambda a, b, r, c, s: a / r[:, None], False),
    (44, "max_row", lambda a, b, r, c, s: torch.maximum(a, r[:, None]), False),
    (45, "min_row", lambda a, b, r, c, s: torch.minimum(a, r[:, None]), False),
    (46, "broadcast_row", lambda a, b, r, c, s: r[:, None].expand(R, C), False),
    (47, "add_col", lambda a, b, r, c, s: a + c[None, :], False),
    (48, "sub_col", lambda a, b, r, c, s: a - c[None, :], False),
    (49, "mul_col", lambda a, b, r, c, s: a * c[None, :], False),
    (50, "div_col", lambda a, b, r, c, s: a / c[None, :], False),
    (51, "max_col", lambda a, b, r, c, s: torch.maximum(a, c[None, :]), False),
    (52, "min_col", lambda a, b, r, c, s: torch.minimum(a, c[None, :]), False),
    (53, "broadcast_col", lambda a, b, r, c, s: c[None, :].expand(R, C), False),
    (70, "copy_via_bf16", lambda a, b, r, c, s: a.to(torch.bfloat16).double(), False),
    (74, "swap_layout_twice", lambda a, b, r, c, s: a, False),
    (71, "swap_layout", lambda a, b, r, c, s: a, False),
]
EXACT = {"max", "min", "max_scalar", "min_scalar", "neg", "abs", "relu", "fill", "zero", "one", "neg_infty",
         "pos_infty", "copy", "max_row", "min_row", "broadcast_row", "max_col", "min_col", "broadcast_col",
         "copy_via_bf16", "swap_layout_twice", "swap_layout"}
DTYPES = [(DT_F32, 0), (DT_F32, 1), (DT_BF16, 0), (DT_BF16, 1)]
DT_IDS = ["f32-row", "f32-col", "bf16-row", "bf16-col"]


def _tol(dtype):
    return 1e-5 if dtype == DT_F32 else 1e-2


def _round(ref, dtype):
    return ref.to(TORCH_DT[dtype]).double()


@needs_gpu
@pytest.mark.parametrize("dtype,layout", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("op,name,ref_fn,positive", TILE, ids=[t[1] for t in TILE])
def test_tile_op(dtype, layout, op, name, ref_fn, positive):
    scalar = 0.75 if name != "div_scalar" else -2.5
    (a, b, pr, pc), out, _ = run_tile_op(dtype, layout, op, scalar=scalar, positive=positive)
    ref = ref_fn(a, b, pr, pc, scalar)
    if name in EXACT:
        torch.testing.assert_close(out.double(), _round(ref, dtype), rtol=0, atol=0)
    else:
        assert rel_err(out, ref) < _tol(dtype), name


REDUCTIONS = [  # (op code, name, reference, length)
    (30, "row_max", lambda a, r, c: a.amax(1), R),
    (31, "row_min", lambda a, r, c: a.amin(1), R),
    (32, "row_sum", lambda a, r, c: a.sum(1), R),
    (33, "row_max_accum", lambda a, r, c: torch.maximum(a.amax(1), r), R),
    (34, "row_sum_accum_in_place", lambda a, r, c: a.sum(1) + r, R),
    (35, "col_max", lambda a, r, c: a.amax(0), C),
    (36, "col_min", lambda a, r, c: a.amin(0), C),
    (37, "col_sum", lambda a, r, c: a.sum(0), C),
    (38, "col_sum_accum", lambda a, r, c: a.sum(0) + c, C),
    (39, "col_max_accum_in_place", lambda a, r, c: torch.maximum(a.amax(0), c), C),
    (80, "vec_exp", lambda a, r, c: r.exp(), R),
    (81, "vec_add_mul", lambda a, r, c: (c + c) * 0.75, C),
    (82, "vec_via_shared", lambda a, r, c: c, C),
]


@needs_gpu
@pytest.mark.parametrize("dtype,layout", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("op,name,ref_fn,length", REDUCTIONS, ids=[t[1] for t in REDUCTIONS])
def test_reduction_and_vector(dtype, layout, op, name, ref_fn, length):
    # bf16 sums accumulate in bf16 (the vector's dtype): keep terms positive so the check is relative
    positive = dtype == DT_BF16 and "sum" in name
    (a, b, pr, pc), out, vec = run_tile_op(dtype, layout, op, scalar=0.75, positive=positive)
    ref = ref_fn(a, pr, pc)
    got = vec[:length]
    assert torch.isnan(vec[length:]).all(), "wrote past the vector's end"
    if "max" in name or "min" in name or name == "vec_via_shared":
        torch.testing.assert_close(got.double(), _round(ref, dtype), rtol=0, atol=0)
    else:
        assert rel_err(got, ref) < (1e-5 if dtype == DT_F32 else 2e-2), name


@needs_gpu
@pytest.mark.parametrize("dtype,layout", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("op", [72, 73], ids=["transpose_sep", "transpose"])
def test_transpose(dtype, layout, op):
    (a, *_), out, _ = run_tile_op(dtype, layout, op, out_shape=(C, R))
    torch.testing.assert_close(out.double(), a.T, rtol=0, atol=0)


MASKS = [  # (op code, name, reference keep(i, j, arg))
    (60, "tril", lambda i, j, k: j - i <= k),
    (61, "triu", lambda i, j, k: j - i >= k),
    (62, "right_fill", lambda i, j, k: j < k),
    (63, "left_fill", lambda i, j, k: j >= k),
    (64, "lower_fill", lambda i, j, k: i < k),
    (65, "upper_fill", lambda i, j, k: i >= k),
]


@needs_gpu
@pytest.mark.parametrize("dtype,layout", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("op,name,keep", MASKS, ids=[m[1] for m in MASKS])
@pytest.mark.parametrize("arg", [0, 5, -7, 19, 40, -40])
@pytest.mark.parametrize("fill", [0.0, float("-inf")], ids=["fill0", "fill-inf"])
def test_mask(dtype, layout, op, name, keep, arg, fill):
    (a, *_), out, _ = run_tile_op(dtype, layout, op, scalar=fill, iarg=arg)
    i = torch.arange(R, device="cuda")[:, None]
    j = torch.arange(C, device="cuda")[None, :]
    ref = torch.where(keep(i, j, arg), a, torch.full_like(a, fill))
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=0)


@needs_gpu
def test_warp_reductions():
    (a, *_), _, vec = run_tile_op(DT_F32, 0, 83)
    x = a.flatten()[:32]
    assert abs(vec[0].item() - x.sum().item()) < 1e-4
    assert vec[1].item() == x.max().item() and vec[2].item() == x.min().item()


if __name__ == "__main__":
    # `python tests/test_tk_ops.py build sm_90a`: build the library ahead of time (no GPU needed).
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        print(build(sys.argv[2]))
    else:
        sys.exit("usage: python tests/test_tk_ops.py build <arch, e.g. sm_90a>")

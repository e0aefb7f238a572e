"""Input checks for the tk ops, in Python, before any call into a C++ extension.

Why in Python: on the H200 (torch 2.11) a c10::Error thrown by a TORCH_CHECK in our extensions
sometimes crashed the process (segfault/abort) instead of raising, in the layernorm, mlp and
attention bindings, at different checks; the cause was not found. So the function that calls
`_ext.module.<fn>` first checks, with these helpers, the same conditions its *_bindings.cpp
checks; bad input never reaches a C++ throw. The C++ checks stay as a second line of defence.

Errors name the op and the argument and say what to do:
  TypeError        not a tensor; a wrong dtype (InputDTypeError, which is also a ValueError,
                   so callers that catch ValueError for every bad input keep working)
  ValueError       everything else: device, shape, strides, alignment, numbers out of range
Each op module has check_* functions with a `cuda` flag: cuda=False skips the device checks,
so tests/test_input_checks.py exercises the shape/dtype/stride logic on CPU.
"""
import math

import torch


class InputDTypeError(TypeError, ValueError):
    """A tensor of the wrong dtype."""


def fail(op, message, error=ValueError):
    raise error(f"{op}: {message}")


def shape_str(shape):
    """(16, 768) / (768,); None (a free size) prints as 'any'."""
    sizes = ["any" if s is None else str(int(s)) for s in shape]
    return "(" + ", ".join(sizes) + ("," if len(sizes) == 1 else "") + ")"


def dtype_str(dtype):
    return str(dtype).replace("torch.", "")


def aligned16(t):
    """The kernels move 16-byte vectors (and TMA wants 16-byte aligned bases)."""
    return t.data_ptr() % 16 == 0


def realign16(t):
    """t (or None), or a fresh copy when t starts off a 16-byte boundary (a view at an odd offset). Called
    inside the custom ops (real tensors; torch.compile never traces data_ptr there)."""
    return t if t is None or aligned16(t) else t.clone(memory_format=torch.contiguous_format)


def require_tensor(op, name, t, *, dtypes=None, ndim=None, min_ndim=None, shape=None, contiguous=False,
                   aligned=False, cuda=True, same_device_as=None, hint=""):
    """Raise unless `t` is a tensor with these properties; the message names `name`.

    dtypes: allowed dtypes. ndim / min_ndim: exact / least number of dimensions. shape: the
    expected shape, None for a free size. contiguous: t.is_contiguous(). aligned: data_ptr on a
    16-byte boundary. cuda: check that t is a CUDA tensor and on the device of `same_device_as`
    ((name, tensor) or None). hint: appended to the dtype message (what to do)."""
    if not isinstance(t, torch.Tensor):
        fail(op, f"{name} must be a tensor, got {type(t).__name__}", TypeError)
    if cuda:
        if not t.is_cuda:
            fail(op, f"{name} must be a CUDA tensor, got one on {t.device}; move it with .cuda() "
                     f"or use the PyTorch reference (--kernels=torch)")
        if same_device_as is not None and t.device != same_device_as[1].device:
            fail(op, f"{name} is on {t.device} but {same_device_as[0]} is on {same_device_as[1].device}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = " or ".join(dtype_str(d) for d in dtypes)
        fail(op, f"{name} must be {allowed}, got {dtype_str(t.dtype)}{hint}", InputDTypeError)
    if ndim is not None and t.dim() != ndim:
        fail(op, f"{name} must be {ndim}-D, got {t.dim()}-D with shape {shape_str(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        fail(op, f"{name} must have at least {min_ndim} dimension(s), got shape {shape_str(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
            fail(op, f"{name} must have shape {shape_str(shape)}, got {shape_str(t.shape)}")
    if contiguous and not t.is_contiguous():
        fail(op, f"{name} must be contiguous, got strides {tuple(t.stride())}; call .contiguous() on it")
    if aligned and not aligned16(t):
        fail(op, f"{name} must start 16-byte aligned (it is a view at an odd offset); "
                 f"pass a fresh tensor or .clone() it")


def on_kernel_device(t):
    """True if tensor t is where the tk kernels run: on a CUDA device. The why_not checks ask
    through this one function (as `checks.on_kernel_device(t)`), so tests/
    test_compile_graph_breaks.py can trace the real why_not code on CPU tensors, with fake
    extensions, by swapping it for one that says True."""
    return t.is_cuda


def require_same_dtype(op, name, t, other_name, other):
    if t.dtype != other.dtype:
        fail(op, f"{name} is {dtype_str(t.dtype)} but {other_name} is {dtype_str(other.dtype)}; "
                 f"cast one of them", InputDTypeError)


# float32 limits for a double rounded to float32 (round to nearest even): anything from this up
# becomes inf, anything up to 2^-150 becomes 0. Plain comparisons: why_not runs under torch.compile.
FLOAT32_OVERFLOW = 3.4028235677973366e38
FLOAT32_UNDERFLOW = 2.0 ** -150


def require_number(op, name, value, *, minimum=None, positive=False, float32=False):
    """A finite real number (>= minimum, > 0 if positive). float32: also after rounding to
    float32, as the kernels take it (1e300 would become inf, 1e-50 would become 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(op, f"{name} must be a number, got {type(value).__name__}", TypeError)
    limit = FLOAT32_OVERFLOW if float32 else math.inf
    ok = -limit < value < limit and (minimum is None or value >= minimum)
    ok = ok and (not positive or value > (FLOAT32_UNDERFLOW if float32 else 0))
    if not ok:
        rule = "a finite positive number" if positive else f"finite and >= {minimum}"
        fail(op, f"{name} must be {rule}" + (" (as the float32 the kernel takes)" if float32 else "") + f", got {value}")


def bf16_preflight(what, n_embd, dtype, device, multiple, build_why_not):
    """The start-up check shared by the bf16-only GEMM ops (mlp, linear): None if `what` can run
    for this model configuration, else the reason; build_why_not() builds the extension now."""
    if not str(device).startswith("cuda"):
        return f"device={device}; the tk kernel needs CUDA"
    if dtype != torch.bfloat16:
        return f"dtype={dtype}; {what} computes in bfloat16 (use --dtype=bfloat16)"
    if n_embd % multiple:
        return f"n_embd={n_embd} is not a multiple of {multiple}"
    return build_why_not()

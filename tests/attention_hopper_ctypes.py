"""Call the Hopper attention launcher from a prebuilt shared library, through ctypes.

Why this exists: building the torch extension (kernels/attention_hopper.py) costs a minute of
nvcc on a fresh GPU machine, and our GPU time is rationed. kernels/attention_hopper.cu has no
torch in it, so it can be built ahead of time, anywhere nvcc 13 is, into a plain .so:

    nvcc -O3 -std=c++20 -lineinfo -gencode=arch=compute_90a,code=sm_90a -I. -Ikernels \
         -shared -Xcompiler -fPIC -cudart static \
         kernels/attention_hopper.cu -o build/libtk_attention_hopper.so

and the tests/bench call its C entry points (`tk_attention_hopper_forward`, `..._why_not`) here.
Point TK_ATTENTION_HOPPER_LIB at the .so to use it; without it the tests use the torch
extension. Same kernel, same launcher, only the Python-side glue differs.
"""
import ctypes
import math
import os

import torch


class AttentionTensor(ctypes.Structure):      # mirrors kernels/attention_params.h
    _fields_ = [("data", ctypes.c_void_p), ("stride_batch", ctypes.c_int64),
                ("stride_head", ctypes.c_int64), ("stride_seq", ctypes.c_int64)]


class AttentionShape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("seq_len", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("causal", ctypes.c_bool), ("scale", ctypes.c_float)]


class AttentionForwardParams(ctypes.Structure):
    _fields_ = [("shape", AttentionShape), ("q", AttentionTensor), ("k", AttentionTensor),
                ("v", AttentionTensor), ("o", AttentionTensor), ("lse", ctypes.c_void_p)]


_lib = None


def library():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(os.environ["TK_ATTENTION_HOPPER_LIB"])
        _lib.tk_attention_hopper_forward.argtypes = [ctypes.POINTER(AttentionForwardParams), ctypes.c_void_p, ctypes.c_int,
                                                     ctypes.c_void_p]
        _lib.tk_attention_hopper_forward.restype = ctypes.c_int
        _lib.tk_attention_hopper_why_not.argtypes = [ctypes.POINTER(AttentionForwardParams)]
        _lib.tk_attention_hopper_why_not.restype = ctypes.c_char_p
    return _lib


def _view(t):
    return AttentionTensor(t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))


def forward(q, k, v, causal=True, scale=None, variant=0, poison=True):
    """Same contract as kernels.attention_hopper.forward; outputs start as NaN (poisoned), or
    uninitialised with poison=False (for timing)."""
    B, H, T, D = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    o = torch.empty((B, T, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    if poison:
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
    p = AttentionForwardParams(AttentionShape(B, H, T, D, bool(causal), float(scale)),
                               _view(q), _view(k), _view(v), _view(o), lse.data_ptr())
    why = library().tk_attention_hopper_why_not(ctypes.byref(p))
    if why is not None:
        raise ValueError(f"tk Hopper attention cannot take these inputs: {why.decode()}")
    stream = torch.cuda.current_stream(q.device).cuda_stream
    work_counter = torch.zeros(1, dtype=torch.int32, device=q.device)   # this call's own (dynamic scheduling)
    err = library().tk_attention_hopper_forward(ctypes.byref(p), ctypes.c_void_p(stream), int(variant),
                                                ctypes.c_void_p(work_counter.data_ptr()))
    if err != 0:
        raise RuntimeError(f"tk Hopper attention launch failed: CUDA error {err}")
    return o, lse

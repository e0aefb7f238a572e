// tests/tk/tk_test.cuh: shared bits of the GPU test library for tk/ (tests/test_tk_ops.py).
// The library is plain CUDA C++ with extern "C" launchers that take raw device pointers, built
// by nvcc into one shared object and called through ctypes: no torch headers, so it builds in
// seconds and can be built ahead of time. Each launcher returns 0 on success, a CUDA error code
// after a failed launch, or -1 when the requested combination is not instantiated.
// Read this, then tk_test_memory.cu, tk_test_mma.cu, tk_test_ops.cu.
#pragma once
#include <cuda_runtime.h>
#include "tk/tk.cuh"

#define TK_TEST_API extern "C" __attribute__((visibility("default")))

// dtype codes shared with the Python side
enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

inline int finish_launch() {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return int(e);
}

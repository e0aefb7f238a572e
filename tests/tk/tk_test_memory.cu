// tests/tk/tk_test_memory.cu: round trips through every swizzle width and both register layouts:
// global -> shared (load or cp.async, with a row tail) -> registers (ldmatrix / plain) ->
// shared (stmatrix / plain) or straight to global -> global. Also the bare swizzle offsets.
// Read after tk_test.cuh.
#include "tk_test.cuh"
using namespace tk;

// The name of a launcher's error code, for the test's message (e.g. cudaErrorMemoryAllocation).
TK_TEST_API const char* tk_error_name(int code) { return cudaGetErrorName(cudaError_t(code)); }

// mode bit 0: cp.async instead of a synchronous load into shared
// mode bit 1: registers -> global directly (store with rows_valid: tail rows stay untouched)
// mode bit 2: global -> registers directly (load with rows_valid), skipping the first shared tile
template <typename T, int R, int C, typename L, int WARPS, typename RT_T>
__global__ void roundtrip_kernel(const T* in, T* out, int stride, int rows_valid, int mode) {
    using G = group<WARPS>;
    __shared__ st<T, R, C> s1, s2;
    rt<RT_T, R / WARPS, C, L> r;
    if (mode & 4) {
        load<G>(r, in, stride, rows_valid);
    } else {
        if (mode & 1) {
            load_async<G>(s1, in, stride, rows_valid);
            cp_async_commit();
            cp_async_wait<0>();
        } else {
            load<G>(s1, in, stride, rows_valid);
        }
        __syncthreads();
        load<G>(r, s1);
    }
    if (mode & 2) {
        store<G>(out, r, stride, rows_valid);
    } else {
        store<G>(s2, r);
        __syncthreads();
        store<G>(out, s2, stride);
    }
}

template <typename T, int R, int C>
__global__ void swizzle_offsets_kernel(int* out) {
    for (int k = threadIdx.x; k < R * C; k += blockDim.x) out[k] = int(st<T, R, C>::offset(k / C, k % C));
}

template <typename T, int R, int C, typename L, int WARPS, typename RT_T>
int launch_roundtrip(const void* in, void* out, int stride, int rows_valid, int mode) {
    roundtrip_kernel<T, R, C, L, WARPS, RT_T><<<1, 32 * WARPS>>>((const T*)in, (T*)out, stride, rows_valid, mode);
    return finish_launch();
}

// dtype: tile dtype in memory; rt_dtype: dtype of the register tile in between; layout 0 = row_l, 1 = col_l
TK_TEST_API int tk_roundtrip(int dtype, int rt_dtype, int rows, int cols, int layout, int warps,
                             const void* in, void* out, int stride, int rows_valid, int mode) {
#define TK_RT(DT, T, RDT, RT_T, R, C, LI, L, W) \
    if (dtype == DT && rt_dtype == RDT && rows == R && cols == C && layout == LI && warps == W) \
        return launch_roundtrip<T, R, C, L, W, RT_T>(in, out, stride, rows_valid, mode);
#define TK_RT_BOTH(DT, T, RDT, RT_T, R, C, W) TK_RT(DT, T, RDT, RT_T, R, C, 0, row_l, W) TK_RT(DT, T, RDT, RT_T, R, C, 1, col_l, W)
    TK_RT_BOTH(DT_BF16, bf16, DT_BF16, bf16, 16, 16, 1)    // 32B swizzle
    TK_RT_BOTH(DT_BF16, bf16, DT_BF16, bf16, 32, 32, 1)    // 64B
    TK_RT_BOTH(DT_BF16, bf16, DT_BF16, bf16, 32, 64, 1)    // 128B
    TK_RT_BOTH(DT_BF16, bf16, DT_BF16, bf16, 32, 128, 1)   // 128B, two column blocks
    TK_RT_BOTH(DT_BF16, bf16, DT_BF16, bf16, 16, 48, 1)    // 32B, three column blocks
    TK_RT_BOTH(DT_BF16, bf16, DT_BF16, bf16, 64, 64, 4)    // warpgroup
    TK_RT_BOTH(DT_F16, half, DT_F16, half, 32, 64, 1)
    TK_RT_BOTH(DT_F32, float, DT_F32, float, 16, 16, 1)    // fp32: 64B
    TK_RT_BOTH(DT_F32, float, DT_F32, float, 32, 32, 1)    // fp32: 128B
    TK_RT_BOTH(DT_F32, float, DT_F32, float, 64, 32, 4)
    TK_RT_BOTH(DT_BF16, bf16, DT_F32, float, 32, 64, 1)    // bf16 shared <-> fp32 registers
#undef TK_RT_BOTH
#undef TK_RT
    return -1;
}

TK_TEST_API int tk_swizzle_offsets(int dtype, int rows, int cols, void* out) {
#define TK_SW(DT, T, R, C) \
    if (dtype == DT && rows == R && cols == C) { swizzle_offsets_kernel<T, R, C><<<1, 256>>>((int*)out); return finish_launch(); }
    TK_SW(DT_BF16, bf16, 16, 16) TK_SW(DT_BF16, bf16, 32, 32) TK_SW(DT_BF16, bf16, 64, 64)
    TK_SW(DT_BF16, bf16, 32, 128) TK_SW(DT_BF16, bf16, 16, 48) TK_SW(DT_F32, float, 32, 32)
#undef TK_SW
    return -1;
}

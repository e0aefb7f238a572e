// kernels/gemm.cuh — what every GEMM step shares: the plain-C++ launch arguments (no torch here,
// so the .cu files compile fast) and the epilogue hook (bias, GELU) applied to each output value.
// Read before any kernels/gemm_<n>_*.cu; the Python side is kernels/gemm.py.
//
// The product is C[M][N] = A·B with A: M x K and B: K x N, bf16 in, fp32 accumulate. How A and B
// sit in memory is given by two flags, which is all that separates the three products of a
// linear layer (x: tokens x in, W: out x in, dy: tokens x out):
//   y  = x·Wᵀ   A = x  [M][K] (K-major)    B = W  [N][K] (K-major)
//   dx = dy·W   A = dy [M][K] (K-major)    B = W  [K][N] (N-major)
//   dW = dyᵀ·x  A = dy [K][M] (M-major)    B = x  [K][N] (N-major)
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace gemm {

struct args {
    const void* a;        // bf16, [M][K], or [K][M] if a_mn_major
    const void* b;        // bf16, [N][K], or [K][N] if b_mn_major
    void* c;              // [M][N], bf16 or fp32
    int M, N, K;
    bool a_mn_major, b_mn_major;
    bool c_fp32;
    const void* bias;     // bf16 [N] added to every row, or nullptr
    bool gelu;            // apply GELU(tanh) after the bias
    int splits;           // split-K factor (step 4): > 1 reduce-adds fp32 partials into a zeroed c
    int num_sms;          // persistent grid size (step 4)
    int variant;          // step 4 pipeline configuration (0 = default; see gemm_4_warp_specialized.cu)
    cudaStream_t stream;
    // Split-K finished in the kernel (step 5 variant 8: kernels/gemm_splitk_epilogue.cuh): fp32
    // running sums and per-(tile, warp) arrival counters, both all zero between calls (the kernel
    // leaves them so), and how many of each the caller allocated. Unused otherwise (nullptr).
    float* splitk_sums = nullptr;
    int* splitk_arrivals = nullptr;
    long long splitk_sums_count = 0, splitk_arrivals_count = 0;
    // The work schedule of step 5 variant 10 and step 4 variant 9 (kernels/gemm.py
    // stream_schedule): schedule_units entries of
    // 4 int32 {tile row, tile column, k_begin, k_end}, unit u on CTA u % schedule_grid.
    const int* schedule = nullptr;
    int schedule_units = 0, schedule_grid = 0;
};

// Each step's launcher returns nullptr on success, else a message (shape unsupported, launch error).
const char* step1_warp_mma(const args&);
const char* step2_cp_async(const args&);
const char* step3_wgmma_tma(const args&);
const char* step4_warp_specialized(const args&);
const char* step5_pingpong(const args&);             // experimental: not yet run on the H200

#ifdef __CUDACC__
}  // namespace gemm
#include <cuda_bf16.h>
namespace gemm {
// The epilogue hook: every output value passes through apply(v, col) on its way out of the
// accumulators. Fused bias and GELU live here; anything elementwise per column can be added.
struct epilogue {
    const __nv_bfloat16* bias;   // nullptr: no bias
    bool gelu;
    __device__ __forceinline__ float apply(float v, int col) const {
        if (bias) v += __bfloat162float(bias[col]);
        if (gelu) v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        return v;
    }
    __device__ __forceinline__ bool identity() const { return !bias && !gelu; }
};
#endif

}  // namespace gemm

// kernels/mlp_finish.cu — the MLP backward's small tail in one launch (session 5, opt-in "finish=1"):
// the bias gradients' column sums and the weight gradients' fp32 -> bf16 casts.
//
// Why: after its four GEMMs the backward still had six small kernels, ~30 µs of ~600 at M = 16384
// (session 4's profile): torch's sum over the dGELU GEMM's db1 partials ([M/16][4C] fp32, 9.4 µs),
// its sum over the side job's per-CTA dy sums ([SMs][C], 9.4 µs: a tiny reduction that still
// costs a full launch and a slow reduce plan), and four casts to bf16 (two dW, two db, ~2.7 µs
// each). Here one grid does all of it: the first blocks sum columns, the rest cast.
//
// Column sums: a block owns 16 columns (4 threads x float4) and splits the rows over 64 thread
// rows, each with 8 loads in flight; a tree over shared memory adds the 64 partial sums. The
// order of additions is fixed, so the result is the same on every run.
//
// Read in order: the kernel, the launcher. The declaration and argument struct are in kernels/mlp.h.
#include <algorithm>
#include <cuda_bf16.h>
#include "mlp.h"

namespace {

constexpr int THREADS = 256, QUADS = 4, ROW_GROUPS = THREADS / QUADS, COLS_PER_BLOCK = 4 * QUADS;

__device__ __forceinline__ float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

__device__ __forceinline__ void store_bf16x4(void* out, long long i, float4 v) {   // 4 values at element i
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 packed = make_uint2(*reinterpret_cast<unsigned int*>(&lo), *reinterpret_cast<unsigned int*>(&hi));
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(out) + i) = packed;
}

__global__ void __launch_bounds__(THREADS) finish_kernel(const tk_mlp::finish_args a, int blocks_a, int blocks_b) {
    const int b = blockIdx.x;
    if (b < blocks_a + blocks_b) {
        // ---- column sums: block b owns columns [16·c0, 16·c0 + 16) of matrix A or B
        const bool is_a = b < blocks_a;
        const float* src = is_a ? a.sum_a : a.sum_b;
        const int rows = is_a ? a.rows_a : a.rows_b, cols = is_a ? a.cols_a : a.cols_b;
        const int q = threadIdx.x % QUADS, y = threadIdx.x / QUADS;
        const int col = COLS_PER_BLOCK * (is_a ? b : b - blocks_a) + 4 * q;
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
        const float* p = src + size_t(y) * cols + col;
        const size_t step = size_t(ROW_GROUPS) * cols;
        int r = y;
        for (; r + 7 * ROW_GROUPS < rows; r += 8 * ROW_GROUPS, p += 8 * step) {   // 8 loads in flight
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = __ldg(reinterpret_cast<const float4*>(p + u * step));
#pragma unroll
            for (int u = 0; u < 8; ++u) s = add4(s, v[u]);
        }
        for (; r < rows; r += ROW_GROUPS, p += step) s = add4(s, __ldg(reinterpret_cast<const float4*>(p)));
        __shared__ float4 partial[ROW_GROUPS][QUADS];
        partial[y][q] = s;
        __syncthreads();
#pragma unroll
        for (int w = ROW_GROUPS / 2; w >= 1; w /= 2) {
            if (y < w) partial[y][q] = add4(partial[y][q], partial[y + w][q]);
            __syncthreads();
        }
        if (y == 0) store_bf16x4(is_a ? a.out_a : a.out_b, col, partial[0][q]);
        return;
    }
    // ---- casts: the remaining blocks walk the fp32 weight gradients 4 floats at a time
    const long long first = (long long)(b - blocks_a - blocks_b) * THREADS + threadIdx.x;
    const long long stride = (long long)(gridDim.x - blocks_a - blocks_b) * THREADS;
    for (long long i4 = first; 4 * i4 < a.cast_n; i4 += stride) {
        const long long i = 4 * i4;
        const float4 v = __ldg(reinterpret_cast<const float4*>(a.cast_in) + i4);
        if (i < a.cast_split) store_bf16x4(a.cast_out0, i, v);
        else store_bf16x4(a.cast_out1, i - a.cast_split, v);
    }
}

}  // namespace

namespace tk_mlp {

const char* finish_backward(const finish_args& a) {
    if ((a.sum_a && a.cols_a % COLS_PER_BLOCK) || (a.sum_b && a.cols_b % COLS_PER_BLOCK) || a.cast_n % 4 || a.cast_split % 4)
        return "tk_mlp: finish_backward needs column counts that are multiples of 16 and cast sizes that are multiples of 4";
    const int blocks_a = a.sum_a ? a.cols_a / COLS_PER_BLOCK : 0, blocks_b = a.sum_b ? a.cols_b / COLS_PER_BLOCK : 0;
    // casts: enough blocks to fill the GPU twice over, at least one
    const long long cast_blocks = std::clamp<long long>((a.cast_n / 4 + THREADS - 1) / THREADS, 1, 2LL * std::max(a.num_sms, 1));
    finish_kernel<<<int(blocks_a + blocks_b + cast_blocks), THREADS, 0, a.stream>>>(a, blocks_a, blocks_b);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace tk_mlp

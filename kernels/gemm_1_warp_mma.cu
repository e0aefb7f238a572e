// kernels/gemm_1_warp_mma.cu — GEMM step 1: warp-level tensor-core mma, operands read straight
// from global memory.
//
// The first step off the CUDA cores: each warp owns a 32 x 32 block of C as four 16x16 fp32
// register tiles (tk::rt_fl<32, 32>) and walks K 16 at a time, loading A and W fragments from
// global memory directly into the register layout mma.sync.m16n8k16 wants (tk/types/rt_base.cuh),
// one 32-bit load per bf16 pair. Nothing is shared between warps, so every fragment is fetched
// from L2 by every warp that needs it: correct and short, but bound by load latency.
// What it bought: the baseline, 57 TFLOP/s at 8192³ on the H200 (0.08× cuBLAS; kernels/NOTES.md).
//
// Computes C = A·Bᵀ with A [M][K] and B [N][K] (the y = x·Wᵀ layout; kernels/gemm.py transposes
// the other products). Runs on sm_80 and later. Read in order: mma, fragment loads, kernel, launcher.
#include "gemm.cuh"
#include "tk/types/types.cuh"

namespace {
using namespace tk;

// D += A·Bᵀ on 16x16 fragments: two mma.m16n8k16, one per 8-column half of D.
// B is held like A (rows = n, pairs along k), so n-half j uses pairs (j, j + 2).
__device__ inline void mma_ABt_base(rt_base<float, row_l>& d, const rt_base<bf16, row_l>& a, const rt_base<bf16, row_l>& b) {
    const uint32_t* A = reinterpret_cast<const uint32_t*>(a.data);
    const uint32_t* B = reinterpret_cast<const uint32_t*>(b.data);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        float* D = reinterpret_cast<float*>(&d.data[2 * j]);   // pairs 2j, 2j+1 = rows g, g+8
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(D[0]), "+f"(D[1]), "+f"(D[2]), "+f"(D[3])
                     : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[j]), "r"(B[j + 2]));
    }
}

// Load rows [row0, row0 + R) x cols [k0, k0 + 16) of a row-major bf16 matrix into a row_l
// register tile, one 32-bit pair at a time; rows at or past `rows` read as zero (the M tail).
template <int R>
__device__ inline void load_fragments(rt<bf16, R, 16>& dst, const bf16* src, int rows, int ld, int row0, int k0) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int r = row0 + 16 * i + rt_base<bf16, row_l>::row(q, 0), c = k0 + rt_base<bf16, row_l>::col(q, 0);
            dst.tiles[i][0].data[q] = r < rows ? *reinterpret_cast<const bf16_2*>(&src[size_t(r) * ld + c])
                                               : make_pair<bf16_2>(__float2bfloat16(0.f), __float2bfloat16(0.f));
        }
}

constexpr int WARP_M = 32, WARP_N = 32, WARPS_M = 2, WARPS_N = 2;
constexpr int BM = WARP_M * WARPS_M, BN = WARP_N * WARPS_N;

template <typename OutT>
__global__ void __launch_bounds__(128) gemm_warp_mma_kernel(const bf16* A, const bf16* B, OutT* C, int M, int N, int K) {
    const int warp = threadIdx.x / 32;
    const int row0 = blockIdx.y * BM + (warp / WARPS_N) * WARP_M;
    const int col0 = blockIdx.x * BN + (warp % WARPS_N) * WARP_N;
    rt_fl<WARP_M, WARP_N> acc;
#pragma unroll
    for (int i = 0; i < WARP_M / 16; ++i)
#pragma unroll
        for (int j = 0; j < WARP_N / 16; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc.tiles[i][j].data[q] = make_float2(0.f, 0.f);

    for (int k0 = 0; k0 < K; k0 += 16) {
        rt_bf<WARP_M, 16> a;
        rt_bf<WARP_N, 16> b;
        load_fragments(a, A, M, K, row0, k0);
        load_fragments(b, B, N, K, col0, k0);
#pragma unroll
        for (int i = 0; i < WARP_M / 16; ++i)
#pragma unroll
            for (int j = 0; j < WARP_N / 16; ++j) mma_ABt_base(acc.tiles[i][j], a.tiles[i][0], b.tiles[j][0]);
    }
#pragma unroll
    for (int i = 0; i < WARP_M / 16; ++i)
#pragma unroll
        for (int j = 0; j < WARP_N / 16; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                int r = row0 + 16 * i + rt_base<float, row_l>::row(q, 0), c = col0 + 16 * j + rt_base<float, row_l>::col(q, 0);
                if (r < M && c < N) {
                    float2 v = acc.tiles[i][j].data[q];
                    if constexpr (sizeof(OutT) == 2) *reinterpret_cast<bf16_2*>(&C[size_t(r) * N + c]) = __floats2bfloat162_rn(v.x, v.y);
                    else *reinterpret_cast<float2*>(&C[size_t(r) * N + c]) = v;
                }
            }
}
}  // namespace

const char* gemm::step1_warp_mma(const gemm::args& g) {
    if (g.a_mn_major || g.b_mn_major) return "gemm step 1 takes A [M][K] and B [N][K] only";
    if (g.bias || g.gelu || g.splits > 1) return "gemm step 1 has no epilogue options";
    dim3 grid((g.N + BN - 1) / BN, (g.M + BM - 1) / BM);
    auto A = static_cast<const bf16*>(g.a), B = static_cast<const bf16*>(g.b);
    if (g.c_fp32) gemm_warp_mma_kernel<float><<<grid, 128, 0, g.stream>>>(A, B, static_cast<float*>(g.c), g.M, g.N, g.K);
    else gemm_warp_mma_kernel<bf16><<<grid, 128, 0, g.stream>>>(A, B, static_cast<bf16*>(g.c), g.M, g.N, g.K);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

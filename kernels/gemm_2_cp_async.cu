// kernels/gemm_2_cp_async.cu — GEMM step 2: shared tiles and a multi-stage cp.async pipeline.
//
// What changes from step 1: a CTA of 8 warps stages 128 x 32 tiles of A and B in shared memory
// (tk::st, swizzled so ldmatrix is free of bank conflicts) and every warp reads its fragments
// from there with ldmatrix (tk::load(rt, st, row, col)), so each byte comes from global memory
// once per CTA instead of once per warp. The copies are cp.async (global -> shared without
// passing through registers), STAGES tiles ahead of the math, so loads overlap mma.
// What it bought: 335 TFLOP/s at 8192³, 5.8× step 1 (0.50× cuBLAS; kernels/NOTES.md).
//
// Same interface as step 1 (A [M][K], B [N][K]); runs on sm_80 and later.
// Read in order: cp.async helpers, tile loader, kernel (prologue, main loop, epilogue), launcher.
#include "gemm.cuh"
#include "tk/types/types.cuh"
#include "tk/ops/warp/memory_shared.cuh"

namespace {
using namespace tk;

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 4;
constexpr int WARPS_M = 2, WARPS_N = 4, THREADS = 32 * WARPS_M * WARPS_N;
constexpr int WARP_M = BM / WARPS_M, WARP_N = BN / WARPS_N;   // 64 x 32 per warp

using tile = st<bf16, BM, BK>;   // 64-byte rows -> 64B swizzle
static_assert(BM == BN, "A and B tiles share one type here");

// 16 bytes global -> shared, asynchronously; `valid` false writes 16 zero bytes (the M tail).
__device__ inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// All THREADS threads copy rows [row0, row0+BM) x cols [k0, k0+BK) into a swizzled tile:
// 128 rows x 4 chunks of 16 bytes = 512 chunks, 2 per thread.
__device__ inline void load_tile_async(tile& dst, const bf16* src, int rows, int ld, int row0, int k0) {
#pragma unroll
    for (int i = 0; i < BM * BK / 8 / THREADS; ++i) {
        int chunk = threadIdx.x + i * THREADS;
        int r = chunk / (BK / 8), c = (chunk % (BK / 8)) * 8;
        bool valid = row0 + r < rows;
        const bf16* p = src + size_t(valid ? row0 + r : 0) * ld + k0 + c;
        cp_async_16(dst.addr(r, c), p, valid);
    }
}

// D += A·Bᵀ on 16x16 fragments (see step 1).
__device__ inline void mma_ABt_base(rt_base<float, row_l>& d, const rt_base<bf16, row_l>& a, const rt_base<bf16, row_l>& b) {
    const uint32_t* A = reinterpret_cast<const uint32_t*>(a.data);
    const uint32_t* B = reinterpret_cast<const uint32_t*>(b.data);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        float* D = reinterpret_cast<float*>(&d.data[2 * j]);
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(D[0]), "+f"(D[1]), "+f"(D[2]), "+f"(D[3])
                     : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[j]), "r"(B[j + 2]));
    }
}

template <typename OutT>
__global__ void __launch_bounds__(THREADS) gemm_cp_async_kernel(const bf16* A, const bf16* B, OutT* C, int M, int N, int K) {
    extern __shared__ char smem_raw[];
    shared_allocator alloc(smem_raw);
    auto& a_s = alloc.allocate<tile, STAGES>();
    auto& b_s = alloc.allocate<tile, STAGES>();
    const int warp = threadIdx.x / 32, wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int k_tiles = K / BK;   // K is a multiple of 32 here; the launcher pads otherwise

    rt_fl<WARP_M, WARP_N> acc;
#pragma unroll
    for (int i = 0; i < WARP_M / 16; ++i)
#pragma unroll
        for (int j = 0; j < WARP_N / 16; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc.tiles[i][j].data[q] = make_float2(0.f, 0.f);

    // Prologue: STAGES-1 tiles in flight. Each stage is one commit group (possibly empty).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) {
            load_tile_async(a_s[s], A, M, K, row0, s * BK);
            load_tile_async(b_s[s], B, N, K, col0, s * BK);
        }
        cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();   // this thread's copies of tile kt have landed
        __syncthreads();               // ... and everyone's; also: all are done with tile kt-1
        int next = kt + STAGES - 1;    // refill the slot that held tile kt-1
        if (next < k_tiles) {
            load_tile_async(a_s[next % STAGES], A, M, K, row0, next * BK);
            load_tile_async(b_s[next % STAGES], B, N, K, col0, next * BK);
        }
        cp_async_commit();
        const tile& a_t = a_s[kt % STAGES];
        const tile& b_t = b_s[kt % STAGES];
#pragma unroll
        for (int k = 0; k < BK; k += 16) {
            rt_bf<WARP_M, 16> a;
            rt_bf<WARP_N, 16> b;
            load(a, a_t, wm * WARP_M, k);
            load(b, b_t, wn * WARP_N, k);
#pragma unroll
            for (int i = 0; i < WARP_M / 16; ++i)
#pragma unroll
                for (int j = 0; j < WARP_N / 16; ++j) mma_ABt_base(acc.tiles[i][j], a.tiles[i][0], b.tiles[j][0]);
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < WARP_M / 16; ++i)
#pragma unroll
        for (int j = 0; j < WARP_N / 16; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                int r = row0 + wm * WARP_M + 16 * i + rt_base<float, row_l>::row(q, 0);
                int c = col0 + wn * WARP_N + 16 * j + rt_base<float, row_l>::col(q, 0);
                if (r < M && c < N) {
                    float2 v = acc.tiles[i][j].data[q];
                    if constexpr (sizeof(OutT) == 2) *reinterpret_cast<bf16_2*>(&C[size_t(r) * N + c]) = __floats2bfloat162_rn(v.x, v.y);
                    else *reinterpret_cast<float2*>(&C[size_t(r) * N + c]) = v;
                }
            }
}

template <typename OutT>
const char* launch(const gemm::args& g) {
    auto kernel = gemm_cp_async_kernel<OutT>;
    constexpr int smem_bytes = 2 * STAGES * sizeof(tile) + 1024;
    static bool configured = false;
    if (!configured) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess)
            return "gemm step 2: could not reserve shared memory";
        configured = true;
    }
    dim3 grid((g.N + BN - 1) / BN, (g.M + BM - 1) / BM);
    kernel<<<grid, THREADS, smem_bytes, g.stream>>>(static_cast<const bf16*>(g.a), static_cast<const bf16*>(g.b),
                                                    static_cast<OutT*>(g.c), g.M, g.N, g.K);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}
}  // namespace

const char* gemm::step2_cp_async(const gemm::args& g) {
    if (g.a_mn_major || g.b_mn_major) return "gemm step 2 takes A [M][K] and B [N][K] only";
    if (g.bias || g.gelu || g.splits > 1) return "gemm step 2 has no epilogue options";
    if (g.K % BK) return "gemm step 2 needs K to be a multiple of 32";
    return g.c_fp32 ? launch<float>(g) : launch<bf16>(g);
}

// kernels/gemm_splitk_epilogue.cuh — split-K finished inside the kernel: the weight gradient's
// partial sums meet in a workspace that the kernel itself leaves zeroed, and the LAST split to
// finish a tile stores the tile's final values (bf16 or fp32) by TMA. Step 5 variants 8 and 9
// (kernels/gemm_5_pingpong.cu). Read after kernels/gemm_plain_epilogue.cuh (whose store_slab
// stores the final values) and the STORES_TILE hook in kernels/gemm_5_pingpong.cuh.
//
// Why (session 7): the weight gradient dW = dyᵀ·x has few output tiles (768 x 3072: 144 of
// 128x128) and a long K (the tokens), so its K range is cut into `splits` pieces run by
// different CTAs. Until now each piece TMA-reduce-added its fp32 partial into an output that a
// memset had zeroed first, and a separate kernel converted the fp32 sum to bf16: two extra
// kernels and ~8-10 µs per call around a ~130 µs product, which left two GPT-2 dW shapes at
// 0.91-0.93x cuBLAS although the GEMM kernel alone ran at 0.99-1.02x (kernels/NOTES.md, session 6).
//
// How, per consumer warp and tile (each warp owns 16 rows of each 64-row slab of its tile):
//   1. add: red.global.add.v4.f32 of the warp's accumulators into its own piece of the
//      workspace, in ACCUMULATOR order (thread t's 4 values j sit at [j][t], so one warp
//      instruction adds 512 contiguous bytes: no staging through shared memory, no swizzle)
//   2. arrive: fence (the warp's adds are performed at gpu scope), then lane 0 bumps the
//      piece's arrival counter (atomic, acquire-release) and learns how many splits came before
//   3. the split that sees splits - 1 earlier arrivals is the last: after a fence it reads the
//      complete sum back (L2-only loads) into its accumulators, writes zeros over the piece
//      and resets the counter (so the NEXT call finds both zero: nothing to clear per call),
//      and stores the values like the plain product (stmatrix staging, TMA store, no reduce)
//   Every other split is done after step 2. No CTA ever waits for another: a split arrives
//   only after its own adds, and whoever arrives last finishes, so there is no order to keep
//   and nothing to deadlock on in a persistent grid.
// The summation order of the splits varies from run to run (as with the TMA reduce-add before):
// results agree with an fp32 reference to rounding, not bit for bit between runs.
//
// The workspace: sums = tiles x BM x BN floats, arrivals = tiles x 4 ints, zero at allocation
// (kernels/gemm.py keeps one pair per device and shape and documents its lifetime: one product of
// a shape at a time per device, i.e. not two of the same shape concurrently on two streams).
#pragma once
#include "gemm_plain_epilogue.cuh"

namespace gemm4 {

// One warp instruction adds 32 x 16 contiguous bytes into L2 (sm_90's vector red).
__device__ __forceinline__ void red_add_v4(float4* p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
#else
    atomicAdd(&p->x, v.x); atomicAdd(&p->y, v.y); atomicAdd(&p->z, v.z); atomicAdd(&p->w, v.w);
#endif
}

// A gpu-scope acquire-release fence (__threadfence() is the heavier sequentially consistent one).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// atomicAdd with acquire-release semantics at gpu scope: it publishes what this warp wrote before
// it (release) and, for the last arriver, makes the others' published writes visible (acquire).
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

template <typename OutT>
struct splitk_epilogue : plain_epilogue<OutT> {
    using base = plain_epilogue<OutT>;
    static constexpr bool STORES_TILE = true;   // gemm5's kernel hands a consumer's whole tile to store_tile
    float4* sums;        // [tile][warp][slab][float4 j][lane]: the running fp32 sums, zero between calls
    int* arrivals;       // [tile][warp]: splits whose partial is in sums, zero between calls

    // Consumer warp `warp` of a tile of SLABS x 64 rows by Acc::cols: all its slabs at once.
    template <int NBUF, typename CTile, typename Acc, int SLABS>
    __device__ __forceinline__ void store_tile(CTile (&bufs)[NBUF], Acc (&acc)[SLABS], const tile_pos (&pos)[SLABS],
                                               const shape& sh, int lane) const {
        if (sh.splits > 1 && !finish_sum(acc, pos, sh, lane)) return;   // another split stores this tile
        shape whole = sh;
        whole.splits = 1;                 // the final values: plain_epilogue stores, it does not reduce-add
#pragma unroll
        for (int h = 0; h < SLABS; ++h) base::store_slab(bufs, acc[h], pos[h], whole, lane);
    }

    // Steps 1-3 above. Returns true in the last split, with acc holding the whole sum.
    template <typename Acc, int SLABS>
    __device__ __forceinline__ bool finish_sum(Acc (&acc)[SLABS], const tile_pos (&pos)[SLABS], const shape& sh,
                                               int lane) const {
        constexpr int V = Acc::cols / 8;                 // float4s per thread per slab
        constexpr int BM = 64 * SLABS;
        const int warp = (pos[0].slab_row % 64) / 16;
        const int tile = (pos[0].slab_row / BM) * sh.tiles_n + pos[0].tile_col / Acc::cols;
        const int piece = tile * 4 + warp;
        float4* mine = sums + size_t(piece) * (SLABS * V * 32) + lane;   // [slab][j] strided by 32 lanes
        // 1. add
#pragma unroll
        for (int h = 0; h < SLABS; ++h)
#pragma unroll
            for (int j = 0; j < V; ++j)
                red_add_v4(mine + (h * V + j) * 32,
                           make_float4(acc[h].d[4 * j], acc[h].d[4 * j + 1], acc[h].d[4 * j + 2], acc[h].d[4 * j + 3]));
        // 2. arrive. The pattern of a CTA-wide semaphore (CUTLASS's: barrier, then one thread's
        // release), at warp scope: each lane's fence waits for its adds; __syncwarp orders every
        // lane's adds before lane 0's arrival, whose release makes them visible with it.
        fence_acq_rel_gpu();
        __syncwarp();
        int before = 0;
        if (lane == 0) before = atomic_add_acq_rel_gpu(&arrivals[piece], 1);
        before = __shfl_sync(0xffffffffu, before, 0);
        if (before != sh.splits - 1) return false;
        // 3. the last split: every other split's adds were released with its arrival, which came
        // before mine (acquire, then each lane's fence); read the sums from L2 (.cg: never a
        // stale L1 line), then clear them
        __syncwarp();
        fence_acq_rel_gpu();
#pragma unroll
        for (int h = 0; h < SLABS; ++h)
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const float4 v = __ldcg(mine + (h * V + j) * 32);
                acc[h].d[4 * j] = v.x; acc[h].d[4 * j + 1] = v.y; acc[h].d[4 * j + 2] = v.z; acc[h].d[4 * j + 3] = v.w;
            }
#pragma unroll
        for (int h = 0; h < SLABS; ++h)
#pragma unroll
            for (int j = 0; j < V; ++j) __stcg(mine + (h * V + j) * 32, make_float4(0.f, 0.f, 0.f, 0.f));
        if (lane == 0) arrivals[piece] = 0;
        return true;
    }
};

}  // namespace gemm4

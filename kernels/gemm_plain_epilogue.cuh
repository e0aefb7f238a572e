// kernels/gemm_plain_epilogue.cuh — the epilogue of the plain product C = A·B (nothing fused),
// for GEMM steps 4 and 5 (variant 6 of each). Read after kernels/gemm_4_warp_specialized.cuh,
// whose store_slab it replaces for this one policy.
//
// Why it exists (session 6): at K = 768 a tile has only 12 k-steps, so what a tile costs besides
// its math decides the rate. Step 4's generic epilogue (store_slab + linear_epilogue) decides at
// RUN time, per value, whether to add a bias and apply GELU, so ptxas lays out every value's bias
// load and tanh between two branches: ~21 KB of SASS per 16 x 64 box, ~84 KB per tile, of which
// the plain product executes ~15 instructions per value pair, jumping over the rest (~1000
// instructions per warp per tile, more than the 12 k-steps of its main loop issue). ncu saw our
// kernels issue ~2.3x cuBLAS's instructions per tile at 16384x768x3072, and session 5's MLP
// kernels ran in time proportional to their epilogue instruction counts.
//
// This policy knows at compile time that values pass unchanged, so a warp's box is: convert
// pairs to bf16 and stage 8x8 blocks with stmatrix (4 instructions per 16 x 64 box instead of 16
// stores), fence, one TMA store (or reduce-add for split-K). About 30 instructions per box, no
// branch per value. fp32 outputs (split-K partials) are staged with 8-byte stores.
//
// stmatrix fits the accumulator as it is: in each 8-column block, thread (g, t) holds row g and
// row g + 8 at columns 2t, 2t+1 (hopper-facts §4.2), which is exactly the register an
// m8n8 stmatrix takes from lane 4g + t for the block's rows 0-7 and 8-15 (§1.3). One .x4 stores
// four such 8x8 blocks: (rows 0-7, block b), (rows 8-15, b), (rows 0-7, b+1), (rows 8-15, b+1);
// lanes 8j..8j+7 give the eight row addresses of block j, through the staging tile's swizzle.
#pragma once
#include <type_traits>
#include "gemm_4_warp_specialized.cuh"
#include "tk/ops/warp/memory_shared.cuh"   // tk::detail::stmatrix_x4

namespace gemm4 {

template <typename OutT>
struct plain_epilogue {
    using out_t = OutT;
    static constexpr int OUTPUTS = 1;
    static constexpr bool STORES_SLAB = true;   // gemm4::store_slab hands the whole slab to store_slab below
    struct tile_state {};
    out_gl<OutT> C;

    __device__ void begin_tile(tile_state&, const tile_pos&, const shape&) const {}
    __device__ void side_job(int, int, const shape&) const {}

    // This warp's 16 rows x Acc::cols of the tile, box by box through its NBUF staging buffers.
    template <int NBUF, typename CTile, typename Acc>
    __device__ __forceinline__ void store_slab(CTile (&bufs)[NBUF], Acc& acc, const tile_pos& pos, const shape& sh,
                                               int lane) const {
        constexpr int CC = CTile::cols;                  // columns per box: 64 bf16 / 32 fp32
        constexpr int BOXES = Acc::cols / CC;
        static_assert(BOXES % NBUF == 0, "buffer ring must restart in step with the slab");
        const int box_row = pos.slab_row / 16;
#pragma unroll
        for (int ch = 0; ch < BOXES; ++ch) {
            CTile& buf = bufs[ch % NBUF];
            if (lane == 0) tma::store_wait_read<NBUF - 1>();   // the store NBUF boxes ago has read buf
            __syncwarp();
            if constexpr (std::is_same_v<OutT, bf16>) {
                // lane l addresses row l % 8 (+8 for odd j = l / 8) of 8x8 block 2q + j / 2
                const int row = 8 * ((lane / 8) & 1) + lane % 8;
#pragma unroll
                for (int q = 0; q < CC / 16; ++q) {
                    const int i = 4 * (ch * CC / 8 + 2 * q);     // blocks 2q, 2q+1 of this box
                    const uint32_t r[4] = {pack_bf16(acc.d[i], acc.d[i + 1]), pack_bf16(acc.d[i + 2], acc.d[i + 3]),
                                           pack_bf16(acc.d[i + 4], acc.d[i + 5]), pack_bf16(acc.d[i + 6], acc.d[i + 7])};
                    stmatrix_x4(smem_addr(&buf) + CTile::offset(row, 8 * (2 * q + lane / 16)), r);
                }
            } else {
#pragma unroll
                for (int j = 0; j < CC / 8; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int i = 4 * (ch * CC / 8 + j) + 2 * h;
                        *reinterpret_cast<float2*>(buf.ptr(pos.g + 8 * h, 8 * j + 2 * pos.t)) = make_float2(acc.d[i], acc.d[i + 1]);
                    }
            }
            fence_proxy_async();                         // generic writes -> TMA reads
            __syncwarp();
            if (lane == 0) {
                const int box_col = pos.tile_col / CC + ch;
                if (box_col * CC < sh.N) {               // boxes wholly past N: nothing to store
                    if (sh.splits > 1) tma::store_add_async(C, buf, box_row, box_col);
                    else               tma::store_async(C, buf, box_row, box_col);
                }
                tma::store_commit_group();               // (an empty group keeps the count in step)
            }
        }
    }

    // tk's stmatrix exists only in sm_90 device passes (TK_SM90); the host pass sees an empty body
    __device__ static __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#ifdef TK_SM90
        detail::stmatrix_x4(addr, r);
#endif
    }
    // bf16 pair in one register, lo at the lower column (cvt.rn.bf16x2.f32 puts its FIRST source high)
    __device__ static __forceinline__ uint32_t pack_bf16(float lo, float hi) {
        bf16_2 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&v);
    }
};

}  // namespace gemm4

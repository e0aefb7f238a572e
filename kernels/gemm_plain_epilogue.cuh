// kernels/gemm_plain_epilogue.cuh — the epilogue of the plain product C = A·B (nothing fused),
// for GEMM steps 4 and 5: plain_epilogue (variants 6 and 7 of each) and deferred_plain_epilogue
// (step 4 variant 8, matmul(step=0)'s choice for most plain products), whose stores overlap the
// next tile's k-steps. The MLP's self-staging policies reuse its pack_bf16 and stage_blocks
// (kernels/mlp_epilogues.cuh). Read after kernels/gemm_4_warp_specialized.cuh, whose store_slab
// these policies replace.
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
#pragma unroll
        for (int ch = 0; ch < BOXES; ++ch) {
            CTile& buf = bufs[ch % NBUF];
            wait_for_buffer<NBUF>(lane);
            if constexpr (std::is_same_v<OutT, bf16>) {
#pragma unroll
                for (int q = 0; q < CC / 16; ++q) {
                    const int i = 4 * (ch * CC / 8 + 2 * q);     // blocks 2q, 2q+1 of this box
                    const uint32_t r[4] = {pack_bf16(acc.d[i], acc.d[i + 1]), pack_bf16(acc.d[i + 2], acc.d[i + 3]),
                                           pack_bf16(acc.d[i + 4], acc.d[i + 5]), pack_bf16(acc.d[i + 6], acc.d[i + 7])};
                    stage_blocks(buf, q, r, lane);
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
            send_box(buf, pos.slab_row / 16, pos.tile_col / CC + ch, sh, lane);
        }
    }

    // ---- the pieces of a box ----
    // Lane 0: the store NBUF boxes ago has read the buffer this box fills.
    template <int NBUF> __device__ static __forceinline__ void wait_for_buffer(int lane) {
        if (lane == 0) tma::store_wait_read<NBUF - 1>();
        __syncwarp();
    }
    // bf16 8x8 blocks 2q, 2q+1 of a 16 x 64 box (r = rows 0-7 and 8-15 of each, as the
    // accumulator holds them): lane l addresses row l % 8 (+8 for odd l / 8) of block 2q + l / 16.
    template <typename CTile>
    __device__ static __forceinline__ void stage_blocks(CTile& buf, int q, const uint32_t (&r)[4], int lane) {
        const int row = 8 * ((lane / 8) & 1) + lane % 8;
        stmatrix_x4(smem_addr(&buf) + CTile::offset(row, 8 * (2 * q + lane / 16)), r);
    }
    // The staged box leaves: fence (generic writes -> TMA reads), then lane 0 stores or reduce-adds it.
    template <typename CTile>
    __device__ __forceinline__ void send_box(CTile& buf, int box_row, int box_col, const shape& sh, int lane) const {
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) {
            if (box_col * CTile::cols < sh.N) {          // boxes wholly past N: nothing to store
                if (sh.splits > 1) tma::store_add_async(C, buf, box_row, box_col);
                else               tma::store_async(C, buf, box_row, box_col);
            }
            tma::store_commit_group();                   // (an empty group keeps the count in step)
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

// Step 4 variant 8: the same values and boxes, but DEFERRED (gemm4::defers_store): at a tile's end
// the accumulators are packed to bf16 pairs in registers (64 a thread for 64 x 256) and the next
// tile's wgmmas start at once; box ch of the held tile is staged and stored right after k-step
// ch's wgmmas are issued, while the tensor cores run them. In the cooperative kernel the tensor
// cores otherwise idle for the whole epilogue. fp32 outputs (split-K) are not deferred (128
// registers would not fit beside the accumulators): they take plain_epilogue's path.
template <typename OutT>
struct deferred_plain_epilogue : plain_epilogue<OutT> {
    using base = plain_epilogue<OutT>;
    static constexpr bool DEFERS_STORE = std::is_same_v<OutT, bf16>;
    template <int COLS> struct held {
        static constexpr int boxes = COLS / box_cols<OutT>;
        uint32_t v[COLS / 4];    // bf16 pairs: v[2b + h] = block b (8 columns), row g + 8h
        tile_pos pos;
    };
    template <typename Acc, int COLS>
    __device__ __forceinline__ void hold(held<COLS>& hd, const Acc& acc, const tile_pos& pos) const {
#pragma unroll
        for (int i = 0; i < COLS / 4; ++i) hd.v[i] = base::pack_bf16(acc.d[2 * i], acc.d[2 * i + 1]);
        hd.pos = pos;
    }
    template <int B, int NBUF, typename CTile, int COLS>
    __device__ __forceinline__ void store_held_box(CTile (&bufs)[NBUF], const held<COLS>& hd, const shape& sh, int lane) const {
        constexpr int CC = CTile::cols;
        CTile& buf = bufs[B % NBUF];
        base::template wait_for_buffer<NBUF>(lane);
#pragma unroll
        for (int q = 0; q < CC / 16; ++q) {
            const int i = 2 * (B * CC / 8 + 2 * q);          // blocks 2q, 2q+1 of box B, rows g and g + 8
            const uint32_t r[4] = {hd.v[i], hd.v[i + 1], hd.v[i + 2], hd.v[i + 3]};
            base::stage_blocks(buf, q, r, lane);
        }
        this->send_box(buf, hd.pos.slab_row / 16, hd.pos.tile_col / CC + B, sh, lane);
    }
};

}  // namespace gemm4

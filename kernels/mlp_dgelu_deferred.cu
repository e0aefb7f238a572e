// kernels/mlp_dgelu_deferred.cu — the backward's dGELU GEMM with its epilogue UNDER the next
// tile's math ("fast=3", session 7, opt-in; also fcfast=5's gelu' form, the default since session 8, which
// fcfast=9 shares; fcfast=10 runs it on the lean k-step, fcfast=11, the default since session 10, also
// with a packed product): dpre = (dy·W2) ⊙ GELU'(pre), pre brought into shared
// memory by TMA long before it is needed. Read kernels/mlp.cu's opening comment (what the dGELU
// product is) and kernels/mlp_deferred.cuh (the kernel and why) first; then this file: the policy,
// then the launcher.
//
// Why (session 7's probe, GPT-2 step at M = 32768): the dGELU GEMM ran 347 µs where a plain
// product of its shape runs ~213-240: step 4's cooperative schedule idles its tensor cores for
// the whole epilogue (both consumers finish a tile together), and dGELU's epilogue is the longest
// (per value a GELU' of 8 operations and a tanh, the product, db1's sums). G's variant 8 (session
// 6) hid a plain epilogue under the next tile's first k-steps; session 6's fast=2 tried the same
// for dGELU and lost badly (974 vs 688 µs at M = 65536): each box loaded its pre with per-thread
// global loads INSIDE the k-loop, so every box waited on a trip to L2/DRAM with the next k-step's
// wgmmas not yet issued.
//
// What it does differently (on kernels/mlp_deferred.cuh's kernel, step 4's with its own consumer
// loop, since the deferral's timing is not step 4's hook's):
//   - pre arrives by TMA into the warp's 2 staging buffers (each takes two of the 4 16 x 64 boxes
//     of its 16 x 256 slab in turn), one mbarrier per buffer, each box requested a k-step or more
//     after the store that frees its buffer and >= 3 k-steps before it is needed (the policy's
//     comment says when), so the load's latency is off the path.
//   - at a tile's end dh = acc is rounded to bf16 pairs and held in 64 registers (eager PyTorch
//     also rounds dh to bf16 before its GELU backward), and the next tile's wgmmas start at once.
//   - the held tile's epilogue runs in 8 HALF boxes (32 columns), one after each of 8 of the next
//     tile's first 10 k-steps' wgmma issue: per half, pre by 2 ldmatrix.x4 from the staging buffer
//     (ldmatrix hands each lane the accumulator's positions, as stmatrix takes them), 16 GELU'
//     and products, db1's sums (a reduce-scatter of 8 values, one 128-byte store per warp), dpre
//     by 2 stmatrix.x4 IN PLACE over pre; after the second half, one fence and one TMA store. Half
//     a box is ~250 instructions per warp: two warps share a scheduler, so ~500 issue slots per
//     k-step against ~1000 cycles of tensor work (whole boxes would fill it).
//   - the first 10 k-steps of a tile are written out, each with its half box at constant
//     register indices (kernels/mlp_deferred.cuh).
// Step 4's 4 stages of K = 64 and 2 staging buffers per warp (224 KB). (Session 7's fast=4, the
// same with 4 buffers, one per box, on 3 stages, in one k-loop with the half picked at run time
// by 56 selects, was no faster than the default on the H200 and was removed: kernels/NOTES.md,
// session 7 M; its code is in git at 777f4c7.)
// Values: dpre = bf16(bf16(acc) · GELU'(pre)), within one bf16 rounding of the default's
// bf16(acc · GELU'(pre)); db1's partials sum the fp32 products of the bf16 dh.
#include "mlp_deferred.cuh"

namespace tk_mlp::detail {
namespace {
constexpr int BOXES = gemm4::BN / CC;          // 16 x 64 boxes per warp slab (4)
// step 4's 4 stages and 2 buffers per warp (224 KB), each taking two of a tile's pre boxes in turn
using cfg = gemm4::config<4, 64, false, 2>;

// dgelu_fast's values and side jobs, plus pre's TMA view, the held tile and its half boxes.
// GP = true (fcfast=5): the forward saved gelu'(pre) (bf16) where pre was, so a value's epilogue
// is one product, dpre = dh·gp.
// Box b in buffer b % 2; parts after k-steps 0-3, 5, 6, 8, 9. The kernel requests a
// tile's boxes 0 and 1 after k-steps 7 and 10 (one k-step after their buffers' last boxes, 2 and 3
// of the held tile, left: a load waits for that store to have read the buffer); the held tile's
// boxes 2 and 3 are requested by its own parts 2 and 4 (k-steps 2 and 5), a k-step or two after
// boxes 0 and 1 left. Every pre box has >= 3 k-steps (~1.5 µs) between its request and its use.
// Each buffer's barrier sees two phases per tile, box b's with parity b / 2.
// LEAN (session 10, fcfast=10 and 11; 11 the default since session 10's call 2): the same policy on the kernel's lean k-step (kernels/mlp_deferred.cuh,
// lean_kstep), as c_fc's default (fcfast=9) runs: the same values, ~40 fewer instructions per k-step
// and warp (this kernel's K = C = 768 is c_fc's: 12 k-steps a tile).
// PACKED (session 10, fcfast=11, the default since call 2: MLP 1.2-1.3% faster than 9; with GP): without db1 (no bias gradients, GPT-2), a pair's
// dpre is ONE packed multiply, mul.rn.bf16x2(dh pair, gelu'(pre) pair), instead of two unpacks, two
// fp32 products and a pack (~7 instructions a pair). The same bits: a product of two bf16 values is
// exact in fp32 (8 + 8 significant bits), so rounding it to bf16 once is what the packed multiply's
// single rounding gives (no flush to zero either way: no --use_fast_math). The one exception is a
// product below fp32's normal range (|dpre| < 1.2e-38), which fp32 rounds first: there the two may
// differ in the last bit. With db1 the fp32 path.
template <bool GP, bool LEAN = false, bool PACKED = false>
struct dgelu_parts_epilogue : dgelu_fast_epilogue {
    static_assert(!PACKED || GP, "the packed product multiplies by a saved gelu'(pre)");
    static constexpr bool LEAN_KSTEP = LEAN;
    static constexpr int NBUF = 2, PARTS = 2 * BOXES, INPUT_BOXES = 2;
    static constexpr int PEEL_STEPS = PARTS + 2;
    __host__ __device__ static constexpr int part_at_step(int s) {
        constexpr int parts[PARTS + 2] = {0, 1, 2, 3, -1, 4, 5, -1, 6, 7};
        return s < PARTS + 2 ? parts[s] : -1;
    }
    __host__ __device__ static constexpr int input_step(int b) { return b == 0 ? 7 : 10; }
    gemm4::out_gl<bf16> pre_view;                      // pre [M][N] in output-sized boxes
    static dgelu_parts_epilogue make(const gemm_args& g) {
        return {dgelu_fast_epilogue::make(g), out_view<bf16>(const_cast<void*>(g.pre), g)};
    }
    using tile = gemm4::out_tile<bf16>;
    struct held {
        uint32_t dh[gemm4::BN / 4];   // bf16 pairs: dh[2·blk + h] = 8-column block blk, row g + 8h
        tile_pos pos;
    };
    __device__ __forceinline__ void hold(held& hd, const wgmma::accumulator<gemm4::BN>& acc, const tile_pos& pos) const {
#pragma unroll
        for (int i = 0; i < gemm4::BN / 4; ++i) hd.dh[i] = stmatrix_staging::pack_bf16(acc.d[2 * i], acc.d[2 * i + 1]);
        hd.pos = pos;
    }
    __device__ static __forceinline__ uint32_t parity(int b) { return (b >> 1) & 1; }   // box b's phase of its buffer

    // Lane 0: pre's box b of the tile at `pos` into its buffer, completing on the buffer's barrier
    // (0 bytes, i.e. at once, for a box wholly outside pre; partly outside ones read zeros there).
    // The buffer's last TMA store must have read it first.
    __device__ __forceinline__ void load_input_box(tile (&bufs)[NBUF], mbarrier (&bars)[NBUF], int b, const tile_pos& pos,
                                                   const shape& sh) const {
        tma::store_wait_read<0>();
        const bool in = pos.slab_row < sh.M && pos.tile_col + b * CC < sh.N;
        mbar::arrive_expect_bytes(bars[b % NBUF], in ? tma::bytes<tile> : 0u);
        if (in) tma::load_async(bufs[b % NBUF], pre_view, pos.slab_row / 16, pos.tile_col / CC + b, bars[b % NBUF]);
    }

    // Part P (box P / 2, half P % 2): its 8 held registers are dh[8P .. 8P + 7] (blocks
    // 4·(P % 2) .. +3 of the box, rows g and g + 8).
    template <int P>
    __device__ __forceinline__ void run_part(tile (&bufs)[NBUF], mbarrier (&bars)[NBUF], const held& hd, const shape& sh,
                                             int lane) const {
        uint32_t dh8[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) dh8[k] = hd.dh[8 * P + k];
        run_half(bufs, bars, dh8, P / 2, P % 2, hd, sh, lane);
    }
    // Half `half` of box b of the held tile, dh8 its 8 held pairs (blocks 4·half .. +3 of the box,
    // rows g and g + 8, in dh's order): pre by ldmatrix, dpre = dh·GELU'(pre), db1's sums, dpre by
    // stmatrix in place of pre; after the second half the box leaves.
    __device__ __forceinline__ void run_half(tile (&bufs)[NBUF], mbarrier (&bars)[NBUF], const uint32_t (&dh8)[8], int b,
                                             int half, const held& hd, const shape& sh, int lane) const {
        const tile_pos& pos = hd.pos;
        tile& buf = bufs[b % NBUF];
        if (half == 0 && (b == 1 || b == 2)) {         // the held tile's box b + 1 (2 or 3) into the other
                                                       // buffer, whose box b - 1 left a part or two ago
            if (lane == 0) load_input_box(bufs, bars, b + 1, pos, sh);
            __syncwarp();
        }
        if (half == 0) mbar::wait(bars[b % NBUF], parity(b));   // pre's box has landed
        const int row = 8 * ((lane / 8) & 1) + lane % 8;
        float v[8];                                    // [2jj + p]: column 8jj + 2t + p of the half, rows g + g8
#pragma unroll
        for (int qq = 0; qq < 2; ++qq) {               // ldmatrix/stmatrix q = 2·half + qq: blocks 2q, 2q + 1
            const uint32_t addr = smem_addr(&buf) + tile::offset(row, 8 * (2 * (2 * half + qq) + lane / 16));
            uint32_t pre4[4];                          // pre: block 2q rows g / g+8, block 2q+1 rows g / g+8
            ldmatrix_x4(addr, pre4);                   // (ldmatrix hands out exactly the accumulator's positions)
            uint32_t out[4];
            if constexpr (PACKED) {
                if (!bias_grad_partial) {              // no db1 sums: one packed multiply a pair (see PACKED)
#pragma unroll
                    for (int k = 0; k < 4; ++k) out[k] = mul_bf16x2(dh8[4 * qq + k], pre4[k]);
                    stmatrix_staging::stmatrix_x4(addr, out);
                    continue;
                }
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float2 x = unpack_bf16x2(pre4[k]), d = unpack_bf16x2(dh8[4 * qq + k]);
                const float d0 = d.x * (GP ? x.x : gelu_grad_fast(x.x)), d1 = d.y * (GP ? x.y : gelu_grad_fast(x.y));
                out[k] = stmatrix_staging::pack_bf16(d0, d1);
                const int jj = 2 * qq + k / 2;         // block of the half
                if (k % 2 == 0) { v[2 * jj] = d0; v[2 * jj + 1] = d1; } else { v[2 * jj] += d0; v[2 * jj + 1] += d1; }
            }
            stmatrix_staging::stmatrix_x4(addr, out);  // dpre over pre, in place (the same lanes' addresses)
        }
        store_db1_half(v, b * CC + 32 * half, pos, sh);
        if (half == 1) {                               // the box is complete: fence, then lane 0 stores it
            fence_proxy_async();
            __syncwarp();
            if (lane == 0) {
                const int box_row = pos.slab_row / 16, box_col = pos.tile_col / CC + b;
                if (inside(box_row, box_col, sh)) tma::store_async(C, buf, box_row, box_col);
                tma::store_commit_group();             // (an empty group keeps store_wait_read's count in step)
            }
        }
    }
    __device__ static __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {   // lane-wise, rounded once
        uint32_t d = 0;
#ifdef TK_SM90
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#endif
        return d;
    }
    __device__ static __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
#ifdef TK_SM90
        tk::detail::ldmatrix_x4(addr, r);
#endif
    }
    // db1 over the warp's 16 rows for 32 columns (col0 from the tile's start): a reduce-scatter of
    // 8 values over the 8 lanes sharing columns, after which lane (g, t) holds column
    // 8·(g >> 1) + 2t + (g & 1) of the half (the 32 lanes cover its 32 columns: one 128-byte store).
    // (Session 6's dgelu_deferred had the same; no bias gradient wanted: nothing to sum.)
    __device__ __forceinline__ void store_db1_half(float (&v)[8], int col0, const tile_pos& pos, const shape& sh) const {
        if (!bias_grad_partial) return;
        reduce_scatter_round8<4, 16>(v, pos.g & 4);
        reduce_scatter_round8<2, 8>(v, pos.g & 2);
        reduce_scatter_round8<1, 4>(v, pos.g & 1);
        const int col = pos.tile_col + col0 + 8 * (pos.g >> 1) + 2 * pos.t + (pos.g & 1);
        if (pos.slab_row < sh.M && col < sh.N) bias_grad_partial[size_t(pos.slab_row / 16) * sh.N + col] = v[0];
    }
    template <int HALF, int LANE_BIT>
    __device__ static __forceinline__ void reduce_scatter_round8(float (&v)[8], bool upper) {
#pragma unroll
        for (int k = 0; k < HALF; ++k) {
            const float keep = upper ? v[k + HALF] : v[k], send = upper ? v[k] : v[k + HALF];
            v[k] = keep + __shfl_xor_sync(0xffffffffu, send, LANE_BIT);
        }
    }
};
}  // namespace

// dpre = (dy·W2) ⊙ GELU'(pre) with db1's partials and the side jobs, on step 4's tile
// (kernels/mlp_deferred.cuh): g.fast_dgelu 3, or 5 with g.pre holding gelu'(pre) (fcfast=5, 9, 10, 11), on
// the lean k-step with g.dgelu_lean (1: fcfast=10; 2, also the packed product: fcfast=11).
const char* linear_dgelu_deferred(const gemm_args& g) {
    if (g.fast_dgelu == 3) return deferred::launch<cfg, major::MN, dgelu_parts_epilogue<false>>(g);
    if (g.fast_dgelu == 5 && g.dgelu_lean == 2) return deferred::launch<cfg, major::MN, dgelu_parts_epilogue<true, true, true>>(g);
    if (g.fast_dgelu == 5 && g.dgelu_lean) return deferred::launch<cfg, major::MN, dgelu_parts_epilogue<true, true>>(g);
    if (g.fast_dgelu == 5) return deferred::launch<cfg, major::MN, dgelu_parts_epilogue<true>>(g);
    return "tk_mlp: the deferred dGELU GEMM is fast=3 (or fcfast=5's gelu' form)";
}

}  // namespace tk_mlp::detail

// kernels/mlp_fc_deferred.cu — c_fc's forward (pre = x·W1ᵀ + b1, h = GELU(pre)) with its epilogue
// under the next tile's math in half boxes ("fcfast=4", session 7; "fcfast=5", session 8's default,
// also saves gelu'(pre) in pre's place; "fcfast=9", 5's values on a lean k-step, whose c_fc "fcfast=10"
// and "fcfast=11" (the default since session 10) run), on kernels/mlp_deferred.cuh's kernel. Read that header first (the kernel and why), then session 6's bias_gelu_deferred
// (kernels/mlp_epilogues.cuh, fcfast=3), whose values and held registers this reuses.
//
// fcfast=3 ran each box's whole epilogue (pre staged, 32 GELUs, h staged, two TMA stores: ~350
// instructions per warp, two warps per scheduler) after ONE of the next tile's k-steps: at about
// the ~1000 cycles of tensor work it should hide behind. Session 6's call 3 measured c_fc 143.8 µs
// with it against ~124 for a plain product of its shape (G's 4v8, same pipeline). Here each box
// takes two k-steps (a half box, 32 columns, after each of k-steps 0-7), and the bias add and
// packing at the tile's end are fcfast=3's. Values are fcfast=3's exactly: pre = bf16(acc + b1),
// h = GELU(bf16 pre) by gelu_fast (bit-identical; tested).
#include "mlp_deferred.cuh"

namespace tk_mlp::detail {
namespace {
// (h, gelu'(x)) from one tanh: h is gelu_fast(x) bit for bit, gelu'(x) gelu_grad_fast(x)'s formula.
__device__ __forceinline__ float2 gelu_and_grad(float x) {
    constexpr float K0 = SQRT_2_OVER_PI, K1 = SQRT_2_OVER_PI * GELU_C;
    const float x2 = x * x;
    const float T = tanh_approx(x * fmaf(K1, x2, K0));
    const float half_x = 0.5f * x;
    const float du = fmaf(3.0f * K1, x2, K0), s = fmaf(-T, T, 1.0f);
    return make_float2(fmaf(half_x, T, half_x), fmaf(fmaf(x * s, du, T), 0.5f, 0.5f));
}
using cfg = gemm4::config<4, 64, false, 2>;   // step 4's MLP pipeline (4 stages) and two staging buffers per warp

// GP = true (fcfast=5): output 0 is gelu'(pre) instead of pre (the backward's dGELU then needs one
// product per value, kernels/mlp_dgelu_deferred.cu): from the same tanh as h, 5 more operations.
// SPLIT: parts per 64-column box, 2: half boxes after k-steps 0-7. (Session 9's fcfast=7, quarter
// boxes, ran on the H200 and lost: 0.4-0.5% slower in the MLP; its fcfast=8, whole boxes with the
// two consumer warpgroups taking turns, lost too: 0.6-1.0% slower (session 10's first call). Both
// removed: kernels/NOTES.md, sessions 9 and 10 M; code at 44b46e1 and a0344a0.)
// LEAN (fcfast=9, session 9; 10 and 11 too, 11 the default since session 10): fcfast=5's policy on the kernel's lean
// k-step (kernels/mlp_deferred.cuh, lean_kstep): the same parts, fewer instructions per k-step
// (ncu at M = 32768: 101.8 -> 90.8 M warp instructions, 364.7 -> 344.3 µs at locked clocks).
template <bool GP, bool LEAN = false>
struct bias_gelu_parts_epilogue : bias_gelu_deferred_epilogue {
    static constexpr bool LEAN_KSTEP = LEAN;
    static constexpr int SPLIT = 2;                                                    // half boxes
    static constexpr int Q_PER_PART = 4 / SPLIT;                                       // stmatrix.x4 groups (16 columns) per part
    static constexpr int NBUF = 2, PARTS = SPLIT * gemm4::BN / CC, INPUT_BOXES = 0;   // buffers: pre, h
    static constexpr int PEEL_STEPS = PARTS;                                           // part s after k-step s
    __host__ __device__ static constexpr int part_at_step(int s) { return s < PARTS ? s : -1; }
    __host__ __device__ static constexpr int input_step(int) { return 0; }          // (no input boxes)
    static bias_gelu_parts_epilogue make(const gemm_args& g) { return {bias_gelu_deferred_epilogue::make(g)}; }
    using tile = gemm4::out_tile<bf16>;
    using held = bias_gelu_deferred_epilogue::held<gemm4::BN>;   // pre as bf16 pairs, and where the tile goes
    __device__ __forceinline__ void hold(held& hd, const wgmma::accumulator<gemm4::BN>& acc, const tile_pos& pos) const {
        bias_gelu_deferred_epilogue::hold(hd, acc, pos);
    }
    __device__ void load_input_box(tile (&)[NBUF], mbarrier (&)[NBUF], int, const tile_pos&, const shape&) const {}

    // Part P: piece P % SPLIT (column groups q = Q_PER_PART·(P % SPLIT) ..) of box P / SPLIT. The
    // first piece waits for the last box's two stores to have read the buffers; the last sends the
    // box (one fence, two stores).
    template <int P>
    __device__ __forceinline__ void run_part(tile (&bufs)[NBUF], mbarrier (&)[NBUF], const held& hd, const shape& sh,
                                             int lane) const {
        constexpr int B = P / SPLIT, PIECE = P % SPLIT;
        if constexpr (PIECE == 0) {
            if (lane == 0) tma::store_wait_read<0>();
            __syncwarp();
        }
#pragma unroll
        for (int qq = 0; qq < Q_PER_PART; ++qq) {
            const int q = Q_PER_PART * PIECE + qq;
            const int i = 2 * (B * CC / 8 + 2 * q);    // blocks 2q, 2q + 1 of box B, rows g and g + 8
            uint32_t hr[4], gr[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float2 x = unpack_bf16x2(hd.pre[i + k]);
                if constexpr (GP) {
                    const float2 h0 = gelu_and_grad(x.x), h1 = gelu_and_grad(x.y);
                    hr[k] = stmatrix_staging::pack_bf16(h0.x, h1.x);
                    gr[k] = stmatrix_staging::pack_bf16(h0.y, h1.y);
                } else {
                    hr[k] = stmatrix_staging::pack_bf16(gelu_fast(x.x), gelu_fast(x.y));
                }
            }
            if constexpr (GP) stmatrix_staging::stage_blocks(bufs[0], q, gr, lane);
            else stmatrix_staging::stage_blocks(bufs[0], q, {hd.pre[i], hd.pre[i + 1], hd.pre[i + 2], hd.pre[i + 3]}, lane);
            stmatrix_staging::stage_blocks(bufs[1], q, hr, lane);
        }
        if constexpr (PIECE == SPLIT - 1) {
            fence_proxy_async();                       // generic writes -> TMA reads
            __syncwarp();
            if (lane == 0) {
                const int box_row = hd.pos.slab_row / 16, box_col = hd.pos.tile_col / CC + B;
                if (inside(box_row, box_col, sh)) { tma::store_async(C, bufs[0], box_row, box_col); tma::store_async(C2, bufs[1], box_row, box_col); }
                tma::store_commit_group();             // (an empty group keeps the count in step)
            }
        }
    }
};
}  // namespace

// pre (fcfast=4) or gelu'(pre) (fcfast=5; fcfast=9, 10 and 11, the default since session 10, on the lean
// k-step) and h of c_fc on step 4's tile with the epilogue under the next tile's k-steps.
const char* linear_bias_gelu_parts(const gemm_args& g) {
    if (g.fast_gelu >= 9) return deferred::launch<cfg, major::K, bias_gelu_parts_epilogue<true, true>>(g);
    if (g.fast_gelu == 5) return deferred::launch<cfg, major::K, bias_gelu_parts_epilogue<true>>(g);
    return deferred::launch<cfg, major::K, bias_gelu_parts_epilogue<false>>(g);
}

}  // namespace tk_mlp::detail

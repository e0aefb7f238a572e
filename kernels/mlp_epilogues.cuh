// kernels/mlp_epilogues.cuh — the MLP's GELU math and its fourteen epilogue policies (bias,
// bias_gelu, bias_gelu_h_only, dgelu, dgelu_pre_tma, their four "fast" forms, bias_gelu_stmatrix,
// bias_gelu_deferred and its evaluation twin bias_gelu_h_only_rounded, bias_deferred, reduce_add),
// shared by the translation units that instantiate them: kernels/mlp.cu (step 4's cooperative
// schedule, and the dispatch), kernels/mlp_pingpong*.cu (step 5's ping-pong schedule) and
// kernels/mlp_inference.cu (the evaluation forward's h-only c_fc epilogue on every schedule). Read
// kernels/mlp.cu's opening comment first: it says what each policy computes and why; the policy
// interface is in kernels/gemm_4_warp_specialized.cuh.
// A policy must work for any tile width (step 4: 256 columns; step 5: 128 or 256), so it takes
// the width from tile_pos::cols or the accumulator's ::cols.
//
// Read in order: step 4's configurations (plain, with input boxes, in 2-CTA clusters), GELU
// math, the policies (session 5's fast dGELU forms, then session 6's fast c_fc forms and the
// deferred ones), the cross-file launcher declarations.
#pragma once
#include "mlp.h"
#include "gemm_4_warp_specialized.cuh"
#include "gemm_plain_epilogue.cuh"         // gemm4::plain_epilogue's stmatrix staging pieces (stmatrix_staging below)

namespace tk_mlp::detail {
using namespace tk;
using wgmma::major;

// Step 4's configuration for every MLP GEMM: 4 stages of K = 64, one wgmma group in flight
// (kernels/mlp.cu and kernels/mlp_inference.cu both launch it).
using step4_config = gemm4::config<4, 64, false>;
// ... and for policies with input boxes (dgelu_pre_tma: a staging buffer per box, 4 per warp),
// 3 stages to make room (208 KB).
using step4_inputs_config = gemm4::config<3, 64, false, 4>;
// ... and both in 2-CTA clusters (SCHEDULE_STEP4_CLUSTER2).
using step4_cluster2_config = gemm4::config<4, 64, false, 2, 2>;
using step4_inputs_cluster2_config = gemm4::config<3, 64, false, 4, 2>;

// ---- GELU(tanh) and its derivative, in fp32 --------------------------------------------------
constexpr float SQRT_2_OVER_PI = 0.7978845608028654f, GELU_C = 0.044715f;

__device__ __forceinline__ float tanh_approx(float x) {
    float y;
#ifdef TK_SM90
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
#else
    y = tanhf(x);
#endif
    return y;
}
// GELU(x) = x/2 · (1 + tanh(u)),  u = sqrt(2/pi) · (x + 0.044715 x³)
__device__ __forceinline__ float gelu(float x) {
    float u = SQRT_2_OVER_PI * fmaf(GELU_C * x, x * x, x);
    return 0.5f * x * (1.0f + tanh_approx(u));
}
// GELU'(x) = (1 + T)/2 + x/2 · (1 - T²) · sqrt(2/pi) · (1 + 3·0.044715 x²),  T = tanh(u)
__device__ __forceinline__ float gelu_grad(float x) {
    float x2 = x * x;
    float T = tanh_approx(SQRT_2_OVER_PI * fmaf(GELU_C * x, x2, x));
    return 0.5f * (1.0f + T) + 0.5f * x * (1.0f - T * T) * SQRT_2_OVER_PI * fmaf(3.0f * GELU_C, x2, 1.0f);
}

// ---- the epilogue policies (the interface: kernels/gemm_4_warp_specialized.cuh) ---------------
using gemm4::tile_pos;
using gemm4::shape;
constexpr int CC = gemm4::box_cols<bf16>;    // columns per accumulator box (bf16 outputs)
// The policies that stage their own boxes (bias_gelu_stmatrix and the deferred ones) reuse the plain
// GEMM epilogue's pieces: pack_bf16 (a bf16 pair in one register, lo at the lower column) and
// stage_blocks (two 8-column blocks of a 16 x 64 box by one stmatrix.x4; kernels/gemm_plain_epilogue.cuh
// explains why the accumulator's layout is stmatrix's).
using stmatrix_staging = gemm4::plain_epilogue<bf16>;

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const bf16_2*>(&v));
}

// Adds bias (if any) to this thread's values of accumulator box ch, in place.
template <typename Acc>
__device__ __forceinline__ void add_bias(Acc& acc, const bf16* bias, int ch, const tile_pos& pos, const shape& sh) {
    if (!bias) return;
#pragma unroll
    for (int j = 0; j < CC / 8; ++j) {
        const int blk = ch * CC / 8 + j, col = pos.tile_col + 2 * pos.t + 8 * blk;
        if (col < sh.N) {
            float2 b = __bfloat1622float2(*reinterpret_cast<const bf16_2*>(bias + col));
#pragma unroll
            for (int h = 0; h < 2; ++h) { acc.d[4 * blk + 2 * h] += b.x; acc.d[4 * blk + 2 * h + 1] += b.y; }
        }
    }
}

// The output view of C (or C2) as the epilogue's TMA stores see it. May throw (a bad TMA
// descriptor): the policies' make() run inside the launchers' try.
template <typename OutT> gemm4::out_gl<OutT> out_view(void* c, const gemm_args& g) {
    return gemm4::out_gl<OutT>(static_cast<OutT*>(c), 1, g.M, g.N);
}

// What every policy here shares: no per-tile state, values staged as they are, and a plain TMA
// store of output 0 (or of C2 for output 1) for boxes inside C.
template <typename OutT>
struct base_epilogue {
    using out_t = OutT;
    struct tile_state {};
    gemm4::out_gl<OutT> C;
    __device__ void begin_tile(tile_state&, const tile_pos&, const shape&) const {}
    __device__ void side_job(int, int, const shape&) const {}
    __device__ float2 value(int, float v0, float v1, int, const shape&) const { return make_float2(v0, v1); }
    __device__ static bool inside(int box_row, int box_col, const shape& sh) {
        return box_col * gemm4::box_cols<OutT> < sh.N && box_row * 16 < sh.M;
    }
};

// c_proj forward (y = acc + b2) and dx (no bias).
struct bias_epilogue : base_epilogue<bf16> {
    static constexpr int OUTPUTS = 1;
    const bf16* bias;                                  // [N] or nullptr
    static bias_epilogue make(const gemm_args& g) { return {{out_view<bf16>(g.c, g)}, static_cast<const bf16*>(g.bias)}; }
    template <typename Acc>
    __device__ void box(tile_state&, Acc& acc, int ch, const tile_pos& pos, const shape& sh) const {
        add_bias(acc, bias, ch, pos, sh);
    }
    __device__ void store(int, gemm4::out_tile<bf16>& buf, int box_row, int box_col, const shape& sh) const {
        if (inside(box_row, box_col, sh)) tma::store_async(C, buf, box_row, box_col);
    }
};

// c_fc forward: pre = acc + b1 (output 0, C), h = GELU(pre) (output 1, C2).
struct bias_gelu_epilogue : base_epilogue<bf16> {
    static constexpr int OUTPUTS = 2;
    gemm4::out_gl<bf16> C2;
    const bf16* bias;                                  // [N] or nullptr
    static bias_gelu_epilogue make(const gemm_args& g) {
        return {{out_view<bf16>(g.c, g)}, out_view<bf16>(g.c2, g), static_cast<const bf16*>(g.bias)};
    }
    template <typename Acc>
    __device__ void box(tile_state&, Acc& acc, int ch, const tile_pos& pos, const shape& sh) const {
        add_bias(acc, bias, ch, pos, sh);
    }
    __device__ float2 value(int o, float v0, float v1, int, const shape&) const {
        if (o == 1) { v0 = gelu(v0); v1 = gelu(v1); }
        return make_float2(v0, v1);
    }
    __device__ void store(int o, gemm4::out_tile<bf16>& buf, int box_row, int box_col, const shape& sh) const {
        if (inside(box_row, box_col, sh)) tma::store_async(o == 0 ? C : C2, buf, box_row, box_col);
    }
};

// c_fc forward in evaluation (no backward will read pre): h = GELU(acc + b1) only, into C2 (C is
// null). The same float operations as bias_gelu's output 1, so h is bit-identical; the (M, 4C)
// pre is never written. Instantiated in kernels/mlp_inference.cu.
struct bias_gelu_h_only_epilogue : bias_epilogue {
    static bias_gelu_h_only_epilogue make(const gemm_args& g) {
        return {{{out_view<bf16>(g.c2, g)}, static_cast<const bf16*>(g.bias)}};
    }
    __device__ float2 value(int, float v0, float v1, int, const shape&) const { return make_float2(gelu(v0), gelu(v1)); }
};

// The backward's dh = dy·W2 GEMM: dpre = acc ⊙ GELU'(pre), plus db1 partials (column sums of
// dpre over each 16-row slab).
struct dgelu_epilogue : base_epilogue<bf16> {
    static constexpr int OUTPUTS = 1;
    const bf16* pre;                                   // [M][N]
    float* bias_grad_partial;                          // [ceil(M/16)][N]
    // Side jobs for the producer's idle warps (null pointers: none): zero the weight gradients'
    // fp32 split-K buffer (the dW GEMMs run after this one) and sum this GEMM's A operand, dy
    // [M][K], down its rows for db_proj: CTA b writes its rows' column sums to colsum[b][K], and
    // rows gridDim.x .. colsum_rows-1 get zeros, so the host sums all colsum_rows rows.
    float* zero;                                       // fp32 buffer to zero, or nullptr
    long long zero_floats;                             // a multiple of 4, 16-byte aligned start
    const bf16* a_rows;                                // dy: this GEMM's A, [M][K]
    float* colsum;                                     // [colsum_rows][K] fp32, or nullptr
    int colsum_rows;                                   // >= gridDim.x (the launch's SM count)
    bool colsum_pipelined;                             // side=2 (session 8): dy's sums with 8 row loads in flight
    static dgelu_epilogue make(const gemm_args& g) {
        return {{out_view<bf16>(g.c, g)}, static_cast<const bf16*>(g.pre), g.bias_grad_partial,
                g.zero, g.zero_floats, static_cast<const bf16*>(g.a), g.a_colsum, g.num_sms, g.side_pipelined != 0};
    }
    __device__ void side_job(int tid, int threads, const shape& sh) const {
        zero_slice(tid, threads);
        if (!colsum) return;
        if (colsum_pipelined) sum_a_columns_pipelined(tid, threads, sh);
        else sum_a_columns_serial(tid, threads, sh);
    }
    // This CTA's slice of the dW buffer, in float4s (< 2^31 of them).
    __device__ void zero_slice(int tid, int threads) const {
        if (!zero) return;
        const int G = gridDim.x, b = blockIdx.x;
        const int n4 = int(zero_floats / 4), begin = int((long long)n4 * b / G), end = int((long long)n4 * (b + 1) / G);
        float4* z = reinterpret_cast<float4*>(zero) + begin;
        for (int i = tid; i < end - begin; i += threads) z[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    // dy's column sums over this CTA's rows, 4 columns (8 bytes) per thread, each row added as its
    // load returns: ONE dependent trip to memory per row, 2 x 124 trips per thread at M = 16384, C =
    // 768 (96 threads, 192 groups of 4 columns). Session 8's first call measured the dGELU kernel
    // 16-21 us longer with bias gradients than without (kernels/NOTES.md, session 8 M) and suspected
    // these sums; call 2 cleared them: pipelined (side=2, below) the kernel took 174.6 us against
    // 175.1. side=1 stays the default.
    __device__ void sum_a_columns_serial(int tid, int threads, const shape& sh) const {
        const int G = gridDim.x, b = blockIdx.x;
        const int r0 = int((long long)sh.M * b / G), r1 = int((long long)sh.M * (b + 1) / G);
        for (int c4 = tid; c4 < sh.K / 4; c4 += threads) {    // 4 columns (8 bytes) per thread: 40 registers
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            const bf16* src = a_rows + size_t(r0) * sh.K + 4 * c4;
#pragma unroll 1
            for (int r = r0; r < r1; ++r, src += sh.K) {
                uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
                float2 f0 = unpack_bf16x2(v.x), f1 = unpack_bf16x2(v.y);
                acc[0] += f0.x; acc[1] += f0.y; acc[2] += f1.x; acc[3] += f1.y;
            }
            *reinterpret_cast<float4*>(colsum + size_t(b) * sh.K + 4 * c4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        }
        zero_missing_colsum_rows(tid, threads, sh);
    }
    // The same sums, the same order of additions (so bit-identical), with EIGHT rows' loads in
    // flight before their adds (the producer warpgroup's 40 registers hold 8 uint2 and 4 sums):
    // 2 x 16 trips per thread instead of 2 x 124. Session 4 wrote it for dgelu_pre_tma (pre=1);
    // side=2 (opt-in: no measured gain, above) gives it to every dGELU policy.
    __device__ void sum_a_columns_pipelined(int tid, int threads, const shape& sh) const {
        const int G = gridDim.x, b = blockIdx.x;
        const int r0 = int((long long)sh.M * b / G), r1 = int((long long)sh.M * (b + 1) / G);
        const size_t K = size_t(sh.K);
        for (int c4 = tid; c4 < sh.K / 4; c4 += threads) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            auto add4 = [&](const uint2& v) {
                float2 f0 = unpack_bf16x2(v.x), f1 = unpack_bf16x2(v.y);
                acc[0] += f0.x; acc[1] += f0.y; acc[2] += f1.x; acc[3] += f1.y;
            };
            const bf16* src = a_rows + size_t(r0) * K + 4 * c4;
            int r = r0;
#pragma unroll 1
            for (; r + 8 <= r1; r += 8, src += 8 * K) {
                uint2 v[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) v[u] = __ldg(reinterpret_cast<const uint2*>(src + u * K));
#pragma unroll
                for (int u = 0; u < 8; ++u) add4(v[u]);
            }
#pragma unroll 1
            for (; r < r1; ++r, src += K) add4(__ldg(reinterpret_cast<const uint2*>(src)));
            *reinterpret_cast<float4*>(colsum + size_t(b) * K + 4 * c4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        }
        zero_missing_colsum_rows(tid, threads, sh);
    }
    // colsum rows of CTAs this launch does not have (gridDim.x .. colsum_rows - 1) get zeros, by CTA 0.
    __device__ void zero_missing_colsum_rows(int tid, int threads, const shape& sh) const {
        const int G = gridDim.x;
        if (blockIdx.x != 0) return;
        float4* z = reinterpret_cast<float4*>(colsum + size_t(G) * sh.K);
        for (int i = tid; i < (colsum_rows - G) * (sh.K / 4); i += threads) z[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    // This thread reads pre at its accumulator positions. Box 0 goes into registers when the
    // tile starts and the rest of its rows into L2, so the loads land while the wgmmas run; each
    // later box is fetched from L2 one box ahead of its use (registers are too few to hold all
    // 128 values next to the 128 accumulators).
    struct tile_state { uint32_t pre[2][CC / 8][2]; };   // [box % 2][8-column block][row g / g+8]
    __device__ void load_pre(int ch, uint32_t (&dst)[CC / 8][2], const tile_pos& pos, const shape& sh) const {
#pragma unroll
        for (int j = 0; j < CC / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = pos.slab_row + pos.g + 8 * h, col = pos.tile_col + 2 * pos.t + ch * CC + 8 * j;
                dst[j][h] = (r < sh.M && col < sh.N)
                    ? __ldg(reinterpret_cast<const unsigned int*>(pre + size_t(r) * sh.N + col)) : 0u;
            }
    }
    __device__ void prefetch_tile_rows(const tile_pos& pos, const shape& sh) const {
#pragma unroll
        for (int h = 0; h < 2; ++h) {                // lane t prefetches the t-th 128-byte line of each row
            const int r = pos.slab_row + pos.g + 8 * h, col = pos.tile_col + 64 * pos.t;
            if (r < sh.M && col < sh.N && 64 * pos.t < pos.cols) asm volatile("prefetch.global.L2 [%0];" :: "l"(pre + size_t(r) * sh.N + col));
        }
    }
    __device__ void begin_tile(tile_state& st, const tile_pos& pos, const shape& sh) const {
        prefetch_tile_rows(pos, sh);
        load_pre(0, st.pre[0], pos, sh);
    }
    template <typename Acc>
    __device__ void box(tile_state& st, Acc& acc, int ch, const tile_pos& pos, const shape& sh) const {
        if (ch + 1 < Acc::cols / CC) load_pre(ch + 1, st.pre[(ch + 1) % 2], pos, sh);   // in flight during this box
#pragma unroll
        for (int j = 0; j < CC / 8; ++j) {
            const int blk = ch * CC / 8 + j, col = pos.tile_col + 2 * pos.t + 8 * blk;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float2 x = unpack_bf16x2(st.pre[ch % 2][j][h]);
                acc.d[4 * blk + 2 * h] *= gelu_grad(x.x);
                acc.d[4 * blk + 2 * h + 1] *= gelu_grad(x.y);
            }
            // db1: sum this warp's 16 rows of columns (col, col+1). Rows past M hold 0
            // (zero-filled A rows, pre read as 0), so they add nothing.
            float s0 = acc.d[4 * blk] + acc.d[4 * blk + 2], s1 = acc.d[4 * blk + 1] + acc.d[4 * blk + 3];
#pragma unroll
            for (int m = 4; m < 32; m *= 2) {        // lanes with equal t, across g = 0..7
                s0 += __shfl_xor_sync(0xffffffffu, s0, m);
                s1 += __shfl_xor_sync(0xffffffffu, s1, m);
            }
            if (pos.g == 0 && pos.slab_row < sh.M && col < sh.N)
                *reinterpret_cast<float2*>(bias_grad_partial + size_t(pos.slab_row / 16) * sh.N + col) = make_float2(s0, s1);
        }
    }
    __device__ void store(int, gemm4::out_tile<bf16>& buf, int box_row, int box_col, const shape& sh) const {
        if (inside(box_row, box_col, sh)) tma::store_async(C, buf, box_row, box_col);
    }
};

// The same dGELU product with pre read by TMA (gemm4's INPUT_BOXES): each consumer warp's lane 0
// loads the tile's pre boxes into the warp's staging buffers when the tile starts, so the
// epilogue reads pre from shared memory (coalesced 128-byte rows from DRAM, no per-thread
// global loads and no latency in the epilogue) and writes dpre over it in place. db1's column
// sums over each warp's 16 rows use a reduce-scatter across the 8 lanes that share columns
// (14 shuffles per box instead of 48; afterwards lane g holds 8-column block g).
struct dgelu_pre_tma_epilogue : dgelu_epilogue {
    static constexpr bool INPUT_BOXES = true;
    gemm4::out_gl<bf16> pre_view;                      // pre [M][N], in output-sized boxes
    struct tile_state {};
    static dgelu_pre_tma_epilogue make(const gemm_args& g) {
        return {dgelu_epilogue::make(g), out_view<bf16>(const_cast<void*>(g.pre), g)};
    }
    __device__ const gemm4::out_gl<bf16>& input() const { return pre_view; }
    __device__ void begin_tile(tile_state&, const tile_pos&, const shape&) const {}

    // The same side jobs as dgelu_epilogue's, with dy's column sums always pipelined
    // (sum_a_columns_pipelined: 8 row loads in flight; session 4, when dgelu_epilogue still added
    // each row as its load returned, suspected of setting the dGELU kernel's length).
    __device__ void side_job(int tid, int threads, const shape& sh) const {
        zero_slice(tid, threads);
        if (colsum) sum_a_columns_pipelined(tid, threads, sh);
    }
    template <typename Acc>
    __device__ void box(tile_state&, Acc& acc, int ch, const tile_pos& pos, const shape& sh,
                        const gemm4::out_tile<bf16>& in) const {
        float v[16];                                   // [2j + p]: column 8j + 2t + p, summed over rows g, g+8
#pragma unroll
        for (int j = 0; j < CC / 8; ++j) {
            const int blk = ch * CC / 8 + j;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float2 x = __bfloat1622float2(*reinterpret_cast<const bf16_2*>(in.ptr(pos.g + 8 * h, 8 * j + 2 * pos.t)));
                acc.d[4 * blk + 2 * h] *= gelu_grad(x.x);
                acc.d[4 * blk + 2 * h + 1] *= gelu_grad(x.y);
            }
            v[2 * j] = acc.d[4 * blk] + acc.d[4 * blk + 2];
            v[2 * j + 1] = acc.d[4 * blk + 1] + acc.d[4 * blk + 3];
        }
        // Reduce-scatter over g (lane bits 2-4): at each round a lane keeps the half of its values
        // whose block bit matches its own g bit and adds the partner's copy of that half.
#pragma unroll
        for (int half = 8, lane_bit = 16; half >= 2; half /= 2, lane_bit /= 2) {
            const bool upper = (4 * pos.g) & lane_bit;   // lane & lane_bit, as lane = 4g + t
#pragma unroll
            for (int k = 0; k < half; ++k) {
                const float keep = upper ? v[k + half] : v[k], send = upper ? v[k] : v[k + half];
                v[k] = keep + __shfl_xor_sync(0xffffffffu, send, lane_bit);
            }
        }
        const int col = pos.tile_col + ch * CC + 8 * pos.g + 2 * pos.t;   // block j = g
        if (pos.slab_row < sh.M && col < sh.N)
            *reinterpret_cast<float2*>(bias_grad_partial + size_t(pos.slab_row / 16) * sh.N + col) = make_float2(v[0], v[1]);
    }
};

// ---- session 5: the dGELU epilogue on an instruction diet ("fast=1", the default) -----------
// Why: the dGELU GEMM takes ~200 µs at M = 16384 on every schedule where c_fc's GEMM (same shape,
// same bytes through the epilogue) takes ~151 on ping-pong. Its epilogue is ~3x c_fc's in SASS:
// ~3800-4000 instructions per warp per tile against ~1300 (cuobjdump of mlp_pingpong.cu, session
// 5), so in ping-pong it can outlast the other consumer's main loop it should hide behind, and on
// step 4 every instruction of it is exposed. Three cuts, same values (to fp32 rounding):
//   - GELU' in 8 fp32 operations and one tanh instead of ~14 (gelu_grad_fast below);
//   - db1's column sums by the reduce-scatter (14 shuffles per box instead of 48) for the
//     per-thread-load policy too;
//   - that reduce-scatter written round by round (reduce_scatter_16): the loop form in
//     dgelu_pre_tma_epilogue made ptxas index its float[16] at run time, i.e. spill it to local
//     memory (208 LDL + 84 STL in the ping-pong kernel's epilogue).
// GELU'(x) = (1 + T + x·(1 - T²)·u'(x)) / 2, T = tanh(u), u = √(2/π)(x + 0.044715 x³), u' = du/dx.
__device__ __forceinline__ float gelu_grad_fast(float x) {
    constexpr float K0 = SQRT_2_OVER_PI, K1 = SQRT_2_OVER_PI * GELU_C;
    const float x2 = x * x;
    const float T = tanh_approx(x * fmaf(K1, x2, K0));
    const float du = fmaf(3.0f * K1, x2, K0);
    const float s = fmaf(-T, T, 1.0f);
    return fmaf(fmaf(x * s, du, T), 0.5f, 0.5f);
}

// One round of the reduce-scatter over the 8 lanes sharing columns (lane bits 2-4 = g): a lane
// keeps the half of v[0 .. 2·HALF) whose block bit matches its g bit and adds the partner's copy.
template <int HALF, int LANE_BIT>
__device__ __forceinline__ void reduce_scatter_round(float (&v)[16], bool upper) {
#pragma unroll
    for (int k = 0; k < HALF; ++k) {
        const float keep = upper ? v[k + HALF] : v[k], send = upper ? v[k] : v[k + HALF];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, LANE_BIT);
    }
}
// v[2j + p] = this lane's sum over rows g, g+8 of column 8j + 2t + p of box ch. Sums over the
// warp's 16 rows and stores, from lane (g, t), columns 8g + 2t, +1 of the box into db1's partials.
// partial == nullptr: no bias gradient is wanted (bias_grads = false), nothing to sum.
__device__ __forceinline__ void store_db1_partial(float (&v)[16], float* partial, int ch, const tile_pos& pos,
                                                  const shape& sh) {
    if (!partial) return;
    reduce_scatter_round<8, 16>(v, pos.g & 4);
    reduce_scatter_round<4, 8>(v, pos.g & 2);
    reduce_scatter_round<2, 4>(v, pos.g & 1);
    const int col = pos.tile_col + ch * CC + 8 * pos.g + 2 * pos.t;   // 8-column block g
    if (pos.slab_row < sh.M && col < sh.N)
        *reinterpret_cast<float2*>(partial + size_t(pos.slab_row / 16) * sh.N + col) = make_float2(v[0], v[1]);
}

// dgelu_epilogue (per-thread pre loads, the default's policy) with the cuts above, and a fourth:
// when the warp's whole 16-row slab lies inside pre (every tile but the last row or column of
// tiles), its 16 loads per box come from two row pointers at constant offsets, without a bounds
// check and address computation per load (dgelu_epilogue's load_pre spends ~10 integer
// instructions on each).
struct dgelu_fast_epilogue : dgelu_epilogue {
    static dgelu_fast_epilogue make(const gemm_args& g) { return {dgelu_epilogue::make(g)}; }
    __device__ void load_pre_fast(int ch, uint32_t (&dst)[CC / 8][2], const tile_pos& pos, const shape& sh) const {
        if (pos.slab_row + 16 > sh.M || pos.tile_col + pos.cols > sh.N) { load_pre(ch, dst, pos, sh); return; }
        const unsigned int* row0 = reinterpret_cast<const unsigned int*>(
            pre + size_t(pos.slab_row + pos.g) * sh.N + pos.tile_col + ch * CC + 2 * pos.t);
        const unsigned int* row8 = row0 + 4 * size_t(sh.N);      // 8 rows down: 8·N bf16 = 4·N words
#pragma unroll
        for (int j = 0; j < CC / 8; ++j) { dst[j][0] = __ldg(row0 + 4 * j); dst[j][1] = __ldg(row8 + 4 * j); }
    }
    __device__ void begin_tile(tile_state& st, const tile_pos& pos, const shape& sh) const {
        prefetch_tile_rows(pos, sh);
        load_pre_fast(0, st.pre[0], pos, sh);
    }
    template <typename Acc>
    __device__ void box(tile_state& st, Acc& acc, int ch, const tile_pos& pos, const shape& sh) const {
        if (ch + 1 < Acc::cols / CC) load_pre_fast(ch + 1, st.pre[(ch + 1) % 2], pos, sh);   // in flight during this box
        float v[16];
#pragma unroll
        for (int j = 0; j < CC / 8; ++j) {
            const int blk = ch * CC / 8 + j;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 x = unpack_bf16x2(st.pre[ch % 2][j][h]);
                acc.d[4 * blk + 2 * h] *= gelu_grad_fast(x.x);
                acc.d[4 * blk + 2 * h + 1] *= gelu_grad_fast(x.y);
            }
            v[2 * j] = acc.d[4 * blk] + acc.d[4 * blk + 2];
            v[2 * j + 1] = acc.d[4 * blk + 1] + acc.d[4 * blk + 3];
        }
        store_db1_partial(v, bias_grad_partial, ch, pos, sh);
    }
};

// dgelu_pre_tma_epilogue (pre by TMA, pipelined side job) with the cuts above.
struct dgelu_pre_tma_fast_epilogue : dgelu_pre_tma_epilogue {
    static dgelu_pre_tma_fast_epilogue make(const gemm_args& g) { return {dgelu_pre_tma_epilogue::make(g)}; }
    template <typename Acc>
    __device__ void box(tile_state&, Acc& acc, int ch, const tile_pos& pos, const shape& sh,
                        const gemm4::out_tile<bf16>& in) const {
        float v[16];
#pragma unroll
        for (int j = 0; j < CC / 8; ++j) {
            const int blk = ch * CC / 8 + j;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 x = __bfloat1622float2(*reinterpret_cast<const bf16_2*>(in.ptr(pos.g + 8 * h, 8 * j + 2 * pos.t)));
                acc.d[4 * blk + 2 * h] *= gelu_grad_fast(x.x);
                acc.d[4 * blk + 2 * h + 1] *= gelu_grad_fast(x.y);
            }
            v[2 * j] = acc.d[4 * blk] + acc.d[4 * blk + 2];
            v[2 * j + 1] = acc.d[4 * blk + 1] + acc.d[4 * blk + 3];
        }
        store_db1_partial(v, bias_grad_partial, ch, pos, sh);
    }
};

// ---- session 6: c_fc's epilogue on the same diet ("fcfast=1", opt-in) ---------------------
// Why: c_fc's GEMM takes ~152 µs at M = 16384 where the same product with a bias-only epilogue
// takes ~128 on the same ping-pong tile (session 5's final call): its epilogue is not hidden
// behind the other consumer's main loop, and the kernel's time follows its instruction count.
// SASS of bias_gelu on ping-pong 64x256 (3088 instructions against the bias-only 1784): per value
// 5 FMUL + 1 FFMA + 1 FADD + a tanh for GELU, and per 8-column block of bias a bounds check, an
// address and three integer instructions to widen the bf16 pair. Two cuts, same values:
//   - GELU in 5 fp32 operations and a tanh (gelu_fast below): h is within fp32 rounding of
//     gelu()'s (the same formula, reassociated), so a few bf16 units apart at most;
//   - the bias of a whole box at once when the box lies inside C's columns (always, when N is a
//     multiple of 64 as the bindings require): no per-column checks, and each bf16 pair widened
//     by a shift and a mask. pre is bit-identical to bias_gelu's (the same fp32 additions).
// GELU(x) = x/2 + x/2·tanh(u), u = x·(K0 + K1·x²): FMUL x², FFMA, FMUL u, tanh, FMUL x/2, FFMA.
__device__ __forceinline__ float gelu_fast(float x) {
    constexpr float K0 = SQRT_2_OVER_PI, K1 = SQRT_2_OVER_PI * GELU_C;
    const float T = tanh_approx(x * fmaf(K1, x * x, K0));
    const float half_x = 0.5f * x;
    return fmaf(half_x, T, half_x);
}

// add_bias for a box inside C's columns: thread (g, t) reads the bf16 pairs at columns
// 8j + 2t, +1 of the box (j = 0..7) from one pointer at constant offsets; a box that reaches past
// column N (only when N is not a multiple of 64) takes add_bias's checked path.
template <typename Acc>
__device__ __forceinline__ void add_bias_fast(Acc& acc, const bf16* bias, int ch, const tile_pos& pos, const shape& sh) {
    if (!bias) return;
    const int box_col = pos.tile_col + ch * CC;
    if (box_col + CC > sh.N) { add_bias(acc, bias, ch, pos, sh); return; }
    const uint32_t* pair = reinterpret_cast<const uint32_t*>(bias + box_col + 2 * pos.t);   // 4-byte aligned: col even
#pragma unroll
    for (int j = 0; j < CC / 8; ++j) {
        const uint32_t w = __ldg(pair + 4 * j);                        // columns 8j + 2t (low half), +1 (high)
        const float b0 = __uint_as_float(w << 16), b1 = __uint_as_float(w & 0xffff0000u);
        const int blk = ch * CC / 8 + j;
#pragma unroll
        for (int h = 0; h < 2; ++h) { acc.d[4 * blk + 2 * h] += b0; acc.d[4 * blk + 2 * h + 1] += b1; }
    }
}

// bias_gelu (pre and h) with both cuts.
struct bias_gelu_fast_epilogue : bias_gelu_epilogue {
    static bias_gelu_fast_epilogue make(const gemm_args& g) { return {bias_gelu_epilogue::make(g)}; }
    template <typename Acc>
    __device__ void box(tile_state&, Acc& acc, int ch, const tile_pos& pos, const shape& sh) const {
        add_bias_fast(acc, bias, ch, pos, sh);
    }
    __device__ float2 value(int o, float v0, float v1, int, const shape&) const {
        if (o == 1) { v0 = gelu_fast(v0); v1 = gelu_fast(v1); }
        return make_float2(v0, v1);
    }
};

// bias_gelu_h_only (evaluation: h alone) with both cuts: the same float operations as
// bias_gelu_fast's h, so with fcfast=1 the evaluation forward's y stays bit-identical to the
// training forward's. Instantiated in kernels/mlp_inference.cu.
struct bias_gelu_h_only_fast_epilogue : bias_gelu_h_only_epilogue {
    static bias_gelu_h_only_fast_epilogue make(const gemm_args& g) { return {bias_gelu_h_only_epilogue::make(g)}; }
    template <typename Acc>
    __device__ void box(tile_state&, Acc& acc, int ch, const tile_pos& pos, const shape& sh) const {
        add_bias_fast(acc, bias, ch, pos, sh);
    }
    __device__ float2 value(int, float v0, float v1, int, const shape&) const { return make_float2(gelu_fast(v0), gelu_fast(v1)); }
};

// bias_gelu_fast that stages its boxes itself ("fcfast=2", opt-in; session 6): through gemm4's
// STORES_SLAB hook (kernels/gemm_4_warp_specialized.cuh, engineer G, session 6) the policy moves
// the whole slab, so a box's two outputs need fewer instructions on the way out:
//   - each output box is staged with 4 stmatrix.x4 (one 8x8 bf16 block per lane group, the same
//     layout as the accumulator: kernels/gemm_plain_epilogue.cuh explains the mapping) instead of
//     16 shared stores and their 16 swizzled addresses;
//   - pre and h of a box are computed first and then staged together, behind ONE wait for the
//     staging buffers, ONE proxy fence and one commit group, where the per-value path fences,
//     syncs and commits once per output (each fence waits for the warp's shared stores to land).
// Values are bias_gelu_fast's exactly (same operations, same bf16 rounding). With one staging
// buffer per warp (schedule 10) the two outputs go one after the other through it.
struct bias_gelu_stmatrix_epilogue : bias_gelu_fast_epilogue {
    static constexpr bool STORES_SLAB = true;
    static bias_gelu_stmatrix_epilogue make(const gemm_args& g) { return {bias_gelu_fast_epilogue::make(g)}; }

    // One 16 x 64 bf16 box from regs[j][h] (8-column block j, rows g / g + 8, as the accumulator
    // holds them) into buf: lane l gives the address of row l % 8 (+8 when (l / 8) is odd) of
    // block 2q + l / 16 for stmatrix q.
    template <typename CTile>
    __device__ static __forceinline__ void stage_box(CTile& buf, const uint32_t (&regs)[CC / 8][2], int lane) {
#pragma unroll
        for (int q = 0; q < CC / 16; ++q)
            stmatrix_staging::stage_blocks(buf, q, {regs[2 * q][0], regs[2 * q][1], regs[2 * q + 1][0], regs[2 * q + 1][1]}, lane);
    }
    template <int NBUF, typename CTile, typename Acc>
    __device__ __forceinline__ void store_slab(CTile (&bufs)[NBUF], Acc& acc, const tile_pos& pos, const shape& sh,
                                               int lane) const {
        static_assert(CTile::cols == CC, "bf16 boxes of 64 columns");
        constexpr int BOXES = Acc::cols / CC;
        static_assert(NBUF == 1 || (2 * BOXES) % NBUF == 0, "buffer ring must restart in step with the slab");
        const int box_row = pos.slab_row / 16;
#pragma unroll
        for (int ch = 0; ch < BOXES; ++ch) {
            add_bias_fast(acc, bias, ch, pos, sh);
            uint32_t pre_regs[CC / 8][2], h_regs[CC / 8][2];
#pragma unroll
            for (int j = 0; j < CC / 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i = 4 * (ch * CC / 8 + j) + 2 * h;
                    pre_regs[j][h] = stmatrix_staging::pack_bf16(acc.d[i], acc.d[i + 1]);
                    h_regs[j][h] = stmatrix_staging::pack_bf16(gelu_fast(acc.d[i]), gelu_fast(acc.d[i + 1]));
                }
            const bool store = inside(box_row, pos.tile_col / CC + ch, sh);
            if constexpr (NBUF >= 2) {                 // both outputs at once: box ch owns buffers 2ch, 2ch + 1 (mod NBUF)
                CTile& buf_pre = bufs[(2 * ch) % NBUF];
                CTile& buf_h = bufs[(2 * ch + 1) % NBUF];
                if (lane == 0) tma::store_wait_read<NBUF / 2 - 1>();   // the box NBUF/2 boxes ago has been read
                __syncwarp();
                stage_box(buf_pre, pre_regs, lane);
                stage_box(buf_h, h_regs, lane);
                fence_proxy_async();                   // generic writes -> TMA reads
                __syncwarp();
                if (lane == 0) {
                    if (store) { tma::store_async(C, buf_pre, box_row, pos.tile_col / CC + ch);
                                 tma::store_async(C2, buf_h, box_row, pos.tile_col / CC + ch); }
                    tma::store_commit_group();         // (an empty group keeps the count in step)
                }
            } else {                                   // one buffer: pre, then h
#pragma unroll
                for (int o = 0; o < 2; ++o) {
                    if (lane == 0) tma::store_wait_read<0>();
                    __syncwarp();
                    stage_box(bufs[0], o == 0 ? pre_regs : h_regs, lane);
                    fence_proxy_async();
                    __syncwarp();
                    if (lane == 0) {
                        if (store) tma::store_async(o == 0 ? C : C2, bufs[0], box_row, pos.tile_col / CC + ch);
                        tma::store_commit_group();
                    }
                }
            }
        }
    }
};

// ---- session 6: c_fc on step 4 with its epilogue under the next tile's math ("fcfast=3") ---
// c_fc's product deferred like c_proj's (bias_deferred below): pre = bf16(acc + b1) packed at the
// tile's end (the default's pre, bit for bit), and after one of the next tile's first k-steps each
// box's pre is staged and h = GELU(pre) computed FROM THE bf16 pre (as eager PyTorch computes it,
// and as the backward's GELU' sees it), staged too, both behind one fence. h is therefore not
// fcfast=1/2's h (which starts from the fp32 sum); its evaluation twin bias_gelu_h_only_rounded
// rounds the same way so y stays bit-identical between the two forwards. Step 4 only (the hook is
// step 4's): c_fc's auto schedule is ping-pong, so the spec is fc=4,fcfast=3.
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

struct bias_gelu_deferred_epilogue : bias_gelu_stmatrix_epilogue {
    static constexpr bool DEFERS_STORE = true;
    int n;                                             // C's columns (hold() gets no shape)
    static bias_gelu_deferred_epilogue make(const gemm_args& g) { return {bias_gelu_stmatrix_epilogue::make(g), g.N}; }
    template <int COLS> struct held {
        static constexpr int boxes = COLS / CC;
        uint32_t pre[COLS / 4];    // bf16 pairs: pre[2·blk + h] = 8-column block blk, row g + 8h
        tile_pos pos;
    };
    template <typename Acc, int COLS>
    __device__ __forceinline__ void hold(held<COLS>& hd, const Acc& acc, const tile_pos& pos) const {
#pragma unroll
        for (int ch = 0; ch < COLS / CC; ++ch) {
            const int box_col = pos.tile_col + ch * CC;
            const bool with_bias = bias && box_col + CC <= n;   // (boxes past N are not stored; N % 64 == 0 in the bindings)
            const uint32_t* pair = reinterpret_cast<const uint32_t*>(bias + (with_bias ? box_col + 2 * pos.t : 0));
#pragma unroll
            for (int j = 0; j < CC / 8; ++j) {
                const int blk = ch * CC / 8 + j;
                float b0 = 0.f, b1 = 0.f;
                if (with_bias) { const uint32_t w = __ldg(pair + 4 * j); b0 = __uint_as_float(w << 16); b1 = __uint_as_float(w & 0xffff0000u); }
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    hd.pre[2 * blk + h] = stmatrix_staging::pack_bf16(acc.d[4 * blk + 2 * h] + b0, acc.d[4 * blk + 2 * h + 1] + b1);
            }
        }
        hd.pos = pos;
    }
    template <int B, int NBUF, typename CTile, int COLS>
    __device__ __forceinline__ void store_held_box(CTile (&bufs)[NBUF], const held<COLS>& hd, const shape& sh, int lane) const {
        static_assert(NBUF >= 2 && NBUF % 2 == 0, "a buffer for pre and one for h");
        CTile& buf_pre = bufs[(2 * B) % NBUF];
        CTile& buf_h = bufs[(2 * B + 1) % NBUF];
        if (lane == 0) tma::store_wait_read<NBUF / 2 - 1>();   // the box NBUF/2 boxes ago has been read
        __syncwarp();
#pragma unroll
        for (int q = 0; q < CC / 16; ++q) {
            const int i = 2 * (B * CC / 8 + 2 * q);    // blocks 2q, 2q + 1 of box B, rows g and g + 8
            stmatrix_staging::stage_blocks(buf_pre, q, {hd.pre[i], hd.pre[i + 1], hd.pre[i + 2], hd.pre[i + 3]}, lane);
            uint32_t hr[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float2 x = unpack_bf16x2(hd.pre[i + k]);
                hr[k] = stmatrix_staging::pack_bf16(gelu_fast(x.x), gelu_fast(x.y));
            }
            stmatrix_staging::stage_blocks(buf_h, q, hr, lane);
        }
        fence_proxy_async();                           // generic writes -> TMA reads
        __syncwarp();
        if (lane == 0) {
            const int box_row = hd.pos.slab_row / 16, box_col = hd.pos.tile_col / CC + B;
            if (inside(box_row, box_col, sh)) { tma::store_async(C, buf_pre, box_row, box_col); tma::store_async(C2, buf_h, box_row, box_col); }
            tma::store_commit_group();                 // (an empty group keeps the count in step)
        }
    }
};

// Its evaluation twin: h = GELU(bf16(acc + b1)) on every schedule (the per-value path).
struct bias_gelu_h_only_rounded_epilogue : bias_gelu_h_only_fast_epilogue {
    static bias_gelu_h_only_rounded_epilogue make(const gemm_args& g) { return {bias_gelu_h_only_fast_epilogue::make(g)}; }
    __device__ float2 value(int, float v0, float v1, int, const shape&) const {
        return make_float2(gelu_fast(round_bf16(v0)), gelu_fast(round_bf16(v1)));
    }
};

// ---- session 6: c_proj's and dx's stores under the next tile's math ("defer=1", opt-in) -----
// The same mechanism as bias_gelu_deferred (above) for the two long-K products on step 4 (c_proj's
// y = acc + b2 and dx): at a tile's end the bias is added and the values rounded to bf16 pairs (what the
// default stores, bit for bit), the next tile's wgmmas start, and each box is staged by stmatrix
// and TMA-stored after one of its first k-steps. What stays exposed is the bias add and the
// packing (~3 instructions per pair); the default's whole epilogue (~130 per box) was.
// Without G's DEFERS_STORE hook it is bias_epilogue.
struct bias_deferred_epilogue : bias_epilogue {
    static constexpr bool DEFERS_STORE = true;
    int n;                                             // C's columns (hold() gets no shape)
    static bias_deferred_epilogue make(const gemm_args& g) { return {bias_epilogue::make(g), g.N}; }
    template <int COLS> struct held {
        static constexpr int boxes = COLS / CC;
        uint32_t v[COLS / 4];      // bf16 pairs: v[2·blk + h] = 8-column block blk, row g + 8h
        tile_pos pos;
    };
    template <typename Acc, int COLS>
    __device__ __forceinline__ void hold(held<COLS>& hd, const Acc& acc, const tile_pos& pos) const {
#pragma unroll
        for (int ch = 0; ch < COLS / CC; ++ch) {
            const int box_col = pos.tile_col + ch * CC;
            const bool with_bias = bias && box_col + CC <= n;   // (boxes past N are not stored; N % 64 == 0 in the bindings)
            const uint32_t* pair = reinterpret_cast<const uint32_t*>(bias + (with_bias ? box_col + 2 * pos.t : 0));
#pragma unroll
            for (int j = 0; j < CC / 8; ++j) {
                const int blk = ch * CC / 8 + j;
                float b0 = 0.f, b1 = 0.f;
                if (with_bias) { const uint32_t w = __ldg(pair + 4 * j); b0 = __uint_as_float(w << 16); b1 = __uint_as_float(w & 0xffff0000u); }
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    hd.v[2 * blk + h] = stmatrix_staging::pack_bf16(acc.d[4 * blk + 2 * h] + b0, acc.d[4 * blk + 2 * h + 1] + b1);
            }
        }
        hd.pos = pos;
    }
    template <int B, int NBUF, typename CTile, int COLS>
    __device__ __forceinline__ void store_held_box(CTile (&bufs)[NBUF], const held<COLS>& hd, const shape& sh, int lane) const {
        CTile& buf = bufs[B % NBUF];
        if (lane == 0) tma::store_wait_read<NBUF - 1>();   // the store NBUF boxes ago has read buf
        __syncwarp();
#pragma unroll
        for (int q = 0; q < CC / 16; ++q) {
            const int i = 2 * (B * CC / 8 + 2 * q);    // blocks 2q, 2q + 1 of box B, rows g and g + 8
            stmatrix_staging::stage_blocks(buf, q, {hd.v[i], hd.v[i + 1], hd.v[i + 2], hd.v[i + 3]}, lane);
        }
        fence_proxy_async();                           // generic writes -> TMA reads
        __syncwarp();
        if (lane == 0) {
            const int box_row = hd.pos.slab_row / 16, box_col = hd.pos.tile_col / CC + B;
            if (inside(box_row, box_col, sh)) tma::store_async(C, buf, box_row, box_col);
            tma::store_commit_group();                 // (an empty group keeps the count in step)
        }
    }
};

// Weight gradients: fp32 partial tiles of the split token range, TMA reduce-added into zeroed dW.
struct reduce_add_epilogue : base_epilogue<float> {
    static constexpr int OUTPUTS = 1;
    static reduce_add_epilogue make(const gemm_args& g) { return {{out_view<float>(g.c, g)}}; }
    template <typename Acc>
    __device__ void box(tile_state&, Acc&, int, const tile_pos&, const shape&) const {}
    __device__ void store(int, gemm4::out_tile<float>& buf, int box_row, int box_col, const shape& sh) const {
        if (inside(box_row, box_col, sh)) tma::store_add_async(C, buf, box_row, box_col);
    }
};

// linear_bias_gelu with g.c == nullptr (no pre): every schedule, in kernels/mlp_inference.cu (the
// fast policy when g.fast_gelu).
const char* linear_bias_gelu_h_only(const gemm_args& g);

// Session 7 (opt-in): the dGELU GEMM (fast=3 or 4) and c_fc (fcfast=4) with their epilogues under
// the next tile's math in half boxes, on step 4's tile (kernels/mlp_deferred.cuh's kernel), in
// kernels/mlp_dgelu_deferred.cu and kernels/mlp_fc_deferred.cu.
const char* linear_dgelu_deferred(const gemm_args& g);
const char* linear_bias_gelu_parts(const gemm_args& g);

// The ping-pong launcher, defined in kernels/mlp_pingpong.cuh and instantiated for every policy in
// kernels/mlp_pingpong.cu, kernels/mlp_pingpong_gelu_grad.cu and kernels/mlp_pingpong_gelu_fast.cu, so its
// kernels compile in parallel with step 4's.
// schedule: one of mlp.h's SCHEDULE_PINGPONG_* (5, 6, 7, 8, 10).
template <major MA, major MB, typename Epi>
const char* launch_pingpong(const gemm_args& g, int schedule);

}  // namespace tk_mlp::detail

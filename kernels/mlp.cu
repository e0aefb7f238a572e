// kernels/mlp.cu — GPT-2's MLP (c_fc -> GELU(tanh) -> c_proj), forward and backward, as five GEMMs
// whose epilogues do the elementwise work, on tk's warpgroup ops (wgmma, TMA, mbarriers).
//
// Roofline at GPT-2 sizes (M = B·T tokens, C = 768, hidden H = 4C = 3072, bf16):
//   forward  = 2 GEMMs of 2·M·C·H FLOPs = 4·M·C·H = 155 GFLOP at M = 16384; backward = 2x that.
//   The forward must move x (25 MB), W1 and W2 (5 MB each), pre and h (100 MB each) and y
//   (25 MB): ~260 MB, i.e. ~600 FLOP per byte against the H200's ~180 (750 TFLOP/s over
//   4.2 TB/s). So the op is compute-bound by ~3x: its time is tensor-core time.
//   Why fuse the GELU anyway: unfused, "GELU(x·W1ᵀ + b1)" is a GEMM plus an elementwise pass
//   that reads the 4x-wide pre-activation and writes h (200 MB, ~50 µs at 16k tokens: a quarter
//   of the forward's compute time), and the backward's dGELU is another pass reading dh and pre
//   and writing dpre (300 MB). Fused, those values never make the round trip: the epilogue
//   applies them to the fp32 accumulators on their way out, and only the outputs the next step
//   needs are written once. The cost left is epilogue arithmetic (one tanh.approx per value),
//   which this design does not overlap with the math: both consumers finish a tile together.
//   Measured figures and what would close the gap to 1.1x eager: kernels/NOTES.md, MLP.
//
// The kernel is engineer D's GEMM step 4, shared through kernels/gemm_4_warp_specialized.cuh
// (read it and gemm_4_warp_specialized.cu first): a producer warpgroup issues TMA loads into a
// 4-stage ring, two consumer warpgroups run wgmma on 128x256 tiles of a persistent grid, and
// each consumer warp stores its 16 rows through its own staging boxes with TMA. Its epilogue
// is a template parameter, a policy called per accumulator box; this file holds only the
// MLP's policies and launchers.
//
// The epilogues, one per product (every value passes through them in fp32, in registers):
//   bias_gelu   c_fc forward: pre = acc + b1, h = GELU(pre). Writes BOTH pre and h (bf16).
//               h feeds c_proj; pre is kept for the backward's GELU'. We save pre rather than
//               recompute it: recomputing needs x·W1ᵀ again (one more GEMM, a sixth of the
//               step's FLOPs), and eager PyTorch keeps the same two tensors, so memory is unchanged.
//   bias        c_proj forward: y = acc + b2 (or plain acc without bias; also used for dx).
//   dgelu       the backward's dh = dy·W2 GEMM: dpre = acc ⊙ GELU'(pre). Each thread reads pre
//               at its own accumulator positions: the first box's worth into registers and the
//               rest into L2 (prefetch) when the tile STARTS, so the latency hides behind the
//               tile's wgmmas; later boxes are loaded one box ahead. It also sums dpre down each
//               16-row slab (warp shuffles)
//               and stores those column sums: db1 is then a small reduction of M/16 rows, not a
//               pass over the M x 4C dpre.
//   reduce_add  the weight gradients dW = Aᵀ·B contract over the tokens (16k-64k) but have only
//               72 output tiles for 132 SMs: the token range is split (split-K) and each
//               unit's fp32 partial tile is added into a zeroed dW by a TMA reduce-add store.
// GELU is the tanh form, evaluated with the tanh.approx.f32 instruction (relative error about
// 2^-11, below bf16's 2^-8 output precision; the H200 run matched float64 to 2e-3).
//
// Read in order: GELU math, the epilogue policies (bias, bias_gelu, dgelu, reduce_add),
// launchers.
#include <algorithm>
#include "mlp.h"
#include "gemm_4_warp_specialized.cuh"

namespace {
using namespace tk;
using wgmma::major;

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
using cfg = gemm4::config<4, 64, false>;     // step 4's default: 4 stages of K = 64, one group in flight
constexpr int BM = gemm4::BM, BN = gemm4::BN, BK = cfg::BK;
constexpr int CC = gemm4::box_cols<bf16>;    // columns per accumulator box (bf16 outputs)

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

// What every policy here shares: no per-tile state, values staged as they are, and a plain TMA
// store of output 0 (or of C2 for output 1) for boxes inside C.
template <typename OutT>
struct base_epilogue {
    using out_t = OutT;
    struct tile_state {};
    gemm4::out_gl<OutT> C;
    __device__ void begin_tile(tile_state&, const tile_pos&, const shape&) const {}
    __device__ float2 value(int, float v0, float v1, int, const shape&) const { return make_float2(v0, v1); }
    __device__ static bool inside(int box_row, int box_col, const shape& sh) {
        return box_col * gemm4::box_cols<OutT> < sh.N && box_row * 16 < sh.M;
    }
};

// c_proj forward (y = acc + b2) and dx (no bias).
struct bias_epilogue : base_epilogue<bf16> {
    static constexpr int OUTPUTS = 1;
    const bf16* bias;                                  // [N] or nullptr
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

// The backward's dh = dy·W2 GEMM: dpre = acc ⊙ GELU'(pre), plus db1 partials (column sums of
// dpre over each 16-row slab).
struct dgelu_epilogue : base_epilogue<bf16> {
    static constexpr int OUTPUTS = 1;
    static constexpr int CHUNKS = BN / CC;
    const bf16* pre;                                   // [M][N]
    float* bias_grad_partial;                          // [ceil(M/16)][N]

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
    __device__ void begin_tile(tile_state& st, const tile_pos& pos, const shape& sh) const {
#pragma unroll
        for (int h = 0; h < 2; ++h) {                // lane t prefetches the t-th 128-byte line of each row
            const int r = pos.slab_row + pos.g + 8 * h, col = pos.tile_col + 64 * pos.t;
            if (r < sh.M && col < sh.N) asm volatile("prefetch.global.L2 [%0];" :: "l"(pre + size_t(r) * sh.N + col));
        }
        load_pre(0, st.pre[0], pos, sh);
    }
    template <typename Acc>
    __device__ void box(tile_state& st, Acc& acc, int ch, const tile_pos& pos, const shape& sh) const {
        if (ch + 1 < CHUNKS) load_pre(ch + 1, st.pre[(ch + 1) % 2], pos, sh);   // in flight during this box
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

// Weight gradients: fp32 partial tiles of the split token range, TMA reduce-added into zeroed dW.
struct reduce_add_epilogue : base_epilogue<float> {
    static constexpr int OUTPUTS = 1;
    template <typename Acc>
    __device__ void box(tile_state&, Acc&, int, const tile_pos&, const shape&) const {}
    __device__ void store(int, gemm4::out_tile<float>& buf, int box_row, int box_col, const shape& sh) const {
        if (inside(box_row, box_col, sh)) tma::store_add_async(C, buf, box_row, box_col);
    }
};

// ---- launchers --------------------------------------------------------------------------------
template <major MA, major MB, typename Epi, typename MakeEpi>
const char* launch(const tk_mlp::gemm_args& g, MakeEpi&& make_epi) {
    if (g.M <= 0 || g.N <= 0 || g.K <= 0) return "tk_mlp: empty GEMM";
    return gemm4::launch<cfg, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, std::max(g.splits, 1),
                                           g.num_sms, g.stream, make_epi);
}
template <typename OutT> gemm4::out_gl<OutT> out_view(void* c, const tk_mlp::gemm_args& g) {
    return gemm4::out_gl<OutT>(static_cast<OutT*>(c), 1, g.M, g.N);
}
}  // namespace

namespace tk_mlp {

const char* linear_bias_gelu(const gemm_args& g) {
    if (!g.c2) return "tk_mlp: linear_bias_gelu needs both outputs (pre and h)";
    return launch<major::K, major::K, bias_gelu_epilogue>(g, [&] {
        return bias_gelu_epilogue{{out_view<bf16>(g.c, g)}, out_view<bf16>(g.c2, g), static_cast<const bf16*>(g.bias)};
    });
}
const char* linear_bias(const gemm_args& g) {
    return launch<major::K, major::K, bias_epilogue>(g, [&] {
        return bias_epilogue{{out_view<bf16>(g.c, g)}, static_cast<const bf16*>(g.bias)};
    });
}
const char* linear_dgelu(const gemm_args& g) {
    if (!g.pre || !g.bias_grad_partial) return "tk_mlp: linear_dgelu needs pre and bias_grad_partial";
    return launch<major::K, major::MN, dgelu_epilogue>(g, [&] {
        return dgelu_epilogue{{out_view<bf16>(g.c, g)}, static_cast<const bf16*>(g.pre), g.bias_grad_partial};
    });
}
const char* linear_grad_input(const gemm_args& g) {
    return launch<major::K, major::MN, bias_epilogue>(g, [&] {
        return bias_epilogue{{out_view<bf16>(g.c, g)}, static_cast<const bf16*>(g.bias)};
    });
}
const char* weight_grad(const gemm_args& g) {
    return launch<major::MN, major::MN, reduce_add_epilogue>(g, [&] {
        return reduce_add_epilogue{{out_view<float>(g.c, g)}};
    });
}

// Split-K for few output tiles (engineer D's cost model from kernels/gemm.py): time ~ waves x
// (k-tiles per unit + the epilogue, worth ~3 k-tiles when it reduce-adds fp32); take the cheapest.
int choose_splits(int M, int N, int K, int num_sms) {
    const int tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    const int k_tiles = (K + BK - 1) / BK;
    if (tiles >= 2 * num_sms || k_tiles < 16) return 1;
    int best = 1;
    double best_cost = 0;
    for (int s = 1; s <= std::min(16, k_tiles / 8); ++s) {
        const int waves = (tiles * s + num_sms - 1) / num_sms;
        const double cost = waves * (double(k_tiles) / s + (s > 1 ? 3 : 1));
        if (s == 1 || cost < best_cost - 1e-9) { best = s; best_cost = cost; }
    }
    return best;
}

}  // namespace tk_mlp

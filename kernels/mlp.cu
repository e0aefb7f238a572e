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
// The kernel is engineer D's GEMM step 4 (kernels/gemm_4_warp_specialized.cu: read it first)
// with the epilogue made a template parameter: a producer warpgroup issues TMA loads into a
// 4-stage ring, two consumer warpgroups run wgmma on 128x256 tiles of a persistent grid, and
// each consumer warp stores its 16 rows through its own staging boxes with TMA.
// (Step 4 keeps its kernel private to its .cu and has a fixed bias/GELU epilogue; the MLP needs
// epilogues with two outputs, an extra input and a reduction, so the loop is restated here with
// a hook, see kernels/NOTES.md, MLP.)
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
// Read in order: GELU math, tile shapes, work decomposition, kernel (producer, consumer,
// epilogue), launchers.
#include <algorithm>
#include <string>
#include "mlp.h"
#include "tk/types/types.cuh"
#include "tk/ops/group/group.cuh"

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

// ---- tile shapes (as step 4) ----------------------------------------------------------------
constexpr int BM = 128, BN = 256, BK = 64;   // CTA tile; each consumer owns 64 x 256
constexpr int STAGES = 4;
constexpr int CONSUMERS = 2;
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int GROUP_M = 16;                  // tile rows walked together (L2 reuse)

enum class epi { bias, bias_gelu, dgelu, reduce_add };

template <major M, int MN> using operand_tile = std::conditional_t<M == major::K, st<bf16, MN, BK>, st<bf16, BK, MN>>;
// Each consumer warp stages 16 rows x 128 bytes of output at a time: one 128B-swizzled TMA box.
template <typename OutT> using out_tile = st<OutT, 16, 128 / sizeof(OutT)>;

template <major MA, major MB, typename OutT>
struct layout {
    using a_tile = operand_tile<MA, BM>;
    using b_tile = operand_tile<MB, BN>;
    using c_tile = out_tile<OutT>;
    using a_gl = gl<bf16, runtime, runtime, a_tile>;
    using b_gl = gl<bf16, runtime, runtime, b_tile>;
    using c_gl = gl<OutT, runtime, runtime, c_tile>;
    struct smem {
        a_tile a[STAGES];
        b_tile b[STAGES];
        c_tile c[CONSUMERS][4][2];         // TMA-store staging: [consumer][warp][double buffer]
        mbarrier full[STAGES], empty[STAGES];
    };
    struct params {
        a_gl A; b_gl B;
        c_gl C, C2;                        // C2: h for bias_gelu (otherwise a copy of C, unused)
        int M, N, K;
        int tiles_m, tiles_n, k_tiles, splits, units;
        const bf16* bias;                  // [N] or nullptr
        const bf16* pre;                   // dgelu: [M][N]
        float* bias_grad_partial;          // dgelu: [ceil(M/16)][N]
    };
};

// ---- work decomposition: unit -> (tile row, tile column, k range), as step 4 -------------------
struct work { int tm, tn, k_begin, k_end; };
template <typename P>
__device__ inline work unit_work(const P& p, int unit) {
    // split-major (as step 4 now does): CTAs running together read the same K range, kept in L2
    int tiles = p.tiles_m * p.tiles_n;
    int tile = unit % tiles, split = unit / tiles;
    int per_group = GROUP_M * p.tiles_n;
    int first_m = (tile / per_group) * GROUP_M;
    int group_rows = min(p.tiles_m - first_m, GROUP_M);
    int in_group = tile % per_group;
    return {first_m + in_group % group_rows, in_group / group_rows,
            split * p.k_tiles / p.splits, (split + 1) * p.k_tiles / p.splits};
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const bf16_2*>(&v));
}

template <major MA, major MB, typename OutT, epi E>
__global__ void __launch_bounds__(THREADS, 1) mlp_gemm_kernel(const __grid_constant__ typename layout<MA, MB, OutT>::params p) {
    using L = layout<MA, MB, OutT>;
    extern __shared__ char smem_raw[];
    shared_allocator alloc(smem_raw);
    auto& s = alloc.template allocate<typename L::smem>();

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar::init(s.full[i], 1);                // the producer's arrive_expect_bytes
            mbar::init(s.empty[i], CONSUMERS * 4);   // one arrive per consumer warp
        }
        mbar::fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        // ================= producer: one thread issues every TMA load (as step 4) =================
        warpgroup_decrease_registers<40>();
        if (threadIdx.x == 0) {
            int it = 0;
            for (int unit = blockIdx.x; unit < p.units; unit += gridDim.x) {
                work w = unit_work(p, unit);
                for (int kt = w.k_begin; kt < w.k_end; ++kt, ++it) {
                    int stage = it % STAGES;
                    mbar::wait(s.empty[stage], ((it / STAGES) & 1) ^ 1);
                    mbar::arrive_expect_bytes(s.full[stage], tma::bytes<typename L::a_tile> + tma::bytes<typename L::b_tile>);
                    if constexpr (MA == major::K) tma::load_async(s.a[stage], p.A, w.tm, kt, s.full[stage]);
                    else                          tma::load_async(s.a[stage], p.A, kt, w.tm, s.full[stage]);
                    if constexpr (MB == major::K) tma::load_async(s.b[stage], p.B, w.tn, kt, s.full[stage]);
                    else                          tma::load_async(s.b[stage], p.B, kt, w.tn, s.full[stage]);
                }
            }
        }
        return;
    }

    // ================= consumers: wgmma on the ring, then the epilogue =================
    warpgroup_increase_registers<232>();
    const int c = wg - 1;                        // which 64-row half of the CTA tile
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    wgmma::accumulator<BN> acc;                  // element i: row 16·warp + g + 8·((i>>1)&1), col 8·(i>>2) + 2t + (i&1)
    int it = 0, staged = 0;                      // k-tiles consumed; staging tiles written
    for (int unit = blockIdx.x; unit < p.units; unit += gridDim.x) {
        const work w = unit_work(p, unit);
        const int row = w.tm * BM + 64 * c + 16 * warp + g;   // this thread's rows: row, row + 8
        const int col0 = w.tn * BN + 2 * t;                   // its columns: col0 + 8·block (+1)

        // dgelu: this thread reads pre at its accumulator positions. Chunk 0 goes into registers
        // now and the rest of its rows into L2, so the loads land while the wgmmas run; each
        // later chunk is fetched from L2 one chunk ahead of its use (registers are too few to
        // hold all 128 values next to the 128 accumulators).
        using c_tile = typename L::c_tile;
        constexpr int CC = c_tile::cols;                     // columns per box: 64 bf16 / 32 fp32
        constexpr int CHUNKS = BN / CC;
        uint32_t pre[2][E == epi::dgelu ? CC / 8 : 1][2];   // [chunk % 2][8-column block][row g / g+8]
        auto load_pre = [&](int ch, uint32_t (&dst)[E == epi::dgelu ? CC / 8 : 1][2]) {
#pragma unroll
            for (int j = 0; j < CC / 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = row + 8 * h, col = col0 + ch * CC + 8 * j;
                    dst[j][h] = (r < p.M && col < p.N)
                        ? __ldg(reinterpret_cast<const unsigned int*>(p.pre + size_t(r) * p.N + col)) : 0u;
                }
        };
        if constexpr (E == epi::dgelu) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {            // lane t prefetches the t-th 128-byte line of each row
                const int r = row + 8 * h, col = w.tn * BN + 64 * t;
                if (r < p.M && col < p.N) asm volatile("prefetch.global.L2 [%0];" :: "l"(p.pre + size_t(r) * p.N + col));
            }
            load_pre(0, pre[0]);
        }

        // ---- main loop (as step 4): wgmma over the k range, one group in flight ----
        for (int kt = w.k_begin; kt < w.k_end; ++kt, ++it) {
            int stage = it % STAGES;
            mbar::wait(s.full[stage], (it / STAGES) & 1);
            uint32_t a = smem_addr(&s.a[stage]), b = smem_addr(&s.b[stage]);
            wgmma::fence();
#pragma unroll
            for (int k = 0; k < BK / 16; ++k) {
                uint64_t da = MA == major::K ? wgmma::desc<major::K, BM, 128>(a, 64 * c, k)
                                             : wgmma::desc<major::MN, BK, 128>(a, 64 * c, k);
                uint64_t db = MB == major::K ? wgmma::desc<major::K, BN, 128>(b, 0, k)
                                             : wgmma::desc<major::MN, BK, 128>(b, 0, k);
                wgmma::mma_ss<MA, MB>(acc, da, db, kt > w.k_begin || k > 0);
            }
            wgmma::commit_group();
            if (kt > w.k_begin) {
                wgmma::wait_group<1>();
                if (lane == 0) mbar::arrive(s.empty[(it - 1) % STAGES]);
            }
        }
        wgmma::wait_group<0>();
        if (lane == 0) mbar::arrive(s.empty[(it - 1) % STAGES]);
        wgmma::fence_operand(acc);

        // ---- epilogue: box by box (each warp its own 16 rows x CC columns, no warpgroup barrier):
        // (1) the per-value transform in place in the fp32 accumulators, (2) registers ->
        // swizzled 16 x (128 bytes) staging box -> TMA store. bias_gelu writes two boxes per
        // chunk of columns (pre, then h = GELU(pre)); the warp's two staging buffers alternate so
        // one store drains while the next box fills.
        constexpr int OUTPUTS = E == epi::bias_gelu ? 2 : 1;
        const int box_row = (row - g) / 16;                  // in units of 16 rows
#pragma unroll
        for (int ch = 0; ch < CHUNKS; ++ch) {
            if constexpr (E == epi::dgelu)
                if (ch + 1 < CHUNKS) load_pre(ch + 1, pre[(ch + 1) % 2]);   // in flight during this chunk
#pragma unroll
            for (int j = 0; j < CC / 8; ++j) {
                const int blk = ch * CC / 8 + j, col = col0 + 8 * blk;
                if constexpr (E == epi::bias || E == epi::bias_gelu) {
                    if (p.bias && col < p.N) {
                        float2 b = __bfloat1622float2(*reinterpret_cast<const bf16_2*>(p.bias + col));
#pragma unroll
                        for (int h = 0; h < 2; ++h) { acc.d[4 * blk + 2 * h] += b.x; acc.d[4 * blk + 2 * h + 1] += b.y; }
                    }
                }
                if constexpr (E == epi::dgelu) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float2 x = unpack_bf16x2(pre[ch % 2][j][h]);
                        acc.d[4 * blk + 2 * h] *= gelu_grad(x.x);
                        acc.d[4 * blk + 2 * h + 1] *= gelu_grad(x.y);
                    }
                    // db1: sum this warp's 16 rows of columns (col, col+1). Rows past M hold 0
                    // (zero-filled A rows, pre read as 0), so they add nothing.
                    float s0 = acc.d[4 * blk] + acc.d[4 * blk + 2], s1 = acc.d[4 * blk + 1] + acc.d[4 * blk + 3];
#pragma unroll
                    for (int m = 4; m < 32; m *= 2) {    // lanes with equal t, across g = 0..7
                        s0 += __shfl_xor_sync(0xffffffffu, s0, m);
                        s1 += __shfl_xor_sync(0xffffffffu, s1, m);
                    }
                    const int slab_first = row - g;      // first row of this warp's 16-row slab
                    if (g == 0 && slab_first < p.M && col < p.N)
                        *reinterpret_cast<float2*>(p.bias_grad_partial + size_t(slab_first / 16) * p.N + col) = make_float2(s0, s1);
                }
            }
#pragma unroll
            for (int o = 0; o < OUTPUTS; ++o, ++staged) {
                c_tile& buf = s.c[c][warp][staged % 2];
                if (lane == 0) tma::store_wait_read<1>();    // the store from two boxes ago has read buf
                __syncwarp();
#pragma unroll
                for (int j = 0; j < CC / 8; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int i = 4 * (ch * CC / 8 + j) + 2 * h;
                        const int r = g + 8 * h, col = 8 * j + 2 * t;
                        float v0 = acc.d[i], v1 = acc.d[i + 1];
                        if (E == epi::bias_gelu && o == 1) { v0 = gelu(v0); v1 = gelu(v1); }
                        // buf.ptr applies the 128B swizzle: the warp's 32 stores hit 32 banks
                        if constexpr (sizeof(OutT) == 2)
                            *reinterpret_cast<bf16_2*>(buf.ptr(r, col)) = __floats2bfloat162_rn(v0, v1);
                        else
                            *reinterpret_cast<float2*>(buf.ptr(r, col)) = make_float2(v0, v1);
                    }
                }
                fence_proxy_async();                         // generic writes -> TMA reads
                __syncwarp();
                if (lane == 0) {
                    const int box_col = (w.tn * BN) / CC + ch;
                    if (box_col * CC < p.N && box_row * 16 < p.M) {
                        if constexpr (E == epi::reduce_add) tma::store_add_async(p.C, buf, box_row, box_col);
                        else tma::store_async(o == 0 ? p.C : p.C2, buf, box_row, box_col);
                    }
                    tma::store_commit_group();
                }
            }
        }
    }
    if (lane == 0) tma::store_wait<0>();
}
// ---- launchers --------------------------------------------------------------------------------
template <major MA, major MB, typename OutT, epi E>
const char* launch(const tk_mlp::gemm_args& g) {
    using L = layout<MA, MB, OutT>;
    using P = typename L::params;
    auto kernel = mlp_gemm_kernel<MA, MB, OutT, E>;
    constexpr int smem_bytes = sizeof(typename L::smem) + 1024;   // + alignment slack
    static bool configured = false;
    if (!configured) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess)
            return "tk_mlp: could not reserve shared memory (needs a Hopper GPU)";
        configured = true;
    }
    if (g.M <= 0 || g.N <= 0 || g.K <= 0) return "tk_mlp: empty GEMM";
    try {
        auto* a = static_cast<bf16*>(const_cast<void*>(g.a));
        auto* b = static_cast<bf16*>(const_cast<void*>(g.b));
        auto* out = static_cast<OutT*>(g.c);
        auto* out2 = g.c2 ? static_cast<OutT*>(g.c2) : out;
        P p{typename L::a_gl(a, 1, MA == major::K ? g.M : g.K, MA == major::K ? g.K : g.M),
            typename L::b_gl(b, 1, MB == major::K ? g.N : g.K, MB == major::K ? g.K : g.N),
            typename L::c_gl(out, 1, g.M, g.N), typename L::c_gl(out2, 1, g.M, g.N),
            g.M, g.N, g.K, (g.M + BM - 1) / BM, (g.N + BN - 1) / BN, (g.K + BK - 1) / BK, std::max(g.splits, 1), 0,
            static_cast<const bf16*>(g.bias), static_cast<const bf16*>(g.pre), g.bias_grad_partial};
        if (p.splits > p.k_tiles) return "tk_mlp: splits must be in 1..ceil(K/64)";
        p.units = p.tiles_m * p.tiles_n * p.splits;
        int grid = std::min(p.units, std::max(g.num_sms, 1));
        kernel<<<grid, THREADS, smem_bytes, g.stream>>>(p);
    } catch (const std::exception& e) {
        static thread_local std::string msg;
        msg = e.what();
        return msg.c_str();
    }
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}
}  // namespace

namespace tk_mlp {

const char* linear_bias_gelu(const gemm_args& g) {
    if (!g.c2) return "tk_mlp: linear_bias_gelu needs both outputs (pre and h)";
    return launch<major::K, major::K, bf16, epi::bias_gelu>(g);
}
const char* linear_bias(const gemm_args& g) { return launch<major::K, major::K, bf16, epi::bias>(g); }
const char* linear_dgelu(const gemm_args& g) {
    if (!g.pre || !g.bias_grad_partial) return "tk_mlp: linear_dgelu needs pre and bias_grad_partial";
    return launch<major::K, major::MN, bf16, epi::dgelu>(g);
}
const char* linear_grad_input(const gemm_args& g) { return launch<major::K, major::MN, bf16, epi::bias>(g); }
const char* weight_grad(const gemm_args& g) { return launch<major::MN, major::MN, float, epi::reduce_add>(g); }

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

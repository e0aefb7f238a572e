// kernels/gemm_5_pingpong.cu — GEMM step 5 (EXPERIMENTAL: compiled, not yet run on the H200):
// ping-pong consumers, so one warpgroup's epilogue overlaps the other's math.
//
// What changes from step 4: there, both consumers share one 128x256 tile, finish it together
// and run the epilogue together, so the tensor cores idle at every tile boundary (about 4 µs a
// tile on the H200, 25-30% of a tile with K = 768: kernels/NOTES.md, run 2). Here each consumer
// owns whole 128x128 tiles (two m64n128 wgmmas per k-step, 128 fp32 accumulators a thread, as
// before) and the consumers take the CTA's tiles in turn: consumer 0 tiles 0, 2, 4, ...,
// consumer 1 tiles 1, 3, 5, .... The producer fills one ring in tile order, so while consumer 0
// stores tile 0, consumer 1 already multiplies tile 1 (CUTLASS calls this schedule "pingpong").
// The price: A and B tiles of 128x64 each per k-step (32 KB per 2.1 MFLOP instead of 48 KB per
// 4.2 MFLOP), i.e. a third more L2 traffic per flop.
// What it bought: not measured yet (tests/gemm_gpu_check.sh runs it with TK_GEMM_STEP5=1).
//
// Read in order (only the differences from step 4 are commented): tiles, producer (step 4's own,
// from kernels/gemm_4_warp_specialized.cuh, as are the tile types and the work order), consumer
// (which tiles are mine, the stage counter over the tiles that are not, the turn barriers),
// epilogue, launcher.
#include <algorithm>
#include <string>
#include "gemm.cuh"
#include "gemm_4_warp_specialized.cuh"   // step 4's tile types, problem shape and work order

namespace {
using namespace tk;
using wgmma::major;

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 6;   // one consumer's tile
constexpr int CONSUMERS = 2, THREADS = 128 * (1 + CONSUMERS);

template <major M, int MN> using operand_tile = gemm4::operand_tile<M, MN, BK>;
using gemm4::out_tile;

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
        c_tile c[CONSUMERS][4][2];
        mbarrier full[STAGES], empty[STAGES];
        mbarrier turn[CONSUMERS];            // "the other consumer finished its main loop"
    };
    struct params {
        a_gl A; b_gl B; c_gl C;
        gemm4::shape sh;
        gemm::epilogue epi;
    };
};

using gemm4::work;
using gemm4::unit_work;                  // as step 4 (split-major, grouped rows), as the producer walks them

template <major MA, major MB, typename OutT>
__global__ void __launch_bounds__(THREADS, 1) gemm_pingpong_kernel(const __grid_constant__ typename layout<MA, MB, OutT>::params p) {
    using L = layout<MA, MB, OutT>;
    extern __shared__ char smem_raw[];
    shared_allocator alloc(smem_raw);
    auto& s = alloc.template allocate<typename L::smem>();

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar::init(s.full[i], 1);
            mbar::init(s.empty[i], 4);               // a stage is read by ONE consumer: its 4 warps
        }
        for (int i = 0; i < CONSUMERS; ++i) mbar::init(s.turn[i], 4);
        mbar::fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        warpgroup_decrease_registers<40>();
        if (threadIdx.x == 0) gemm4::produce<STAGES, MA, MB>(s, p.A, p.B, p.sh);   // step 4's producer, 128x128 tiles
    } else {
        warpgroup_increase_registers<232>();
        const int c = wg - 1;
        const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
        wgmma::accumulator<BN> acc[2];               // rows 0-63 and 64-127 of my tile
        int it = 0;                                  // ring position, counted over ALL tiles
        int mine = 0;                                // tiles of this CTA seen so far
        int turns = 0;                               // tiles this consumer has multiplied
        for (int unit = blockIdx.x; unit < p.sh.units; unit += gridDim.x, ++mine) {
            work w = unit_work(p.sh, unit);
            if (mine % CONSUMERS != c) {             // the other consumer's tile: skip its stages
                it += w.k_end - w.k_begin;
                continue;
            }
            // Wait for the other consumer to finish the main loop of the tile before mine. Two
            // reasons: the math of the two alternates (my epilogue overlaps its math and vice
            // versa), and every stage phase before mine has completed when I start waiting, so a
            // parity wait cannot match a phase one or two laps of the ring early.
            if (c == 0 && turns > 0) mbar::wait(s.turn[0], (turns - 1) & 1);
            if (c == 1) mbar::wait(s.turn[1], turns & 1);
            ++turns;
            for (int kt = w.k_begin; kt < w.k_end; ++kt, ++it) {
                int stage = it % STAGES;
                mbar::wait(s.full[stage], (it / STAGES) & 1);
                wgmma::fence();
#pragma unroll
                for (int k = 0; k < BK / 16; ++k) {
                    uint64_t db = wgmma::desc<MB>(s.b[stage], 0, k);
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        wgmma::mma_ss<MA, MB>(acc[h], wgmma::desc<MA>(s.a[stage], 64 * h, k), db, kt > w.k_begin || k > 0);
                }
                wgmma::commit_group();
                if (kt > w.k_begin) {
                    wgmma::wait_group<1>();
                    if (lane == 0) mbar::arrive(s.empty[(it - 1) % STAGES]);
                }
            }
            // All my waits on "full" are done (my last wgmmas may still run): the other's turn.
            if (lane == 0) mbar::arrive(s.turn[1 - c]);
            wgmma::wait_group<0>();
            if (lane == 0) mbar::arrive(s.empty[(it - 1) % STAGES]);
            wgmma::fence_operand(acc[0]);
            wgmma::fence_operand(acc[1]);

            // ---- epilogue (as step 4): each warp stores rows 16w.. of both 64-row halves ----
            using c_tile = typename L::c_tile;
            constexpr int CC = c_tile::cols;
            const int g = lane / 4, t = lane % 4;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int box_row = (w.tm * BM + 64 * h + 16 * warp) / 16;
#pragma unroll
                for (int ch = 0; ch < BN / CC; ++ch) {
                    c_tile& buf = s.c[c][warp][ch % 2];
                    if (lane == 0) tma::store_wait_read<1>();
                    __syncwarp();
#pragma unroll
                    for (int j = 0; j < CC / 8; ++j) {
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            int i = 4 * (ch * CC / 8 + j) + 2 * r;
                            int row = g + 8 * r, col = 8 * j + 2 * t;
                            int gcol = w.tn * BN + ch * CC + col;
                            float v0 = acc[h].d[i], v1 = acc[h].d[i + 1];
                            if (!p.epi.identity() && gcol < p.sh.N) { v0 = p.epi.apply(v0, gcol); v1 = p.epi.apply(v1, gcol + 1); }
                            if constexpr (sizeof(OutT) == 2)
                                *reinterpret_cast<bf16_2*>(buf.ptr(row, col)) = __floats2bfloat162_rn(v0, v1);
                            else
                                *reinterpret_cast<float2*>(buf.ptr(row, col)) = make_float2(v0, v1);
                        }
                    }
                    fence_proxy_async();
                    __syncwarp();
                    if (lane == 0) {
                        int box_col = (w.tn * BN) / CC + ch;
                        if (box_col * CC < p.sh.N) {
                            if (p.sh.splits > 1) tma::store_add_async(p.C, buf, box_row, box_col);
                            else              tma::store_async(p.C, buf, box_row, box_col);
                        }
                        tma::store_commit_group();
                    }
                }
            }
        }
        if (lane == 0) tma::store_wait<0>();
    }
}

template <major MA, major MB, typename OutT>
const char* launch(const gemm::args& g) {
    using L = layout<MA, MB, OutT>;
    using P = typename L::params;
    auto kernel = gemm_pingpong_kernel<MA, MB, OutT>;
    constexpr int smem_bytes = sizeof(typename L::smem) + 1024;
    static_assert(smem_bytes <= 232448, "step 5: shared memory over the 227 KB a block may use");
    static bool configured = false;
    if (!configured) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess)
            return "gemm step 5: could not reserve shared memory (needs a Hopper GPU)";
        configured = true;
    }
    try {
        auto* a = static_cast<bf16*>(const_cast<void*>(g.a));
        auto* b = static_cast<bf16*>(const_cast<void*>(g.b));
        P p{typename L::a_gl(a, 1, MA == major::K ? g.M : g.K, MA == major::K ? g.K : g.M),
            typename L::b_gl(b, 1, MB == major::K ? g.N : g.K, MB == major::K ? g.K : g.N),
            typename L::c_gl(static_cast<OutT*>(g.c), 1, g.M, g.N),
            {g.M, g.N, g.K, (g.M + BM - 1) / BM, (g.N + BN - 1) / BN, (g.K + BK - 1) / BK, g.splits, 0},
            {static_cast<const bf16*>(g.bias), g.gelu}};
        if (p.sh.splits < 1 || p.sh.splits > p.sh.k_tiles) return "gemm step 5: splits must be in 1..ceil(K/64)";
        p.sh.units = p.sh.tiles_m * p.sh.tiles_n * p.sh.splits;
        int grid = std::min(p.sh.units, std::max(g.num_sms, 1));
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

const char* gemm::step5_pingpong(const gemm::args& g) {
    if (g.a_mn_major && !g.b_mn_major) return "gemm step 5: A M-major with B K-major is not instantiated; pass B N-major";
    if (g.splits > 1 && !g.c_fp32) return "gemm step 5: split-K reduce-adds fp32 partials; ask for an fp32 output";
    if (g.c_fp32) {
        if (!g.a_mn_major && !g.b_mn_major) return launch<major::K, major::K, float>(g);
        if (!g.a_mn_major) return launch<major::K, major::MN, float>(g);
        return launch<major::MN, major::MN, float>(g);
    }
    if (!g.a_mn_major && !g.b_mn_major) return launch<major::K, major::K, bf16>(g);
    if (!g.a_mn_major) return launch<major::K, major::MN, bf16>(g);
    return launch<major::MN, major::MN, bf16>(g);
}

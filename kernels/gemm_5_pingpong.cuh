// kernels/gemm_5_pingpong.cuh — GEMM step 5's kernel template (ping-pong consumers), shared by
// the step-5 lesson (kernels/gemm_5_pingpong.cu: read its opening comment first, it says what
// the step changes) and the MLP (kernels/mlp.cu), which differ only in their epilogues.
//
// Same producer, work order, staging boxes and EPILOGUE POLICIES as step 4 (read
// kernels/gemm_4_warp_specialized.cuh first: the policy interface is documented there); what
// differs is who owns a tile. Each consumer warpgroup owns whole tiles of BM x BN (128x128 as
// two m64n128 accumulators, or 64x256 as one m64n256), the two consumers take the CTA's tiles in
// turn, and "turn" mbarriers make their main loops alternate, so one consumer's epilogue runs
// while the other's wgmmas keep the tensor cores busy.
//
// Read in order: configuration, shared memory, the kernel (producer = step 4's; consumer: which
// tiles are mine, the turn barriers, the main loop, the epilogue per 64-row slab), launcher.
#pragma once
#include <algorithm>
#include <string>
#include "gemm_4_warp_specialized.cuh"   // tile types, shape, tile_pos, work order, producer, policies

namespace gemm5 {
using namespace tk;
using wgmma::major;
using gemm4::shape;
using gemm4::tile_pos;
using gemm4::work;
using gemm4::unit_work;

// A configuration: one consumer's tile (SLABS x 64 rows by BN columns, 128 fp32 accumulators a
// thread either way), the ring depth, and the output staging boxes per consumer warp.
template <int SLABS_, int STAGES_, int NBUF_ = 2> struct config {
    static constexpr int SLABS = SLABS_;                 // 64-row slabs per consumer tile: 1 or 2
    static constexpr int BM = 64 * SLABS_, BN = 256 / SLABS_, BK = 64;
    static constexpr int STAGES = STAGES_, NBUF = NBUF_;
    static_assert(SLABS_ == 1 || SLABS_ == 2, "a consumer tile is 64x256 or 128x128");
};
using pingpong_128x128 = config<2, 6>;   // step 5 as first measured (6 x 32 KB stages)
using pingpong_64x256 = config<1, 4>;    // one m64n256 wgmma per k16 (4 x 40 KB stages)

constexpr int CONSUMERS = 2, THREADS = 128 * (1 + CONSUMERS);

template <typename Cfg, major MA, major MB, typename Epi>
struct layout {
    using a_tile = gemm4::operand_tile<MA, Cfg::BM, Cfg::BK>;
    using b_tile = gemm4::operand_tile<MB, Cfg::BN, Cfg::BK>;
    using c_tile = gemm4::out_tile<typename Epi::out_t>;
    using a_gl = gl<bf16, runtime, runtime, a_tile>;
    using b_gl = gl<bf16, runtime, runtime, b_tile>;
    struct smem {
        a_tile a[Cfg::STAGES];
        b_tile b[Cfg::STAGES];
        c_tile c[CONSUMERS][4][Cfg::NBUF];
        mbarrier full[Cfg::STAGES], empty[Cfg::STAGES];
        mbarrier turn[CONSUMERS];            // "the other consumer finished its main loop"
    };
    struct params {
        a_gl A; b_gl B;
        shape sh;
        Epi epi;
    };
};

template <typename Cfg, major MA, major MB, typename Epi>
__global__ void __launch_bounds__(THREADS, 1)
gemm_pingpong_kernel(const __grid_constant__ typename layout<Cfg, MA, MB, Epi>::params p) {
    using L = layout<Cfg, MA, MB, Epi>;
    constexpr int STAGES = Cfg::STAGES, SLABS = Cfg::SLABS, BM = Cfg::BM, BN = Cfg::BN;
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
        if (threadIdx.x == 0) gemm4::produce<STAGES, MA, MB>(s, p.A, p.B, p.sh);   // step 4's producer
        else if (threadIdx.x >= 32) p.epi.side_job(threadIdx.x - 32, 96, p.sh);   // the policy's extra work
    } else {
        warpgroup_increase_registers<232>();
        const int c = wg - 1;
        const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
        wgmma::accumulator<BN> acc[SLABS];           // slab h: rows 64h .. 64h+63 of my tile
        int it = 0;                                  // ring position, counted over ALL tiles
        int mine = 0;                                // tiles of this CTA seen so far
        int turns = 0;                               // tiles this consumer has multiplied
        for (int unit = blockIdx.x; unit < p.sh.units; unit += gridDim.x, ++mine) {
            work w = unit_work(p.sh, unit);
            if (mine % CONSUMERS != c) {             // the other consumer's tile: skip its stages
                it += w.k_end - w.k_begin;
                continue;
            }
            tile_pos pos[SLABS];
            typename Epi::tile_state ts[SLABS];
#pragma unroll
            for (int h = 0; h < SLABS; ++h) pos[h] = {w.tm * BM + 64 * h + 16 * warp, w.tn * BN, lane / 4, lane % 4, BN};
            // Slab 0's tile state starts before the main loop (e.g. dgelu's first pre loads land
            // during the math); a second slab's starts at its own epilogue: holding both through
            // the main loop next to 128 accumulators made ptxas spill, and in this schedule the
            // epilogue's latency hides behind the other consumer's math anyway.
            p.epi.begin_tile(ts[0], pos[0], p.sh);
            // Wait for the other consumer to finish the main loop of the tile before mine: the
            // math of the two alternates (my epilogue overlaps its math), and every stage phase
            // before mine has completed when I start waiting, so a parity wait cannot match a
            // phase one or two laps of the ring early.
            if (c == 0 && turns > 0) mbar::wait(s.turn[0], (turns - 1) & 1);
            if (c == 1) mbar::wait(s.turn[1], turns & 1);
            ++turns;
            for (int kt = w.k_begin; kt < w.k_end; ++kt, ++it) {
                int stage = it % STAGES;
                mbar::wait(s.full[stage], (it / STAGES) & 1);
                wgmma::fence();
#pragma unroll
                for (int k = 0; k < Cfg::BK / 16; ++k) {
                    uint64_t db = wgmma::desc<MB>(s.b[stage], 0, k);
#pragma unroll
                    for (int h = 0; h < SLABS; ++h)
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
#pragma unroll
            for (int h = 0; h < SLABS; ++h) wgmma::fence_operand(acc[h]);

            // ---- epilogue, as step 4's, once per 64-row slab: warp w stores rows 16w.. of each
            using c_tile = typename L::c_tile;
            constexpr int CC = c_tile::cols;
            constexpr int OUTPUTS = Epi::OUTPUTS;
            static_assert((BN / CC * OUTPUTS) % Cfg::NBUF == 0, "buffer ring must restart in step with the slab");
#pragma unroll
            for (int h = 0; h < SLABS; ++h) {
                if (h > 0) p.epi.begin_tile(ts[h], pos[h], p.sh);
                const int box_row = pos[h].slab_row / 16;
#pragma unroll
                for (int ch = 0; ch < BN / CC; ++ch) {
                    p.epi.box(ts[h], acc[h], ch, pos[h], p.sh);
#pragma unroll
                    for (int o = 0; o < OUTPUTS; ++o) {
                        c_tile& buf = s.c[c][warp][(ch * OUTPUTS + o) % Cfg::NBUF];
                        if (lane == 0) tma::store_wait_read<Cfg::NBUF - 1>();
                        __syncwarp();
#pragma unroll
                        for (int j = 0; j < CC / 8; ++j) {
#pragma unroll
                            for (int r = 0; r < 2; ++r) {
                                int i = 4 * (ch * CC / 8 + j) + 2 * r;
                                int row = pos[h].g + 8 * r, col = 8 * j + 2 * pos[h].t;
                                float2 v = p.epi.value(o, acc[h].d[i], acc[h].d[i + 1], pos[h].tile_col + ch * CC + col, p.sh);
                                if constexpr (sizeof(typename Epi::out_t) == 2)
                                    *reinterpret_cast<bf16_2*>(buf.ptr(row, col)) = __floats2bfloat162_rn(v.x, v.y);
                                else
                                    *reinterpret_cast<float2*>(buf.ptr(row, col)) = v;
                            }
                        }
                        fence_proxy_async();
                        __syncwarp();
                        if (lane == 0) {
                            p.epi.store(o, buf, box_row, pos[h].tile_col / CC + ch, p.sh);
                            tma::store_commit_group();
                        }
                    }
                }
            }
        }
        if (lane == 0) tma::store_wait<0>();
    }
}

// ---- launcher: the same contract as gemm4::launch (who, operands, sizes, split-K, make_epi)
template <typename Cfg, major MA, major MB, typename Epi, typename MakeEpi>
const char* launch(const char* who, const void* a_ptr, const void* b_ptr, int M, int N, int K, int splits,
                   int num_sms, cudaStream_t stream, MakeEpi&& make_epi) {
    using L = layout<Cfg, MA, MB, Epi>;
    using P = typename L::params;
    auto kernel = gemm_pingpong_kernel<Cfg, MA, MB, Epi>;
    constexpr int smem_bytes = sizeof(typename L::smem) + 1024;
    static_assert(smem_bytes <= 232448, "step 5: shared memory over the 227 KB a block may use");
    static thread_local std::string msg;
    static bool configured = false;
    if (!configured) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess) {
            msg = std::string(who) + ": could not reserve shared memory (needs a Hopper GPU)";
            return msg.c_str();
        }
        configured = true;
    }
    try {
        auto* a = static_cast<bf16*>(const_cast<void*>(a_ptr));
        auto* b = static_cast<bf16*>(const_cast<void*>(b_ptr));
        P p{typename L::a_gl(a, 1, MA == major::K ? M : K, MA == major::K ? K : M),
            typename L::b_gl(b, 1, MB == major::K ? N : K, MB == major::K ? K : N),
            {M, N, K, (M + Cfg::BM - 1) / Cfg::BM, (N + Cfg::BN - 1) / Cfg::BN, (K + Cfg::BK - 1) / Cfg::BK, splits, 0},
            make_epi()};
        if (p.sh.splits < 1 || p.sh.splits > p.sh.k_tiles) {
            msg = std::string(who) + ": splits must be in 1..ceil(K/" + std::to_string(Cfg::BK) + ")";
            return msg.c_str();
        }
        p.sh.units = p.sh.tiles_m * p.sh.tiles_n * p.sh.splits;
        int grid = std::min(p.sh.units, std::max(num_sms, 1));
        kernel<<<grid, THREADS, smem_bytes, stream>>>(p);
    } catch (const std::exception& e) {
        msg = e.what();
        return msg.c_str();
    }
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace gemm5

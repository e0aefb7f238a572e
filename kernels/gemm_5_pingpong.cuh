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
// A configuration may also pair CTAs in 2-CTA CLUSTERS: the two CTAs of a cluster work on
// vertically adjacent tiles (same columns, so the same B tile) in lock step, each loads its own A
// tile and HALF of the shared B tile and multicasts that half into both CTAs' shared memory, so
// L2 delivers 24 KB per 128x128 k-step instead of 32 KB. The price is coupling: a stage may only
// be refilled when the consumers of BOTH CTAs have freed it (each consumer warp arrives on its
// own and on the peer's "empty" barrier), and neither CTA may exit while the other can still
// reach its shared memory (a cluster barrier at the end). Measured on the H200: correct, but at
// about half the speed of the same tile without clusters (kernels/gemm_5_pingpong.cu's table
// says what session 4 found and changed); kept as a lesson in the mechanics and a starting
// point, never picked by default.
//
// The cluster helpers, the pair producer and the cluster launch are step 4's (step 4 has a
// cluster configuration too, session 4).
//
// Read in order: configuration, shared memory, the kernel (consumer: which tiles are mine, the
// turn barriers, the main loop, the epilogue per 64-row slab: step 4's gemm4::store_slab),
// launcher.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
template <int SLABS_, int STAGES_, int NBUF_ = 2, int CLUSTER_ = 1> struct config {
    static constexpr int SLABS = SLABS_;                 // 64-row slabs per consumer tile: 1 or 2
    static constexpr int BM = 64 * SLABS_, BN = 256 / SLABS_, BK = 64;
    static constexpr int STAGES = STAGES_, NBUF = NBUF_;
    static constexpr int CLUSTER = CLUSTER_;             // 1, or 2: B tiles multicast to CTA pairs
    static_assert(SLABS_ == 1 || SLABS_ == 2, "a consumer tile is 64x256 or 128x128");
    static_assert(CLUSTER_ == 1 || CLUSTER_ == 2, "clusters of 1 or 2 CTAs");
};
using pingpong_128x128 = config<2, 6>;   // step 5 as first measured (6 x 32 KB stages)
using pingpong_64x256 = config<1, 4>;    // one m64n256 wgmma per k16 (4 x 40 KB stages)
using pingpong_128x128_cluster2 = config<2, 6, 2, 2>;   // 128x128, B multicast across a CTA pair
using pingpong_64x256_cluster2 = config<1, 4, 2, 2>;    // 64x256, B (256 x 64) multicast across a CTA pair
// For policies with input boxes (gemm_4_warp_specialized.cuh: a staging buffer per box of the tile,
// 4 per warp): 64x256 keeps its 4 stages (224 KB in all); 128x128 drops to 5.
using pingpong_64x256_inputs = config<1, 4, 4>;
using pingpong_128x128_inputs = config<2, 5, 4>;
using pingpong_64x256_cluster2_inputs = config<1, 4, 4, 2>;
using pingpong_64x256_deep = config<1, 5, 1>;   // 5 stages, one staging box per warp (step 5 variant 5)

constexpr int CONSUMERS = 2, THREADS = 128 * (1 + CONSUMERS);

template <typename Cfg, major MA, major MB, typename Epi>
struct layout {
    using a_tile = gemm4::operand_tile<MA, Cfg::BM, Cfg::BK>;
    using b_tile = gemm4::operand_tile<MB, Cfg::BN, Cfg::BK>;
    using b_half = gemm4::operand_tile<MB, Cfg::BN / 2, Cfg::BK>;   // what one CTA of a pair loads
    using c_tile = gemm4::out_tile<typename Epi::out_t>;
    using a_gl = gl<bf16, runtime, runtime, a_tile>;
    using b_gl = gl<bf16, runtime, runtime, b_tile, b_half>;
    // Half h of a B tile is the tile's bytes [h·size, (h+1)·size): K-major halves are row
    // ranges, N-major halves column blocks, both contiguous and 1024-byte aligned.
    static_assert(sizeof(b_half) * 2 == sizeof(b_tile) && sizeof(b_half) % 1024 == 0, "B halves must tile B");
    struct smem {
        a_tile a[Cfg::STAGES];
        b_tile b[Cfg::STAGES];
        c_tile c[CONSUMERS][4][Cfg::NBUF];
        mbarrier full[Cfg::STAGES], empty[Cfg::STAGES];
        mbarrier turn[CONSUMERS];            // "the other consumer finished its main loop"
        mbarrier input_full[CONSUMERS][4];   // a warp's input boxes have landed (INPUT_BOXES policies)
    };
    struct params {
        a_gl A; b_gl B;
        shape sh;
        Epi epi;
    };
};

// The cluster helpers (rank, cluster barrier, remote arrive, multicast loads, pair_work and the
// pair producer) are step 4's, in kernels/gemm_4_warp_specialized.cuh: both schedules run in pairs.
using gemm4::cluster_rank;
using gemm4::cluster_id;
using gemm4::cluster_count;
using gemm4::cluster_sync;
using gemm4::arrive_on_cta;
using gemm4::pair_work;

// Optional, step 5 only: a policy that stores a consumer's WHOLE tile at once (all its slabs) and
// carries state from one tile of the consumer to the next (kernels/gemm_splitk_epilogue.cuh:
// split-K finished in the kernel, each tile announced one tile later):
// `static constexpr bool STORES_TILE = true;`, `template <int SLABS> struct consumer_state;` and
//   store_tile(bufs, acc[SLABS], pos[SLABS], shape, lane, state, w)   replaces the per-slab store_slab
//                                          calls (w: the unit's tile and k range)
//   end_tiles(bufs, acc[SLABS], state, shape, lane)                after the consumer's last tile
template <typename Epi> __host__ __device__ constexpr bool stores_tile() {
    if constexpr (requires { Epi::STORES_TILE; }) return Epi::STORES_TILE;
    else return false;
}
// Optional: a policy that brings its own WORK SCHEDULE (gemm4::scheduled, documented in
// kernels/gemm_4_warp_specialized.cuh; kernels/gemm_splitk_epilogue.cuh's scheduled_splitk_epilogue).
using gemm4::scheduled;
struct no_consumer_state {};
template <typename Epi, int SLABS, bool = stores_tile<Epi>()> struct consumer_state_of { using type = no_consumer_state; };
template <typename Epi, int SLABS> struct consumer_state_of<Epi, SLABS, true> {
    using type = typename Epi::template consumer_state<SLABS>;
};

template <typename Cfg, major MA, major MB, typename Epi>
__global__ void __launch_bounds__(THREADS, 1)
gemm_pingpong_kernel(const __grid_constant__ typename layout<Cfg, MA, MB, Epi>::params p) {
    using L = layout<Cfg, MA, MB, Epi>;
    constexpr int STAGES = Cfg::STAGES, SLABS = Cfg::SLABS, BM = Cfg::BM, BN = Cfg::BN;
    extern __shared__ char smem_raw[];
    shared_allocator alloc(smem_raw);
    auto& s = alloc.template allocate<typename L::smem>();

    constexpr int CLUSTER = Cfg::CLUSTER;
    const int rank = CLUSTER == 2 ? int(cluster_rank()) : 0;
    const int first_unit = CLUSTER == 2 ? cluster_id() : int(blockIdx.x);             // per CTA or per pair
    const int unit_step = CLUSTER == 2 ? cluster_count() : int(gridDim.x);
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar::init(s.full[i], 1);
            mbar::init(s.empty[i], 4 * CLUSTER);     // a stage is read by ONE consumer (4 warps) per CTA
        }
        for (int i = 0; i < CONSUMERS; ++i) mbar::init(s.turn[i], 4);
        for (int i = 0; i < CONSUMERS * 4; ++i) mbar::init(s.input_full[i / 4][i % 4], 1);
        mbar::fence_init();
    }
    if constexpr (CLUSTER == 2) cluster_sync();      // the peer's barriers exist before we multicast
    else __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        warpgroup_decrease_registers<40>();
        if (threadIdx.x == 0) {
            if constexpr (CLUSTER == 2) gemm4::produce_pair<STAGES, MA, MB, typename L::b_half>(s, p.A, p.B, p.sh, rank, first_unit, unit_step);
            else if constexpr (scheduled<Epi>())
                gemm4::produce_units<STAGES, MA, MB>(s, p.A, p.B, p.sh, [&](int u) { return p.epi.scheduled_work(u); });
            else gemm4::produce<STAGES, MA, MB>(s, p.A, p.B, p.sh);   // step 4's producer
        }
        else if (threadIdx.x >= 32) p.epi.side_job(threadIdx.x - 32, 96, p.sh);   // the policy's extra work
    } else {
        warpgroup_increase_registers<232>();
        const int c = wg - 1;
        const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
        // A stage is free once my wgmmas have read it; in a pair, the peer's producer writes its
        // half of B into my stage too, so its "empty" barrier hears from me as well.
        auto free_stage = [&](mbarrier& empty) {
            mbar::arrive(empty);
            if constexpr (CLUSTER == 2) arrive_on_cta(empty, rank ^ 1);
        };
        wgmma::accumulator<BN> acc[SLABS];           // slab h: rows 64h .. 64h+63 of my tile
        [[maybe_unused]] typename consumer_state_of<Epi, SLABS>::type carried{};   // STORES_TILE policies
        int it = 0;                                  // ring position, counted over ALL tiles
        int mine = 0;                                // tiles of this CTA seen so far
        int turns = 0;                               // tiles this consumer has multiplied
        for (int unit = first_unit; unit < p.sh.units; unit += unit_step, ++mine) {
            work w;
            if constexpr (scheduled<Epi>()) {
                w = p.epi.scheduled_work(unit);
                if (w.k_begin >= w.k_end) break;     // the end of this CTA's list
            } else {
                w = CLUSTER == 2 ? pair_work(p.sh, unit, rank) : unit_work(p.sh, unit);
            }
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
            // Input boxes (e.g. dgelu's pre) for the whole tile, by TMA: they land while this
            // consumer waits for its turn and multiplies.
            if constexpr (gemm4::has_input_boxes<Epi>()) gemm4::load_input_boxes(s.c[c][warp], s.input_full[c][warp], p.epi, pos, p.sh, lane);
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
                    if (lane == 0) free_stage(s.empty[(it - 1) % STAGES]);
                }
            }
            // All my waits on "full" are done (my last wgmmas may still run): the other's turn.
            if (lane == 0) mbar::arrive(s.turn[1 - c]);
            wgmma::wait_group<0>();
            if (lane == 0) free_stage(s.empty[(it - 1) % STAGES]);
#pragma unroll
            for (int h = 0; h < SLABS; ++h) wgmma::fence_operand(acc[h]);

            // ---- epilogue: the policy's whole-tile store (STORES_TILE), or step 4's
            // (gemm4::store_slab) once per 64-row slab: warp w stores rows 16w..
            if constexpr (stores_tile<Epi>()) {
                p.epi.store_tile(s.c[c][warp], acc, pos, p.sh, lane, carried, w);
            } else {
#pragma unroll
                for (int h = 0; h < SLABS; ++h) {
                    if (h > 0) p.epi.begin_tile(ts[h], pos[h], p.sh);
                    gemm4::store_slab(s.c[c][warp], p.epi, ts[h], acc[h], pos[h], p.sh, lane,
                                      h * (BN / gemm4::box_cols<typename Epi::out_t>),       // input boxes: this slab's buffers
                                      h == 0 ? &s.input_full[c][warp] : nullptr, uint32_t((turns - 1) & 1));
                }
            }
        }
        if constexpr (stores_tile<Epi>()) p.epi.end_tiles(s.c[c][warp], acc, carried, p.sh, lane);
        if (lane == 0) tma::store_wait<0>();
    }
    // A pair's CTAs may still arrive on each other's barriers: neither exits before both are done.
    if constexpr (CLUSTER == 2) cluster_sync();
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
        if constexpr (scheduled<Epi>()) {           // the policy's schedule says how many CTAs and units
            static_assert(Cfg::CLUSTER == 1, "scheduled policies run without clusters");
            p.sh.units = p.epi.units;
            kernel<<<p.epi.grid, THREADS, smem_bytes, stream>>>(p);
        } else if constexpr (Cfg::CLUSTER == 1) {
            p.sh.units = p.sh.tiles_m * p.sh.tiles_n * p.sh.splits;
            int grid = std::min(p.sh.units, std::max(num_sms, 1));
            kernel<<<grid, THREADS, smem_bytes, stream>>>(p);
        } else {
            // units count tile-row PAIRS; one pair per cluster at a time, as many clusters as fit
            p.sh.units = (p.sh.tiles_m + 1) / 2 * p.sh.tiles_n * p.sh.splits;
            static int max_clusters = 0;
            if (const char* e = gemm4::launch_pairs(who, "step 5", kernel, p, THREADS, smem_bytes, num_sms, stream, max_clusters, msg))
                return e;
        }
    } catch (const std::exception& e) {
        msg = e.what();
        return msg.c_str();
    }
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace gemm5

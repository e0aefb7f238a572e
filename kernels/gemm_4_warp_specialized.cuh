// kernels/gemm_4_warp_specialized.cuh — GEMM step 4's kernel template, shared by the step-4
// lesson (kernels/gemm_4_warp_specialized.cu: read its opening comment first, it says what the
// step changes) and the MLP (kernels/mlp.cu), which differ only in their epilogues.
//
// The kernel: one producer warpgroup issues TMA loads into a ring of shared stages, two consumer
// warpgroups run wgmma on 128x256 tiles of a persistent grid, and each consumer warp moves its
// 16 rows out box by box (16 rows x 128 bytes) through its own swizzled staging tiles and TMA.
// What happens to the values on the way out is an EPILOGUE POLICY, a template parameter: a
// struct holding its own kernel arguments (output views, bias, ...) with these members:
//
//   using out_t;                    element type of the stored boxes (bf16 or float)
//   static constexpr int OUTPUTS;   boxes stored per accumulator box (2: pre and h in the MLP)
//   struct tile_state;              registers it carries from a tile's start to its epilogue
//   begin_tile(st, pos, shape)      before the tile's main loop (e.g. start loading an extra input)
//   box(st, acc, ch, pos, shape)    accumulator box ch (this warp's 16 rows x box_cols columns):
//                                   in-place transforms of acc, side outputs (e.g. column sums)
//   value(o, v0, v1, col, shape)    -> the two values (columns col, col+1) staged for output o
//   store(o, buf, box_row, box_col, shape)   lane 0: send output o's staged box (TMA store/add)
//   side_job(thread, threads, shape)         run by the producer warpgroup's three idle warps
//                                   (96 threads, 40 registers each) beside the GEMM: independent
//                                   work such as zeroing a buffer a later kernel needs (most
//                                   policies: nothing)
// Optional, for a policy that reads a second [M][N] matrix at its output's coordinates (the MLP's
// dGELU reads pre): `static constexpr bool INPUT_BOXES = true;` and
//   input()                         -> the out_gl to read, boxes like the output's (out_t)
//   box(st, acc, ch, pos, shape, in)  as box() above, with `in` the staging box holding the input
//                                   box at accumulator box ch's place
// Then lane 0 of each consumer warp TMA-loads ALL of its tile's input boxes into the warp's
// staging buffers at the start of the tile (load_input_boxes), so they land during the main loop
// instead of as scattered per-thread loads in the epilogue; the epilogue reads box ch's input
// from the buffer its output is then written into (each thread reads and rewrites only its own
// positions, so in place is safe). The configuration needs NBUF >= the tile's boxes per warp.
// Optional, for a policy that moves the whole slab itself (the plain product, whose values pass
// unchanged: kernels/gemm_plain_epilogue.cuh): `static constexpr bool STORES_SLAB = true;` and
//   store_slab(bufs, acc, pos, shape, lane)   replaces store_slab_by_values below (no box/value calls)
// The same policies run in step 5's ping-pong kernel (kernels/gemm_5_pingpong.cuh), where a
// consumer's tile is 128x128 or 64x256: a policy must take the tile width from tile_pos::cols
// (or the accumulator's ::cols), never assume step 4's 256.
//
// A configuration may pair CTAs in 2-CTA CLUSTERS (config::CLUSTER = 2; kernels/gemm_5_pingpong.cuh's
// opening comment explains the pairing): the helpers for it (cluster barrier, remote arrive,
// multicast loads, the pair producer, the cluster launch) live here and serve steps 4 and 5.
//
// Read in order: configuration, tile shapes, shared memory, work decomposition, the producer,
// the cluster helpers and pair producer, input boxes, the epilogue of one slab, the kernel
// (consumer main loop, then that epilogue), the plain linear-layer policy, the cluster launch,
// launcher.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include "tk/types/types.cuh"
#include "tk/ops/group/group.cuh"
#include "gemm.cuh"                        // gemm::epilogue (bias, GELU) for linear_epilogue

namespace gemm4 {
using namespace tk;
using wgmma::major;

// A configuration: pipeline depth, K per stage, and when a consumer frees a stage.
//   DRAIN = false: after issuing stage s, wait for stage s-1's wgmmas (one group in flight) and free s-1.
//   DRAIN = true:  wait for stage s itself and free it at once (the other consumer keeps the
//                  tensor cores busy meanwhile); the producer gets each stage back one step sooner.
// NBUF: output staging boxes per consumer warp (more = fewer waits for TMA stores to read them).
// CLUSTER = 2: CTA pairs work on vertically adjacent tiles and share each B tile, each loading
// half of it and multicasting it to both (what cuBLAS's "2x1" kernels do; step 5's header says
// how the pair keeps in step).
template <int STAGES_, int BK_, bool DRAIN_, int NBUF_ = 2, int CLUSTER_ = 1> struct config {
    static constexpr int STAGES = STAGES_, BK = BK_, NBUF = NBUF_, CLUSTER = CLUSTER_;
    static constexpr bool DRAIN = DRAIN_;
    static_assert(CLUSTER_ == 1 || CLUSTER_ == 2, "clusters of 1 or 2 CTAs");
};

constexpr int BM = 128, BN = 256;            // CTA tile; each consumer owns 64 x 256
constexpr int CONSUMERS = 2;
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int GROUP_M = 16;                  // tile rows walked together (L2 reuse)

// Shared tiles as TMA writes them: K-major tiles are rows x K, MN-major tiles are K x cols.
template <major M, int MN, int BK> using operand_tile = std::conditional_t<M == major::K, st<bf16, MN, BK>, st<bf16, BK, MN>>;
// Each consumer warp stages 16 rows x 128 bytes of output at a time: one TMA box.
template <typename OutT> using out_tile = st<OutT, 16, 128 / sizeof(OutT)>;
template <typename OutT> using out_gl = gl<OutT, runtime, runtime, out_tile<OutT>>;
template <typename OutT> constexpr int box_cols = out_tile<OutT>::cols;   // 64 bf16 / 32 fp32

// The problem's sizes and work split, as the kernel and the epilogue policies see them.
struct shape {
    int M, N, K;
    int tiles_m, tiles_n, k_tiles, splits, units;
};

// Where this thread's accumulator values land in C: acc.d[i] is row slab_row + g + 8·((i>>1)&1),
// column tile_col + 8·(i>>2) + 2t + (i&1).
struct tile_pos {
    int slab_row;                // first row of this warp's 16-row slab
    int tile_col;                // first column of the tile
    int g, t;                    // lane / 4, lane % 4
    int cols;                    // the accumulator's width: 256 in step 4, 128 or 256 in step 5
};

template <typename Cfg, major MA, major MB, typename Epi>
struct layout {
    using a_tile = operand_tile<MA, BM, Cfg::BK>;
    using b_tile = operand_tile<MB, BN, Cfg::BK>;
    using b_half = operand_tile<MB, BN / 2, Cfg::BK>;   // what one CTA of a pair loads
    using c_tile = out_tile<typename Epi::out_t>;
    using a_gl = gl<bf16, runtime, runtime, a_tile>;
    using b_gl = std::conditional_t<Cfg::CLUSTER == 2, gl<bf16, runtime, runtime, b_tile, b_half>, gl<bf16, runtime, runtime, b_tile>>;
    // Half h of a B tile is the tile's bytes [h·size, (h+1)·size) (K-major: row ranges, N-major:
    // column blocks), 1024-byte aligned: what the pair producer multicasts.
    static_assert(sizeof(b_half) * 2 == sizeof(b_tile) && sizeof(b_half) % 1024 == 0, "B halves must tile B");
    struct smem {
        a_tile a[Cfg::STAGES];
        b_tile b[Cfg::STAGES];
        c_tile c[CONSUMERS][4][Cfg::NBUF];   // [consumer][warp][staging buffer]
        mbarrier full[Cfg::STAGES], empty[Cfg::STAGES];
        mbarrier input_full[CONSUMERS][4];   // a warp's input boxes have landed (INPUT_BOXES policies)
    };
    struct params {
        a_gl A; b_gl B;
        shape sh;
        Epi epi;
    };
};

// ---- work decomposition: unit -> (tile row, tile column, k range) ----
// Units are numbered split-major: all tiles of split 0, then all of split 1, ... so the CTAs
// running at one time read the same K range of A and B, which then stays in L2.
struct work { int tm, tn, k_begin, k_end; };
__device__ inline work unit_work(const shape& p, int unit) {
    int tiles = p.tiles_m * p.tiles_n;
    int tile = unit % tiles, split = unit / tiles;
    int per_group = GROUP_M * p.tiles_n;
    int first_m = (tile / per_group) * GROUP_M;
    int group_rows = min(p.tiles_m - first_m, GROUP_M);
    int in_group = tile % per_group;
    return {first_m + in_group % group_rows, in_group / group_rows,
            split * p.k_tiles / p.splits, (split + 1) * p.k_tiles / p.splits};
}

// The producer: one thread walks the same units as the consumers and loads each k-tile of A and
// B into the next ring stage once the consumers have freed it (step 5 reuses it for its tiles).
// work_of(unit) says what a unit is: unit_work here; the scheduled policies (step 4 variant 9,
// step 5 variant 10) read it from a table (kernels/gemm_splitk_epilogue.cuh).
template <int STAGES, major MA, major MB, typename Smem, typename AGl, typename BGl, typename WorkOf>
__device__ inline void produce_units(Smem& s, const AGl& A, const BGl& B, const shape& sh, WorkOf&& work_of) {
    using a_tile = std::remove_reference_t<decltype(s.a[0])>;
    using b_tile = std::remove_reference_t<decltype(s.b[0])>;
    int it = 0;
    for (int unit = blockIdx.x; unit < sh.units; unit += gridDim.x) {
        work w = work_of(unit);
        for (int kt = w.k_begin; kt < w.k_end; ++kt, ++it) {
            int stage = it % STAGES;
            mbar::wait(s.empty[stage], ((it / STAGES) & 1) ^ 1);   // fresh barrier: passes
            mbar::arrive_expect_bytes(s.full[stage], tma::bytes<a_tile> + tma::bytes<b_tile>);
            if constexpr (MA == major::K) tma::load_async(s.a[stage], A, w.tm, kt, s.full[stage]);
            else                          tma::load_async(s.a[stage], A, kt, w.tm, s.full[stage]);
            if constexpr (MB == major::K) tma::load_async(s.b[stage], B, w.tn, kt, s.full[stage]);
            else                          tma::load_async(s.b[stage], B, kt, w.tn, s.full[stage]);
        }
    }
}
template <int STAGES, major MA, major MB, typename Smem, typename AGl, typename BGl>
__device__ inline void produce(Smem& s, const AGl& A, const BGl& B, const shape& sh) {
    produce_units<STAGES, MA, MB>(s, A, B, sh, [&](int unit) { return unit_work(sh, unit); });
}

// ---- cluster helpers (sm_90): rank, whole-cluster barrier, arrive on the peer's mbarrier,
// TMA load multicast to the CTAs of a mask (same shared offsets and mbarrier in each) ----------
__device__ inline uint32_t cluster_rank() {
    uint32_t r = 0;
#ifdef TK_SM90
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
__device__ inline int cluster_id() {               // which cluster of the grid, and how many
    uint32_t r = 0;
#ifdef TK_SM90
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
#endif
    return int(r);
}
__device__ inline int cluster_count() {
    uint32_t r = 1;
#ifdef TK_SM90
    asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
#endif
    return int(r);
}
__device__ inline void cluster_sync() {        // every thread of both CTAs; warps may be diverged
#ifdef TK_SM90
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// The arrive has the default (release, CTA scope) semantics, as CUTLASS's ClusterBarrier::arrive:
// what it announces is that this thread's wgmmas have finished READING a stage (async proxy,
// complete at wait_group), not data this thread wrote. Session 3 wrote `.release.cluster`
// here: a cluster-scope release, ordering all of this thread's earlier memory operations before
// the arrive, once per k-step per consumer warp. With it every cluster kernel ran at 0.3-0.85x
// of its cluster-less twin (session 4's ncu: tensor pipe 36% vs 58%, step 5 64x256); it is the
// suspected cause (kernels/NOTES.md, session 4).
__device__ inline void arrive_on_cta(mbarrier& bar, uint32_t cta) {
#ifdef TK_SM90
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(&bar)), "r"(cta));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
#endif
}
template <tma_tile S, typename G>
__device__ inline void load_multicast(S& dst, const G& src, int row, int col, mbarrier& bar, uint16_t cta_mask) {
    using box = tma_box<S>;
#pragma unroll
    for (int b = 0; b < box::blocks; ++b) {
#ifdef TK_SM90
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                     " [%0], [%1, {%2, %3, %4}], [%5], %6;"
                     :: "r"(smem_addr(&dst) + b * box::block_bytes), "l"(src.template tma<S>()),
                        "r"(col * S::cols + b * box::cols), "r"(row * S::rows), "r"(0), "r"(smem_addr(&bar)), "h"(cta_mask)
                     : "memory");
#endif
    }
}

// Units of a CTA pair: the pair walks step 4's order over PAIRS of tile rows; rank r of the
// cluster takes tile row 2·(pair row) + r (past the last row when tiles_m is odd: its loads read
// zeros, its stores are clipped away).
__device__ inline work pair_work(const shape& sh, int unit, int rank) {
    shape pairs = sh;
    pairs.tiles_m = (sh.tiles_m + 1) / 2;
    work w = unit_work(pairs, unit);
    w.tm = 2 * w.tm + rank;
    return w;
}

// The cluster producer: as produce, over the pair's units; A alone, B's half `rank` multicast to
// both CTAs. The stage's "empty" barrier counts the consumers of BOTH CTAs, since this CTA's copy
// also writes into the peer's stage.
template <int STAGES, major MA, major MB, typename BHalf, typename Smem, typename AGl, typename BGl>
__device__ inline void produce_pair(Smem& s, const AGl& A, const BGl& B, const shape& sh, int rank, int cluster, int clusters) {
    using a_tile = std::remove_reference_t<decltype(s.a[0])>;
    using b_tile = std::remove_reference_t<decltype(s.b[0])>;
    int it = 0;
    for (int unit = cluster; unit < sh.units; unit += clusters) {
        work w = pair_work(sh, unit, rank);
        for (int kt = w.k_begin; kt < w.k_end; ++kt, ++it) {
            int stage = it % STAGES;
            mbar::wait(s.empty[stage], ((it / STAGES) & 1) ^ 1);
            mbar::arrive_expect_bytes(s.full[stage], tma::bytes<a_tile> + tma::bytes<b_tile>);
            if constexpr (MA == major::K) tma::load_async(s.a[stage], A, w.tm, kt, s.full[stage]);
            else                          tma::load_async(s.a[stage], A, kt, w.tm, s.full[stage]);
            BHalf& half = *reinterpret_cast<BHalf*>(reinterpret_cast<char*>(&s.b[stage]) + rank * sizeof(BHalf));
            if constexpr (MB == major::K) load_multicast(half, B, 2 * w.tn + rank, kt, s.full[stage], uint16_t(3));
            else                          load_multicast(half, B, kt, 2 * w.tn + rank, s.full[stage], uint16_t(3));
        }
    }
}

// ---- scheduled policies (session 8; kernels/gemm_splitk_epilogue.cuh, scheduled_splitk_epilogue):
// the policy brings its own WORK SCHEDULE, planned on the host (kernels/gemm.py stream_schedule):
// `static constexpr bool SCHEDULED = true;`, members `int grid, units;` (the launch: units are
// numbered as always, unit u runs on CTA u % grid as its (u / grid)-th) and
//   scheduled_work(unit) -> work   the unit's tile and k range; an EMPTY range (k_begin == k_end)
//                                  ends the CTA's list (every later unit of it is empty too)
// and it stores a unit's values itself, knowing the unit's k range (a piece of K is summed with
// the tile's other pieces, the whole K stored):
//   store_tile(bufs, acc[SLABS], pos[SLABS], shape, lane, state, w)   (step 4: SLABS = 1, a
//                                  consumer's 64-row half of the tile; step 5: its whole tile)
template <typename Epi> __host__ __device__ constexpr bool scheduled() {
    if constexpr (requires { Epi::SCHEDULED; }) return Epi::SCHEDULED;
    else return false;
}

// ---- input boxes (policies with INPUT_BOXES, see the top of this file) ----
template <typename Epi> __host__ __device__ constexpr bool has_input_boxes() {
    if constexpr (requires { Epi::INPUT_BOXES; }) return Epi::INPUT_BOXES;
    else return false;
}

// Lane 0 of a consumer warp: once the warp's earlier stores have read its staging buffers, load
// the input boxes of its SLABS slabs (box ch of slab h into buffer h·(cols/CC) + ch), all
// completing on `bar` (one phase per tile). Boxes wholly outside the matrix are not loaded
// (their outputs are not stored either); partly outside ones read zeros there.
template <int NBUF, typename Epi, typename CTile, int SLABS>
__device__ __forceinline__ void load_input_boxes(CTile (&bufs)[NBUF], mbarrier& bar, const Epi& epi,
                                                 const tile_pos (&pos)[SLABS], const shape& sh, int lane) {
    constexpr int CC = CTile::cols;
    if (lane != 0) return;
    const int boxes = pos[0].cols / CC;              // per slab
    tma::store_wait_read<0>();
    uint32_t bytes = 0;
    for (int h = 0; h < SLABS; ++h)
        for (int ch = 0; ch < boxes; ++ch)
            if (pos[h].slab_row < sh.M && pos[h].tile_col + ch * CC < sh.N) bytes += tma::bytes<CTile>;
    mbar::arrive_expect_bytes(bar, bytes);
    for (int h = 0; h < SLABS; ++h)
        for (int ch = 0; ch < boxes; ++ch)
            if (pos[h].slab_row < sh.M && pos[h].tile_col + ch * CC < sh.N)
                tma::load_async(bufs[h * boxes + ch], epi.input(), pos[h].slab_row / 16, pos[h].tile_col / CC + ch, bar);
}

// ---- the epilogue of one 64-row accumulator slab (steps 4 and 5): each consumer warp moves its
// 16 rows x Acc::cols out in boxes of 16 x 128 bytes. Per accumulator box: the policy's in-place
// work, then each of its outputs goes registers -> swizzled staging box -> TMA; the warp's NBUF
// staging buffers rotate so one store drains while the next box fills (no warpgroup barrier).
// With INPUT_BOXES, box ch's input (loaded by load_input_boxes) and output share buffer
// first_buf + ch; `input_bar` (nullptr: already waited for) is waited on before the first box.
template <int NBUF, typename Epi, typename CTile, typename Acc>
__device__ __forceinline__ void store_slab_by_values(CTile (&bufs)[NBUF], const Epi& epi, typename Epi::tile_state& ts,
                                                     Acc& acc, const tile_pos& pos, const shape& sh, int lane,
                                                     int first_buf, mbarrier* input_bar, uint32_t input_parity) {
    constexpr int CC = CTile::cols;                  // columns per box: 64 bf16 / 32 fp32
    constexpr int OUTPUTS = Epi::OUTPUTS;
    constexpr bool INPUT = has_input_boxes<Epi>();
    static_assert((Acc::cols / CC * OUTPUTS) % NBUF == 0 || INPUT, "buffer ring must restart in step with the slab");
    static_assert(!INPUT || (OUTPUTS == 1 && Acc::cols / CC <= NBUF), "input boxes: one output, a buffer per box");
    const int box_row = pos.slab_row / 16;
    if constexpr (INPUT) if (input_bar) mbar::wait(*input_bar, input_parity);
#pragma unroll
    for (int ch = 0; ch < Acc::cols / CC; ++ch) {
        if constexpr (INPUT) epi.box(ts, acc, ch, pos, sh, bufs[first_buf + ch]);
        else epi.box(ts, acc, ch, pos, sh);
#pragma unroll
        for (int o = 0; o < OUTPUTS; ++o) {
            CTile& buf = INPUT ? bufs[first_buf + ch] : bufs[(ch * OUTPUTS + o) % NBUF];
            if constexpr (!INPUT) {                  // (input boxes: buf was free when its load was issued)
                if (lane == 0) tma::store_wait_read<NBUF - 1>();   // the store NBUF boxes ago has read buf
                __syncwarp();
            }
#pragma unroll
            for (int j = 0; j < CC / 8; ++j) {       // 8-column blocks of this box
#pragma unroll
                for (int h = 0; h < 2; ++h) {        // rows g and g + 8
                    int i = 4 * (ch * CC / 8 + j) + 2 * h;
                    int row = pos.g + 8 * h, col = 8 * j + 2 * pos.t;
                    float2 v = epi.value(o, acc.d[i], acc.d[i + 1], pos.tile_col + ch * CC + col, sh);
                    // buf.ptr applies the tile's 128B swizzle: the warp's 32 stores hit 32 banks
                    if constexpr (sizeof(typename Epi::out_t) == 2)
                        *reinterpret_cast<bf16_2*>(buf.ptr(row, col)) = __floats2bfloat162_rn(v.x, v.y);
                    else
                        *reinterpret_cast<float2*>(buf.ptr(row, col)) = v;
                }
            }
            fence_proxy_async();                     // generic writes -> TMA reads
            __syncwarp();
            if (lane == 0) {
                epi.store(o, buf, box_row, pos.tile_col / CC + ch, sh);
                tma::store_commit_group();
            }
        }
    }
}

// What the kernels call per slab: the policy's own store_slab if it has one (STORES_SLAB), else
// the per-value path above.
template <typename Epi> __host__ __device__ constexpr bool stores_slab() {
    if constexpr (requires { Epi::STORES_SLAB; }) return Epi::STORES_SLAB;
    else return false;
}
template <int NBUF, typename Epi, typename CTile, typename Acc>
__device__ __forceinline__ void store_slab(CTile (&bufs)[NBUF], const Epi& epi, typename Epi::tile_state& ts,
                                           Acc& acc, const tile_pos& pos, const shape& sh, int lane,
                                           int first_buf = 0, mbarrier* input_bar = nullptr, uint32_t input_parity = 0) {
    if constexpr (stores_slab<Epi>()) epi.store_slab(bufs, acc, pos, sh, lane);
    else store_slab_by_values(bufs, epi, ts, acc, pos, sh, lane, first_buf, input_bar, input_parity);
}

// Optional, step 4 only (the cooperative kernel, whose tensor cores idle during an epilogue): a
// policy may DEFER its stores (`static constexpr bool DEFERS_STORE = true;`, kernels/
// gemm_plain_epilogue.cuh's deferred_plain_epilogue). At a tile's end it packs the accumulators
// into registers (`template <int COLS> struct held;` and hold(held, acc, pos)), the next tile's
// wgmmas start at once, and box ch of the held tile is stored (store_held_box<ch>(bufs, held,
// sh, lane)) right after k-step ch's wgmmas are issued, so its stores overlap the math.
template <typename Epi> __host__ __device__ constexpr bool defers_store() {
    if constexpr (requires { Epi::DEFERS_STORE; }) return Epi::DEFERS_STORE;
    else return false;
}
struct nothing_held {};
template <typename Epi, int COLS, bool = defers_store<Epi>()> struct held_of { using type = nothing_held; };
template <typename Epi, int COLS> struct held_of<Epi, COLS, true> { using type = typename Epi::template held<COLS>; };
template <typename Epi, int COLS> __host__ __device__ constexpr int held_boxes() { return COLS / box_cols<typename Epi::out_t>; }
// Box ch (a run-time number) of the held tile: one guarded copy per box keeps every register
// index a constant (an indexed register array would live in local memory).
template <int NBUF, typename Epi, typename CTile, typename Held>
__device__ __forceinline__ void store_held_box_at(CTile (&bufs)[NBUF], const Epi& epi, const Held& held, int ch,
                                                  const shape& sh, int lane) {
    constexpr int BOXES = Held::boxes;
    [&]<int... B>(std::integer_sequence<int, B...>) {
        ((ch == B ? epi.template store_held_box<B>(bufs, held, sh, lane) : void()), ...);
    }(std::make_integer_sequence<int, BOXES>{});
}

template <typename Cfg, major MA, major MB, typename Epi>
__global__ void __launch_bounds__(THREADS, 1)
gemm_ws_kernel(const __grid_constant__ typename layout<Cfg, MA, MB, Epi>::params p) {
    using L = layout<Cfg, MA, MB, Epi>;
    constexpr int STAGES = Cfg::STAGES;
    extern __shared__ char smem_raw[];
    shared_allocator alloc(smem_raw);
    auto& s = alloc.template allocate<typename L::smem>();
    constexpr int CLUSTER = Cfg::CLUSTER;
    const int rank = CLUSTER == 2 ? int(cluster_rank()) : 0;
    const int first_unit = CLUSTER == 2 ? cluster_id() : int(blockIdx.x);   // per CTA or per pair
    const int unit_step = CLUSTER == 2 ? cluster_count() : int(gridDim.x);

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar::init(s.full[i], 1);                // the producer's arrive_expect_bytes
            mbar::init(s.empty[i], CONSUMERS * 4 * CLUSTER);   // one arrive per consumer warp (of both CTAs of a pair)
        }
        for (int i = 0; i < CONSUMERS * 4; ++i) mbar::init(s.input_full[i / 4][i % 4], 1);
        mbar::fence_init();
    }
    if constexpr (CLUSTER == 2) cluster_sync();      // the peer's barriers exist before we multicast
    else __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        // ================= producer: one thread issues every TMA load =================
        warpgroup_decrease_registers<40>();
        if (threadIdx.x == 0) {
            if constexpr (CLUSTER == 2) produce_pair<STAGES, MA, MB, typename L::b_half>(s, p.A, p.B, p.sh, rank, first_unit, unit_step);
            else if constexpr (scheduled<Epi>())
                produce_units<STAGES, MA, MB>(s, p.A, p.B, p.sh, [&](int u) { return p.epi.scheduled_work(u); });
            else produce<STAGES, MA, MB>(s, p.A, p.B, p.sh);
        }
        else if (threadIdx.x >= 32) p.epi.side_job(threadIdx.x - 32, 96, p.sh);   // warps 1-3 are otherwise idle
    } else {
        // ================= consumers: wgmma on the ring, then the epilogue =================
        warpgroup_increase_registers<232>();
        const int c = wg - 1;                        // which 64-row half of the CTA tile
        const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
        // A stage is free once my wgmmas have read it; in a pair, the peer's producer writes its
        // half of B into my stage too, so its "empty" barrier hears from me as well.
        auto free_stage = [&](mbarrier& empty) {
            mbar::arrive(empty);
            if constexpr (CLUSTER == 2) arrive_on_cta(empty, rank ^ 1);
        };
        wgmma::accumulator<BN> acc;
        // DEFERS_STORE policies: the previous tile's values (packed) and where they go, stored box
        // by box during this tile's first k-steps (see defers_store above)
        [[maybe_unused]] typename held_of<Epi, BN>::type held{};
        [[maybe_unused]] bool holding = false;
        int it = 0, tiles_done = 0;
        for (int unit = first_unit; unit < p.sh.units; unit += unit_step, ++tiles_done) {
            work w;
            if constexpr (scheduled<Epi>()) {
                w = p.epi.scheduled_work(unit);
                if (w.k_begin >= w.k_end) break;     // the end of this CTA's list
            } else {
                w = CLUSTER == 2 ? pair_work(p.sh, unit, rank) : unit_work(p.sh, unit);
            }
            const tile_pos pos{w.tm * BM + 64 * c + 16 * warp, w.tn * BN, lane / 4, lane % 4, BN};
            typename Epi::tile_state ts;
            p.epi.begin_tile(ts, pos, p.sh);

            for (int kt = w.k_begin; kt < w.k_end; ++kt, ++it) {
                int stage = it % STAGES;
                mbar::wait(s.full[stage], (it / STAGES) & 1);
                wgmma::fence();
#pragma unroll
                for (int k = 0; k < Cfg::BK / 16; ++k)
                    wgmma::mma_ss<MA, MB>(acc, wgmma::desc<MA>(s.a[stage], 64 * c, k),
                                          wgmma::desc<MB>(s.b[stage], 0, k), kt > w.k_begin || k > 0);
                wgmma::commit_group();
                // input boxes: loaded once the tile's first wgmmas are issued, so waiting for the
                // last tile's stores to leave the buffers does not delay the math
                if constexpr (has_input_boxes<Epi>())
                    if (kt == w.k_begin) load_input_boxes(s.c[c][warp], s.input_full[c][warp], p.epi, {pos}, p.sh, lane);
                // deferred stores: box (kt - k_begin) of the held tile leaves while these wgmmas run
                if constexpr (defers_store<Epi>())
                    if (holding) store_held_box_at(s.c[c][warp], p.epi, held, kt - w.k_begin, p.sh, lane);
                if constexpr (Cfg::DRAIN) {
                    wgmma::wait_group<0>();
                    if (lane == 0) free_stage(s.empty[stage]);
                } else if (kt > w.k_begin) {         // the previous stage's wgmmas are done: free it
                    wgmma::wait_group<1>();
                    if (lane == 0) free_stage(s.empty[(it - 1) % STAGES]);
                }
            }
            if constexpr (!Cfg::DRAIN) {
                wgmma::wait_group<0>();
                if (lane == 0) free_stage(s.empty[(it - 1) % STAGES]);
            }
            wgmma::fence_operand(acc);

            // ---- epilogue: each warp moves its 16 x 256 slice out (store_slab above), or holds it
            if constexpr (defers_store<Epi>()) {
                // boxes of the held tile that this tile's k-steps were too few to carry, then hold this one
                if (holding)
                    for (int ch = w.k_end - w.k_begin; ch < held_boxes<Epi, BN>(); ++ch)
                        store_held_box_at(s.c[c][warp], p.epi, held, ch, p.sh, lane);
                p.epi.hold(held, acc, pos);
                holding = true;
            } else if constexpr (scheduled<Epi>()) {
                // the policy's whole-unit store, on this consumer's 64-row half as a 1-slab tile
                static_assert(Epi::ARRIVES_AT_ONCE, "step 4 carries nothing from one tile to the next");
                typename Epi::template consumer_state<1> none{};
                const tile_pos pos1[1] = {pos};
                p.epi.store_tile(s.c[c][warp], *reinterpret_cast<wgmma::accumulator<BN>(*)[1]>(&acc), pos1, p.sh, lane,
                                 none, w);
            } else {
                store_slab(s.c[c][warp], p.epi, ts, acc, pos, p.sh, lane, 0, &s.input_full[c][warp], uint32_t(tiles_done & 1));
            }
        }
        if constexpr (defers_store<Epi>())
            if (holding)
                for (int ch = 0; ch < held_boxes<Epi, BN>(); ++ch) store_held_box_at(s.c[c][warp], p.epi, held, ch, p.sh, lane);
        if (lane == 0) tma::store_wait<0>();
    }
    // A pair's CTAs may still arrive on each other's barriers: neither exits before both are done.
    if constexpr (CLUSTER == 2) cluster_sync();
}

// ---- the plain linear-layer policy (GEMM steps 4 and 5): every value passes through
// gemm::epilogue (bias, GELU) on its way to the staging box; the box is TMA-stored, or TMA
// reduce-added for split-K. Plain, bias, bias+GELU and split-K are chosen at run time, so each
// configuration is one kernel per operand layout.
template <typename OutT>
struct linear_epilogue {
    using out_t = OutT;
    static constexpr int OUTPUTS = 1;
    struct tile_state {};
    out_gl<OutT> C;
    gemm::epilogue f;

    __device__ void begin_tile(tile_state&, const tile_pos&, const shape&) const {}
    __device__ void side_job(int, int, const shape&) const {}
    template <typename Acc>
    __device__ void box(tile_state&, Acc&, int, const tile_pos&, const shape&) const {}
    __device__ float2 value(int, float v0, float v1, int col, const shape& sh) const {
        if (!f.identity() && col < sh.N) { v0 = f.apply(v0, col); v1 = f.apply(v1, col + 1); }
        return make_float2(v0, v1);
    }
    __device__ void store(int, out_tile<OutT>& buf, int box_row, int box_col, const shape& sh) const {
        if (box_col * box_cols<OutT> < sh.N) {
            if (sh.splits > 1) tma::store_add_async(C, buf, box_row, box_col);
            else               tma::store_async(C, buf, box_row, box_col);
        }
    }
};

// ---- launching 2-CTA clusters (steps 4 and 5): as many clusters as the occupancy query says fit
// (asked once per kernel: max_clusters), at most one per two SMs, no more than the pair units.
// Two environment knobs, read at every cluster launch (experiments, NOTES.md session 4):
//   TK_GEMM_CLUSTERS=n  launch n clusters (a positive integer; capped at the pair units) instead
//                       of the occupancy answer; unset or empty: that answer; anything else is
//                       refused with a message
//   TK_GEMM_VERBOSE=1   print to stderr what was launched (unset, empty or 0: silent)
// Returns nullptr or a message (kept in msg).
template <typename Kernel, typename P>
const char* launch_pairs(const char* who, const char* step_name, Kernel kernel, const P& p, int threads, int smem_bytes,
                         int num_sms, cudaStream_t stream, int& max_clusters, std::string& msg) {
    cudaLaunchConfig_t lc = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    lc.blockDim = dim3(threads); lc.dynamicSmemBytes = smem_bytes; lc.stream = stream;
    lc.attrs = attr; lc.numAttrs = 1;
    if (!max_clusters) {
        lc.gridDim = dim3(2 * std::max(num_sms / 2, 1));
        if (cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &lc) != cudaSuccess || max_clusters < 1)
            max_clusters = std::max(num_sms / 2, 1);
        cudaGetLastError();
    }
    int clusters = std::min({p.sh.units, std::max(num_sms / 2, 1), max_clusters});
    if (const char* force = std::getenv("TK_GEMM_CLUSTERS"); force && *force) {
        char* end = nullptr;
        const long n = std::strtol(force, &end, 10);
        if (end == force || *end != '\0' || n < 1 || n > (1L << 30)) {
            msg = std::string(who) + ": TK_GEMM_CLUSTERS must be a positive integer (clusters to launch), got '" +
                  force + "'; unset it to launch as many as fit";
            return msg.c_str();
        }
        clusters = int(std::min<long>(p.sh.units, n));
    }
    const char* verbose = std::getenv("TK_GEMM_VERBOSE");
    if (verbose && *verbose && std::string(verbose) != "0")
        std::fprintf(stderr, "%s: %s cluster launch: %d SMs, max active 2-CTA clusters %d, launching %d clusters "
                     "for %d pair units, %d bytes of shared memory\n", who, step_name, num_sms, max_clusters, clusters,
                     p.sh.units, smem_bytes);
    lc.gridDim = dim3(2 * clusters);
    cudaError_t e = cudaLaunchKernelEx(&lc, kernel, p);
    if (e != cudaSuccess) {
        msg = std::string(who) + ": cluster launch failed: " + cudaGetErrorString(e);
        return msg.c_str();
    }
    return nullptr;
}

// ---- launcher: `who` prefixes error messages; make_epi() builds the policy (its gl
// constructors may throw, so it runs inside the try). Returns nullptr or a message.
template <typename Cfg, major MA, major MB, typename Epi, typename MakeEpi>
const char* launch(const char* who, const void* a_ptr, const void* b_ptr, int M, int N, int K, int splits,
                   int num_sms, cudaStream_t stream, MakeEpi&& make_epi) {
    using L = layout<Cfg, MA, MB, Epi>;
    using P = typename L::params;
    auto kernel = gemm_ws_kernel<Cfg, MA, MB, Epi>;
    constexpr int smem_bytes = sizeof(typename L::smem) + 1024;   // + alignment slack
    static_assert(smem_bytes <= 232448, "step 4: shared memory over the 227 KB a block may use");
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
            {M, N, K, (M + BM - 1) / BM, (N + BN - 1) / BN, (K + Cfg::BK - 1) / Cfg::BK, splits, 0},
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
        } else {                                     // units count tile-row PAIRS (pair_work)
            p.sh.units = (p.sh.tiles_m + 1) / 2 * p.sh.tiles_n * p.sh.splits;
            static int max_clusters = 0;
            if (const char* e = launch_pairs(who, "step 4", kernel, p, THREADS, smem_bytes, num_sms, stream, max_clusters, msg))
                return e;
        }
    } catch (const std::exception& e) {
        msg = e.what();
        return msg.c_str();
    }
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// The instantiation a call asks for: the operand layouts of a linear layer's three products (y:
// A and B K-major; dx: B N-major; dW: both MN-major) times the output type. Calls
// launch.template operator()<MA, MB, OutT>() for g's choice; every step's dispatchers use it, e.g.
//   by_layout(g, [&]<major MA, major MB, typename OutT>() { return launch<Cfg, MA, MB, OutT>(g); })
// (A M-major with B K-major is not instantiated: the steps refuse it before dispatching.)
template <typename Launch>
const char* by_layout(const gemm::args& g, Launch&& launch) {
    if (g.c_fp32) {
        if (!g.a_mn_major && !g.b_mn_major) return launch.template operator()<major::K, major::K, float>();
        if (!g.a_mn_major) return launch.template operator()<major::K, major::MN, float>();
        return launch.template operator()<major::MN, major::MN, float>();
    }
    if (!g.a_mn_major && !g.b_mn_major) return launch.template operator()<major::K, major::K, bf16>();
    if (!g.a_mn_major) return launch.template operator()<major::K, major::MN, bf16>();
    return launch.template operator()<major::MN, major::MN, bf16>();
}

}  // namespace gemm4

// kernels/gemm_splitk_epilogue.cuh — split-K finished inside the kernel: the weight gradient's
// partial sums meet in a workspace that the kernel itself leaves zeroed, and the LAST split to
// finish a tile stores the tile's final values (bf16 or fp32) by TMA. Step 5 variants 8 and 10
// (kernels/gemm_5_pingpong.cu) and step 4 variant 9 (kernels/gemm_4_warp_specialized.cu). Read after kernels/gemm_plain_epilogue.cuh (whose store_slab
// stores the final values) and the STORES_TILE hook in kernels/gemm_5_pingpong.cuh.
//
// Why (session 7): the weight gradient dW = dyᵀ·x has few output tiles (768 x 3072: 144 of
// 128x128) and a long K (the tokens), so its K range is cut into `splits` pieces run by
// different CTAs. Until now each piece TMA-reduce-added its fp32 partial into an output that a
// memset had zeroed first, and a separate kernel converted the fp32 sum to bf16: two extra
// kernels and ~8-10 µs per call around a ~130 µs product, which left two GPT-2 dW shapes at
// 0.91-0.93x cuBLAS although the GEMM kernel alone ran at 0.99-1.02x (kernels/NOTES.md, session 6).
//
// How, per consumer warp and tile (each warp owns 16 rows of each 64-row slab of its tile; its
// share of the workspace is its "piece"):
//   1. send: the warp's accumulators go to shared memory in ACCUMULATOR order (thread t's 4
//      values j at [j][t]: 512 contiguous bytes per warp instruction, no swizzle, no bank
//      conflicts), 2 KB at a time through the warp's staging buffers, and each 2 KB leaves by
//      one bulk reduce-add (cp.reduce.async.bulk .add.f32) into the same place of the piece.
//      Nothing waits for them here.
//   2. arrive, ONE TILE LATER: at the start of the warp's next epilogue, before that tile's
//      reduce-adds leave, lane 0 waits for all its bulk groups (the previous tile's: long
//      complete, so the wait is free), fences the async proxy and announces the previous tile
//      with a release atomic add on the piece's arrival counter, which returns how many splits
//      arrived before it (read only after the new tile is sent: the round trip overlaps it)
//   3. the split that sees splits - 1 earlier arrivals is the last: after an acquire fence it
//      reads the complete sum back (L2-only loads, coalesced: the same accumulator order) into
//      the accumulator registers (free again: the new tile's values were sent in step 1),
//      writes zeros over the piece, resets the counter (so the NEXT call finds both zero:
//      nothing to clear per call), and stores the values like the plain product (stmatrix
//      staging, TMA store, no reduce)
//   A warp's last tile arrives after its last main loop (end_tiles).
// No CTA ever waits for another (a split arrives only after its own adds are complete, and
// whoever arrives last finishes), so there is no order to keep and nothing to deadlock on in a
// persistent grid. The summation order of the splits varies from run to run (as with the TMA
// reduce-add before): results agree with an fp32 reference to rounding, not bit for bit.
//
// Why so (kernels/NOTES.md, session 7): the first version added with red.global.add.v4.f32 from
// registers and arrived at once (a gpu-scope fence right after its adds); the second sent bulk
// reduce-adds and arrived one tile later, but AFTER sending the new tile (its release fence came
// right after 16 KB of fresh reduce-adds). Both were correct and 5-17% slower than the old
// split-K kernel. Suspected: a gpu-scope fence that waits for this warp's fresh reductions, which
// queue in L2 behind every SM's. Here nothing the warp issued recently is waited for, except at
// its last tile. This third version is still 1-5% behind the old split-K with its memset and
// conversion (call 4), and so was a variant 9 with ONE arrival per consumer and tile (the 4 warps
// at a named barrier, one release, bar.red.or to tell them the last): the same figures as 8, so
// the number of release fences is not the cost. 9 was removed after the session (code at 777f4c7).
//
// Variant 10 of step 5 and 9 of step 4 (session 8; the end of this file): the same protocol, but
// each CTA's units come from a schedule planned on the host (whole tiles, plus a few pieces of
// unequal length), not from equal splits, and a piece arrives in its own epilogue (AT_ONCE). 5v10
// is what matmul(step=0) runs for most of GPT-2's weight gradients (kernels/gemm.py auto_step);
// 4v9 lost to it: opt-in. (Session 8's 5v11, 10 arriving one tile later, lost too: removed.)
//
// The workspace: sums = tiles x BM x BN floats, arrivals = one int per 16 KB piece (tiles x 4 for
// 128x128; step 4 variant 9's 128x256 tiles: x 8, each consumer half a 64-row "tile"), zero at allocation
// (kernels/gemm.py keeps one pair per device and shape and documents its lifetime: one product of
// a shape at a time per device, i.e. not two of the same shape concurrently on two streams).
#pragma once
#include "gemm.cuh"                  // gemm::args (the host side at the end)
#include "gemm_plain_epilogue.cuh"

namespace gemm4 {

// Bulk (non-tensor) reduce-add of `bytes` contiguous bytes of shared memory into global memory,
// fp32 elementwise, completing in the issuing thread's bulk async-groups (as TMA stores do).
__device__ __forceinline__ void bulk_reduce_add_f32(float4* dst, const void* src, uint32_t bytes) {
#ifdef TK_SM90
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
#endif
}
// Orders this thread's async-proxy accesses to global memory (completed bulk copies) with its
// later generic ones, and the reverse.
__device__ __forceinline__ void fence_proxy_async_global() {
#ifdef TK_SM90
    asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}
// A gpu-scope acquire-release fence (__threadfence() is the heavier sequentially consistent one).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// atomicAdd with release semantics at gpu scope: it publishes what this thread made visible
// before it. (No acquire: only the last arriver needs one, and takes it with a fence.)
__device__ __forceinline__ int atomic_add_release_gpu(int* p, int v) {
    int old;
    asm volatile("atom.release.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Each consumer warp arrives for its own piece (4 counters a tile). AT_ONCE = false (variant 8):
// a piece arrives one tile later, as described above; AT_ONCE = true (5v10, 4v9): it
// arrives in its own epilogue, right after its reduce-adds are complete. With one or two pieces
// per CTA (variant 10's schedule) waiting for the next tile of the consumer can mean waiting
// until the end of the kernel, and the wait for fresh reduce-adds hides behind the other
// consumer's main loop.
template <typename OutT, bool AT_ONCE = false>
struct splitk_epilogue : plain_epilogue<OutT> {
    using base = plain_epilogue<OutT>;
    static constexpr bool STORES_TILE = true;   // gemm5's kernel hands a consumer's whole tile to store_tile
    static constexpr bool ARRIVES_AT_ONCE = AT_ONCE;   // nothing carried to a next tile (step 4 needs that)
    float4* sums;        // [piece][float4 j][lane]: the running fp32 sums, zero between calls
    int* arrivals;       // [piece]: k-tiles whose partial is in sums, zero between calls

    // What a consumer warp carries from one tile to the next: the tile that still has to arrive.
    template <int SLABS> struct consumer_state {
        int piece = -1;          // -1: none
        int k_len = 0;           // its k-tiles (what it adds to the arrival counter)
        tile_pos pos[SLABS];
    };

    // Consumer warp `warp` of a tile of SLABS x 64 rows by Acc::cols: all its slabs at once.
    // w: this unit's k range; the unit that covers all of K is the whole tile.
    template <int NBUF, typename CTile, typename Acc, int SLABS>
    __device__ __forceinline__ void store_tile(CTile (&bufs)[NBUF], Acc (&acc)[SLABS], const tile_pos (&pos)[SLABS],
                                               const shape& sh, int lane, consumer_state<SLABS>& cs, const work& w) const {
        const int k_len = w.k_end - w.k_begin;
        if (k_len == sh.k_tiles) {        // the whole K range: the plain product's stores
            shape whole = sh;
            whole.splits = 1;
#pragma unroll
            for (int h = 0; h < SLABS; ++h) base::store_slab(bufs, acc[h], pos[h], whole, lane);
            return;
        }
        constexpr int BM = 64 * SLABS;
        const int warp = (pos[0].slab_row % 64) / 16;
        const int piece = ((pos[0].slab_row / BM) * sh.tiles_n + pos[0].tile_col / Acc::cols) * 4 + warp;
        if constexpr (AT_ONCE) {          // 1, 2, 3 for this piece, nothing carried
            consumer_state<SLABS> now;
            now.piece = piece;
            now.k_len = k_len;
#pragma unroll
            for (int h = 0; h < SLABS; ++h) now.pos[h] = pos[h];
            send(bufs, acc, piece, lane);
            if (is_last(announce(piece, k_len, lane), k_len, sh)) finish(bufs, acc, now, sh, lane);
            return;
        }
        // 2. for the previous tile BEFORE this tile's reduce-adds leave: its own are long complete,
        // so neither the wait nor the release fence has anything fresh to wait for
        const int before = cs.piece >= 0 ? announce(cs.piece, cs.k_len, lane) : 0;
        send(bufs, acc, piece, lane);                                       // 1. for this tile
        if (cs.piece >= 0 && is_last(before, cs.k_len, sh)) finish(bufs, acc, cs, sh, lane);   // 3. (acc is free now)
        cs.piece = piece;
        cs.k_len = k_len;
#pragma unroll
        for (int h = 0; h < SLABS; ++h) cs.pos[h] = pos[h];
    }

    // After the warp's last tile: its pending tile arrives (acc: free registers to finish it in).
    template <int NBUF, typename CTile, typename Acc, int SLABS>
    __device__ __forceinline__ void end_tiles(CTile (&bufs)[NBUF], Acc (&acc)[SLABS], consumer_state<SLABS>& cs,
                                              const shape& sh, int lane) const {
        if (cs.piece >= 0 && is_last(announce(cs.piece, cs.k_len, lane), cs.k_len, sh)) finish(bufs, acc, cs, sh, lane);
        cs.piece = -1;
    }

    // ---- the pieces ----
    template <typename Acc, int SLABS> __host__ __device__ static constexpr int chunks() {   // 2 KB reduce-adds per piece
        return SLABS * Acc::cols / 32;                                  // (Acc::cols / 8 float4s a thread per slab) / 4
    }
    __device__ __forceinline__ float4* piece_sums(int piece, int floats4_per_piece, int lane) const {
        return sums + size_t(piece) * floats4_per_piece + lane;        // + 32 j: float4 j of this lane
    }

    // 1. The warp's accumulators into its piece: chunk k = float4s 4k..4k+3 of every lane.
    template <int NBUF, typename CTile, typename Acc, int SLABS>
    __device__ __forceinline__ void send(CTile (&bufs)[NBUF], const Acc (&acc)[SLABS], int piece, int lane) const {
        static_assert(sizeof(CTile) == 2048, "a staging buffer holds one 2 KB chunk");
        constexpr int V = Acc::cols / 8;                                // float4s a thread per slab
        constexpr int CHUNKS = chunks<Acc, SLABS>();
        float4* dst = piece_sums(piece, SLABS * V * 32, 0);
#pragma unroll
        for (int k = 0; k < CHUNKS; ++k) {
            CTile& buf = bufs[k % NBUF];
            base::template wait_for_buffer<NBUF>(lane);
            float4* staged = reinterpret_cast<float4*>(&buf);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = 4 * k + jj, h = j / V, jv = j % V;
                staged[32 * jj + lane] = make_float4(acc[h].d[4 * jv], acc[h].d[4 * jv + 1], acc[h].d[4 * jv + 2],
                                                     acc[h].d[4 * jv + 3]);
            }
            fence_proxy_async();                                        // generic writes -> bulk copy reads
            __syncwarp();
            if (lane == 0) {
                bulk_reduce_add_f32(dst + 128 * k, staged, 2048);
                tma::store_commit_group();
            }
        }
    }

    // 2. Lane 0, once ALL its bulk groups are complete (the piece's reduce-adds are performed in
    // L2): proxy fence (async-proxy writes before generic ops), then the release add of the
    // piece's k-tiles. Returns, in lane 0 only, how many k-tiles had arrived before (read by
    // is_last after the send, so the atomic's round trip overlaps it). Counting k-tiles rather
    // than splits lets the pieces of a tile differ in length (scheduled_splitk_epilogue below):
    // whoever brings the count to k_tiles is the last.
    __device__ __forceinline__ int announce(int piece, int k_len, int lane) const {
        int before = 0;
        if (lane == 0) {
            tma::store_wait<0>();
            fence_proxy_async_global();
            before = atomic_add_release_gpu(&arrivals[piece], k_len);
        }
        return before;
    }
    __device__ __forceinline__ static bool is_last(int before, int k_len, const shape& sh) {
        return __shfl_sync(0xffffffffu, before, 0) + k_len == sh.k_tiles;
    }

    // 3. The last split of the tile in cs: acquire what every other split released with its
    // arrival (lane 0 read the counter; its fence, then the warp barrier, order every lane's
    // loads after it), read the sums, clear them, store the tile.
    template <int NBUF, typename CTile, typename Acc, int SLABS>
    __device__ __forceinline__ void finish(CTile (&bufs)[NBUF], Acc (&acc)[SLABS], const consumer_state<SLABS>& cs,
                                           const shape& sh, int lane) const {
        constexpr int V = Acc::cols / 8;
        fence_acq_rel_gpu();
        fence_proxy_async_global();
        __syncwarp();
        const float4* mine = piece_sums(cs.piece, SLABS * V * 32, lane);
#pragma unroll
        for (int h = 0; h < SLABS; ++h)
#pragma unroll
            for (int j = 0; j < V; ++j) {             // .cg: from L2, never a stale L1 line
                const float4 v = __ldcg(mine + 32 * (h * V + j));
                acc[h].d[4 * j] = v.x; acc[h].d[4 * j + 1] = v.y; acc[h].d[4 * j + 2] = v.z; acc[h].d[4 * j + 3] = v.w;
            }
        float4* clear = piece_sums(cs.piece, SLABS * V * 32, lane);
#pragma unroll
        for (int j = 0; j < SLABS * V; ++j) __stcg(clear + 32 * j, make_float4(0.f, 0.f, 0.f, 0.f));
        if (lane == 0) arrivals[cs.piece] = 0;
        shape whole = sh;
        whole.splits = 1;                 // the final values: plain_epilogue stores, it does not reduce-add
#pragma unroll
        for (int h = 0; h < SLABS; ++h) base::store_slab(bufs, acc[h], cs.pos[h], whole, lane);
    }
};

// Step 5 variant 10 and step 4 variant 9 (both AT_ONCE; session 8): the same protocol
// under a WORK SCHEDULE planned on the host
// (kernels/gemm.py stream_schedule), instead of cutting every tile into `splits` equal pieces.
// Why: a weight gradient has few tiles and a long K (dW 3072x16384x768: 144 tiles of 128x128,
// 256 k-tiles each, on 132 SMs). Equal splits (5v7/5v8: 9 per tile, 1296 units, ~10 per CTA)
// send ~10 fp32 partial tiles per CTA through L2 and need them summed and converted. The
// schedule gives each CTA the same number of k-tiles with as few pieces as possible:
//   - more tiles than CTAs: every CTA runs whole tiles (stored directly, bf16) and a ~1/11 share
//     of the few tiles left over (pieces of 23 k-tiles at dW 3072x768), the pieces FIRST so that
//     their summing overlaps the whole tile's main loop on the other consumer;
//   - fewer tiles than CTAs (2304x768: 108 tiles): each tile's HEAD (k-tiles 0..h-1, h = the
//     fair share) runs on a CTA of its own, and the other CTAs share the tiles' tails.
// At any moment the whole tiles and heads are all at about the same k (they start together at
// k = 0), so the A and B columns they read come from HBM once and are shared through L2 (a plain
// stream-K, whose CTAs start at scattered k, would read each operand once per tile from HBM).
// Pieces of one tile may differ in length: the arrival counter counts k-tiles (announce above).
// Nothing waits for anything, so the schedule may order units any way.
template <typename OutT, bool AT_ONCE>
struct scheduled_splitk_epilogue : splitk_epilogue<OutT, AT_ONCE> {
    static constexpr bool SCHEDULED = true;     // gemm4's and gemm5's kernels read their units from the table
    const int4* schedule;   // [unit]: {tile row, tile column, k_begin, k_end} in k-tiles; unit u runs on CTA u % grid
    int grid, units;        // CTAs launched, entries in schedule (a multiple of grid)

    __device__ __forceinline__ work scheduled_work(int unit) const {
        const int4 e = __ldg(schedule + unit);
        return {e.x, e.y, e.z, e.w};
    }
};

// ---- host side of a scheduled launch (step 4 variant 9, step 5 variant 10) ----------------------
// What the launcher checks before its kernel reads the workspace and the table: nullptr, or the
// caller's message for the first thing missing (each step words its own: tile sizes, counters).
inline const char* scheduled_args_error(const gemm::args& g, long long tiles, long long tile_elems,
                                        long long counters_per_tile, const char* no_workspace,
                                        const char* no_schedule, const char* not_one_split) {
    if (!g.splitk_sums || !g.splitk_arrivals || g.splitk_sums_count < tiles * tile_elems ||
        g.splitk_arrivals_count < tiles * counters_per_tile)
        return no_workspace;
    if (!g.schedule || g.schedule_grid < 1 || g.schedule_units < g.schedule_grid || g.schedule_units % g.schedule_grid)
        return no_schedule;
    return g.splits != 1 ? not_one_split : nullptr;
}
// The epilogue a scheduled launch hands its kernel: c, the workspace, the table.
template <typename OutT>
scheduled_splitk_epilogue<OutT, true> scheduled_epilogue_of(const gemm::args& g) {
    return {{{out_gl<OutT>(static_cast<OutT*>(g.c), 1, g.M, g.N)}, reinterpret_cast<float4*>(g.splitk_sums),
             g.splitk_arrivals},
            reinterpret_cast<const int4*>(g.schedule), g.schedule_grid, g.schedule_units};
}

}  // namespace gemm4

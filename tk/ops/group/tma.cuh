// tk/ops/group/tma.cuh — the Tensor Memory Accelerator: whole shared tiles to and from a gl,
// issued by ONE thread, completing on an mbarrier (loads) or a bulk async-group (stores).
// Read in order: raw box copies, tile loads, tile stores / reduce-add stores, store waits.
// Facts: shared/docs/hopper-facts.md §7 (OOB boxes read zero; stores clip; store coordinates
// must be non-negative; expect the FULL box bytes even for a partly out-of-range box).
#pragma once
#include <cstdint>
#include "sync.cuh"
#include "../../types/global.cuh"

namespace tk::tma {

// ---- one box (rank-3 map; coordinates in elements, innermost first) ------------------------
__device__ inline void load_box(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, mbarrier& bar) {
#ifdef TK_SM90
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(&bar)) : "memory");
#endif
}
__device__ inline void store_box(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
#ifdef TK_SM90
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
                 :: "l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
#endif
}
__device__ inline void store_add_box(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
#ifdef TK_SM90
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
                 :: "l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
#endif
}

// Hint: fetch the descriptor early (optional).
__device__ inline void prefetch(const CUtensorMap* map) {
#ifdef TK_SM90
    asm volatile("prefetch.tensormap [%0];" :: "l"(map) : "memory");
#endif
}

// Bytes a load of one S tile delivers, i.e. what the mbarrier must expect (full boxes always).
template <tma_tile S> inline constexpr uint32_t bytes = tma_box<S>::bytes;

// ---- whole tiles; (row, col) are tile indices: element (row*S::rows, col*S::cols) ----------
// Load: the caller has announced the bytes on `bar` (mbar::arrive_expect_bytes) — once per
// phase, the sum over all tiles sharing the barrier.
template <tma_tile S, typename G>
__device__ inline void load_async(S& dst, const G& src, int row, int col, mbarrier& bar, int batch = 0) {
    using box = tma_box<S>;
#pragma unroll
    for (int b = 0; b < box::blocks; ++b)
        load_box(smem_addr(&dst) + b * box::block_bytes, src.template tma<S>(),
                 col * S::cols + b * box::cols, row * S::rows, batch, bar);
}
// Store: a generic-proxy write of `src` must be followed by fence_proxy_async() in every
// writing thread and a barrier before the issuing thread calls this.
template <tma_tile S, typename G>
__device__ inline void store_async(const G& dst, const S& src, int row, int col, int batch = 0) {
    using box = tma_box<S>;
#pragma unroll
    for (int b = 0; b < box::blocks; ++b)
        store_box(dst.template tma<S>(), smem_addr(&src) + b * box::block_bytes,
                  col * S::cols + b * box::cols, row * S::rows, batch);
}
// dst += src, elementwise, performed by the memory system (relaxed, per element): split-K.
template <tma_tile S, typename G>
__device__ inline void store_add_async(const G& dst, const S& src, int row, int col, int batch = 0) {
    using box = tma_box<S>;
#pragma unroll
    for (int b = 0; b < box::blocks; ++b)
        store_add_box(dst.template tma<S>(), smem_addr(&src) + b * box::block_bytes,
                      col * S::cols + b * box::cols, row * S::rows, batch);
}

// Stores complete per issuing thread in bulk async-groups.
__device__ inline void store_commit_group() {
#ifdef TK_SM90
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
// Wait until at most N groups still READ shared memory (then the source may be overwritten).
template <int N = 0>
__device__ inline void store_wait_read() {
#ifdef TK_SM90
    asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
#endif
}
// Wait until at most N groups are still writing global memory (call before the CTA exits).
template <int N = 0>
__device__ inline void store_wait() {
#ifdef TK_SM90
    asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
#endif
}

}  // namespace tk::tma

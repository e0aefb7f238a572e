// tk/ops/warp/memory_async.cuh: asynchronous copies from global memory into shared tiles with
// cp.async (sm_80+), the building block of a multi-stage pipeline. Read after memory_global.cuh.
//
//   load_async<G>(st, ptr, stride[, rows_valid])   issue 16-byte copies (rows past rows_valid are
//                                                  zero-filled by the hardware: src-size = 0)
//   cp_async_commit()                              close this thread's copies into one group
//   cp_async_wait<N>()                             wait until at most N newest groups are pending
//
// A two-stage loop: load_async(stage 0); commit; for k: load_async(stage k+1); commit;
// cp_async_wait<1>(); G::sync(); compute on stage k; G::sync(). wait only covers this thread's
// own copies, so the barrier after it is what makes the whole tile visible (hopper-facts §2).
#pragma once
#include "memory_global.cuh"

namespace tk {

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N = 0> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <scope G = warp, shared_tile ST>
__device__ inline void load_async(ST& dst, const typename ST::dtype* src, int row_stride, int rows_valid = ALL_ROWS) {
    constexpr int per_chunk = 16 / int(sizeof(typename ST::dtype));
    constexpr int chunks_per_row = ST::cols / per_chunk;
    constexpr int chunks = ST::rows * chunks_per_row;
    for (int k = G::thread_rank(); k < chunks; k += G::threads) {
        const int r = k / chunks_per_row, c = (k % chunks_per_row) * per_chunk;
        const bool valid = r < rows_valid;
        // an invalid row copies 0 bytes and zero-fills 16; its source must still be a legal address
        const typename ST::dtype* from = valid ? src + size_t(r) * row_stride + c : src;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     ::"r"(dst.addr(r, c)), "l"(from), "r"(valid ? 16 : 0) : "memory");
    }
}

}  // namespace tk

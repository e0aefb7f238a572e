// tk/ops/group/sync.cuh — mbarriers, proxy fences, named barriers, elect.sync and setmaxnreg:
// the synchronisation a Hopper producer/consumer pipeline is made of.
// Read in order: arch guard, mbarrier (init → expect bytes / arrive → wait on a phase), fences,
// named barriers, elect_one, setmaxnreg. Facts: shared/docs/hopper-facts.md §6, §8, §9.
#pragma once
#include <cstdint>

// TK_SM90 (mbarrier, TMA, fences: plain sm_90) and TK_HOPPER (wgmma, setmaxnreg: sm_90a only)
// come from tk/common/util.cuh. The host pass and sm_80 device passes see neither, so tk/tk.cuh
// still compiles for sm_80; there these functions compile to nothing (or trap) and must not be called.
#include "../../common/common.cuh"

namespace tk {

// An mbarrier: 8 bytes of shared memory tracking one phase at a time. A phase completes when
// `count` threads have arrived AND every byte announced with expect_bytes has landed (TMA).
// Wait with the parity of the phase you need: a fresh barrier reports parity 1 as already
// complete, so producers waiting on "empty" start with phase 1 and consumers on "full" with 0.
struct alignas(8) mbarrier { uint64_t state; };

namespace mbar {

// One thread initialises; then call fence_init() and a CTA barrier before anyone else uses it.
__device__ inline void init(mbarrier& b, uint32_t count) {
#ifdef TK_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(&b)), "r"(count) : "memory");
#else
    __trap();
#endif
}

// Makes the (generic-proxy) initialisation visible to the async proxy (TMA complete_tx).
__device__ inline void fence_init() {
#ifdef TK_SM90
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Announce `bytes` more bytes for the current phase and arrive once (the TMA issuer does this).
__device__ inline void arrive_expect_bytes(mbarrier& b, uint32_t bytes) {
#ifdef TK_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(&b)), "r"(bytes) : "memory");
#endif
}

// Announce bytes without arriving.
__device__ inline void expect_bytes(mbarrier& b, uint32_t bytes) {
#ifdef TK_SM90
    asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(&b)), "r"(bytes) : "memory");
#endif
}

// Plain arrive (release): "I am done with what this barrier guards".
__device__ inline void arrive(mbarrier& b) {
#ifdef TK_SM90
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_addr(&b)) : "memory");
#endif
}

// Non-blocking: has the phase of this parity completed?
__device__ inline bool test(mbarrier& b, uint32_t phase) {
    uint32_t done = 0;
#ifdef TK_SM90
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(smem_addr(&b)), "r"(phase) : "memory");
#endif
    return done != 0;
}

// Block until the phase with this parity (0/1) has completed. Acquire: the data that the
// arrivals and TMA copies of that phase wrote is visible afterwards, no further fence needed.
__device__ inline void wait(mbarrier& b, uint32_t phase) {
#ifdef TK_SM90
    asm volatile("{\n .reg .pred p;\n"
                 "WAIT_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}" :: "r"(smem_addr(&b)), "r"(phase) : "memory");
#endif
}

__device__ inline void invalidate(mbarrier& b) {
#ifdef TK_SM90
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(smem_addr(&b)) : "memory");
#endif
}

}  // namespace mbar

// Order this thread's ordinary shared-memory writes (st.shared, stmatrix, cp.async) before
// later async-proxy reads (TMA store, wgmma). Every writing thread runs it, then a barrier.
__device__ inline void fence_proxy_async() {
#ifdef TK_SM90
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Named barriers (ids 1..15; 0 is __syncthreads). `threads` counts whole warps.
template <int threads>
__device__ inline void named_sync(int id) {
    static_assert(threads % 32 == 0, "named barriers count whole warps");
    asm volatile("bar.sync %0, %1;" :: "r"(id), "n"(threads) : "memory");
}
template <int threads>
__device__ inline void named_arrive(int id) {
    static_assert(threads % 32 == 0, "named barriers count whole warps");
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "n"(threads) : "memory");
}

// True in exactly one lane of a converged warp (the one that issues a TMA copy, say).
__device__ inline bool elect_one() {
#ifdef TK_SM90
    uint32_t pred = 0;
    asm volatile("{\n .reg .b32 lane;\n .reg .pred p;\n elect.sync lane|p, 0xffffffff;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(pred));
    return pred != 0;
#else
    return (threadIdx.x % 32) == 0;
#endif
}

// setmaxnreg: a warpgroup gives registers back to the CTA pool (producer, which only issues
// TMA) or takes them (consumers, which hold wgmma accumulators). All 4 warps of the warpgroup
// execute it; the kernel needs __launch_bounds__(threads, 1) or ptxas drops it (C7508).
template <int regs>
__device__ inline void warpgroup_decrease_registers() {
    static_assert(regs >= 24 && regs <= 256 && regs % 8 == 0, "setmaxnreg takes 24..256, a multiple of 8");
#ifdef TK_HOPPER
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(regs));
#endif
}
template <int regs>
__device__ inline void warpgroup_increase_registers() {
    static_assert(regs >= 24 && regs <= 256 && regs % 8 == 0, "setmaxnreg takes 24..256, a multiple of 8");
#ifdef TK_HOPPER
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(regs));
#endif
}

}  // namespace tk

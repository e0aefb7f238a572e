// tk/common/util.cuh: architecture macros, the scope template group<N> (group<1> = a warp,
// group<4> = a warpgroup), lane shuffles and warp-wide reductions, and the shared-memory
// allocator that aligns tiles for swizzling. Read after base_types.cuh and base_ops.cuh.
#pragma once
#include "base_ops.cuh"

// ---- what the target can do ----
// TK_SM90:   compiling device code for compute capability >= 9.0 (stmatrix, elect.sync, ...).
// TK_HOPPER: compiling device code for sm_90a, the "a" target that has wgmma and setmaxnreg.
// Neither is defined in the host pass. Code that uses these instructions must be guarded so the
// library still compiles for sm_80 (the compile test builds both).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TK_SM90 1
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TK_HOPPER 1
#endif

namespace tk {

inline constexpr int WARP_THREADS = 32;
inline constexpr int WARPGROUP_WARPS = 4;
inline constexpr unsigned FULL_MASK = 0xffffffffu;

__device__ __forceinline__ int laneid() { return threadIdx.x & 31; }

// group<N>: N consecutive warps acting together; the "scope" of cooperative ops.
// Ops that move memory take the scope as their first template argument, defaulting to a warp:
//     tk::load(st, ptr, stride)            one warp copies the whole tile
//     tk::load<tk::warpgroup>(st, ptr, stride)   128 threads share the work
// Register-only ops (mma, maps, reductions) are per warp by nature and take no scope.
// Blocks are assumed 1-D (threadIdx.x only), as in every kernel of this project.
template <int N> struct group {
    static_assert(N >= 1 && N <= 32, "group<N>: N is a number of warps, 1..32");
    static constexpr int warps = N;
    static constexpr int threads = N * WARP_THREADS;
    __device__ static __forceinline__ int laneid() { return threadIdx.x & 31; }
    // rank of this thread / warp inside its group, and which group of the block it is in
    __device__ static __forceinline__ int thread_rank() { return threadIdx.x % threads; }
    __device__ static __forceinline__ int warpid() { return (threadIdx.x / WARP_THREADS) % N; }
    __device__ static __forceinline__ int groupid() { return threadIdx.x / threads; }
    // Synchronize the group. A warp uses __syncwarp; larger groups use named barrier `id`
    // (1..15; 0 is __syncthreads' own). Each group that syncs concurrently needs its own id.
    __device__ static __forceinline__ void sync(int id) {
        if constexpr (N == 1) {
            (void)id;
            __syncwarp();
        } else {
            asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(threads) : "memory");
        }
    }
};
using warp = group<1>;
using warpgroup = group<WARPGROUP_WARPS>;

// ---- shuffles of any 32- or 64-bit register value (float, float2, bf16_2, half_2, ...) ----
template <typename T> __device__ __forceinline__ T shfl_sync(const T& v, int src_lane) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 2, "shfl_sync: 2, 4 or 8 byte values");
    if constexpr (sizeof(T) == 8) {
        uint2 u = *reinterpret_cast<const uint2*>(&v);
        u.x = __shfl_sync(FULL_MASK, u.x, src_lane);
        u.y = __shfl_sync(FULL_MASK, u.y, src_lane);
        return *reinterpret_cast<T*>(&u);
    } else if constexpr (sizeof(T) == 4) {
        uint32_t u = __shfl_sync(FULL_MASK, *reinterpret_cast<const uint32_t*>(&v), src_lane);
        return *reinterpret_cast<T*>(&u);
    } else {
        uint32_t u = __shfl_sync(FULL_MASK, uint32_t(*reinterpret_cast<const uint16_t*>(&v)), src_lane);
        uint16_t s = uint16_t(u);
        return *reinterpret_cast<T*>(&s);
    }
}
template <typename T> __device__ __forceinline__ T shfl_xor_sync(const T& v, int lane_mask) {
    return shfl_sync(v, laneid() ^ lane_mask);
}

// warp_reduce<Op>(x): Op over all 32 lanes' x, returned to every lane (5 butterfly steps).
// warp_sum / warp_max / warp_min are the usual cases (e.g. a layernorm row held by one warp).
template <typename Op, typename T> __device__ __forceinline__ T warp_reduce(T x) {
#pragma unroll
    for (int mask = 16; mask >= 1; mask >>= 1) x = Op::template op<T>(x, shfl_xor_sync(x, mask));
    return x;
}
template <typename T> __device__ __forceinline__ T warp_sum(T x) { return warp_reduce<base_ops::sum>(x); }
template <typename T> __device__ __forceinline__ T warp_max(T x) { return warp_reduce<base_ops::max>(x); }
template <typename T> __device__ __forceinline__ T warp_min(T x) { return warp_reduce<base_ops::min>(x); }

// Shared-window address (what ldmatrix, cp.async, wgmma descriptors and TMA want).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// shared_allocator: hands out tiles from dynamic shared memory, each aligned to `align` bytes.
// 1024 is the 128-byte swizzle's repeat: TMA and wgmma need swizzled tiles on that boundary.
// The alignment of `extern __shared__` itself is not guaranteed, so the allocator rounds the
// start up at run time; ask the launch for 1 KB more than the tiles need.
//     extern __shared__ char smem[];
//     tk::shared_allocator al(smem);
//     auto& a = al.allocate<tk::st_bf<64, 64>>();          // one tile
//     auto (&b)[2] = al.allocate<tk::st_bf<64, 64>, 2>();  // an array of two
struct shared_allocator {
    char* ptr;
    __device__ explicit shared_allocator(void* base) {
        uint32_t a = smem_addr(base);
        ptr = static_cast<char*>(base) + ((1024 - (a & 1023)) & 1023);
    }
    template <typename T, int N = 1, int align = 1024> __device__ auto& allocate() {
        uint32_t a = smem_addr(ptr);
        ptr += (align - (a & (align - 1))) & (align - 1);
        char* p = ptr;
        ptr += sizeof(T) * N;
        if constexpr (N == 1) return *reinterpret_cast<T*>(p);
        else return *reinterpret_cast<T(*)[N]>(p);
    }
};

}  // namespace tk

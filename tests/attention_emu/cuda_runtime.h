// tests/attention_emu/cuda_runtime.h: a CPU stand-in for the CUDA runtime and built-ins, so a
// .cu file's kernels can run on the host (no GPU) for layout and indexing checks.
// Every CUDA thread is a std::thread; a block's threads run together and meet at real barriers,
// warp collectives (shfl, ldmatrix, mma) exchange values through a per-warp mailbox.
// Used only by tests/test_attention_emulated.py; not part of the library.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using cudaStream_t = void*;
using cudaError_t = int;
constexpr int cudaSuccess = 0, cudaErrorInvalidValue = 1;
constexpr int cudaFuncAttributeMaxDynamicSharedMemorySize = 8;

namespace emu {
struct Warp {
    std::barrier<> bar{32};
    uint64_t slot[32][8];
};
struct Block {
    std::barrier<> bar;
    std::vector<unsigned char> smem;
    std::vector<std::unique_ptr<Warp>> warps;
    Block(int threads, int smem_bytes) : bar(threads), smem(smem_bytes + 16) {
        for (int i = 0; i < (threads + 31) / 32; ++i) warps.emplace_back(new Warp);
    }
};
inline thread_local Block* block = nullptr;
inline thread_local Warp* warp = nullptr;
inline thread_local int lane = 0;
}  // namespace emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { emu::block->bar.arrive_and_wait(); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {
// One warp-wide exchange: every lane posts up to 8 words, then reads everyone's.
template <class F>
inline void exchange(const uint64_t* in, int n, F&& read) {
    for (int i = 0; i < n; ++i) warp->slot[lane][i] = in[i];
    warp->bar.arrive_and_wait();
    read(warp->slot);
    warp->bar.arrive_and_wait();
}
inline unsigned char* shared_memory() {
    uintptr_t p = reinterpret_cast<uintptr_t>(block->smem.data());
    return reinterpret_cast<unsigned char*>((p + 15) & ~uintptr_t(15));
}
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, dim3 threads, int smem_bytes, cudaStream_t, const Args&... args) {
    const int n = threads.x * threads.y * threads.z;
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            Block blk(n, smem_bytes);
            std::memset(blk.smem.data(), 0xff, blk.smem.size());  // garbage (bf16 NaN) until written
            std::vector<std::thread> pool;
            for (int tid = 0; tid < n; ++tid)
                pool.emplace_back([&, tid] {
                    block = &blk;
                    warp = blk.warps[tid / 32].get();
                    lane = tid % 32;
                    threadIdx = dim3(tid);
                    blockIdx = dim3(bx, by);
                    blockDim = threads;
                    gridDim = grid;
                    kernel(args...);
                });
            for (auto& th : pool) th.join();
        }
}
}  // namespace emu

inline float __shfl_xor_sync(unsigned, float v, int mask) {
    uint64_t in;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    in = bits;
    float out = 0;
    emu::exchange(&in, 1, [&](uint64_t (*slot)[8]) {
        uint32_t b = (uint32_t)slot[emu::lane ^ mask][0];
        std::memcpy(&out, &b, 4);
    });
    return out;
}
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

template <class K>
inline cudaError_t cudaFuncSetAttribute(K, int, int) { return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
    std::memset(p, v, n);
    return cudaSuccess;
}

// The vector types of 16-byte loads and stores (session 7's wide kernels), as plain structs
// (float2 is in cuda_bf16.h, beside __bfloat1622float2).
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

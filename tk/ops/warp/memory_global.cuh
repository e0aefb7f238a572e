// tk/ops/warp/memory_global.cuh: moves between global memory and register tiles, shared tiles,
// register vectors and shared vectors, synchronously. Read after memory_shared.cuh.
//
// Global memory is addressed as (pointer to the tile's top-left element, row stride in elements).
// `rows_valid` handles tails: rows at or past it are read as zeros and never written. Rows are
// counted from `src`/`dst`, for the whole group's tile.
//
//   load(rt, ptr, stride[, rows_valid])    store(ptr, rt, stride[, rows_valid])
//   load<G>(st, ptr, stride[, rows_valid]) store<G>(ptr, st, stride[, rows_valid])   16-byte chunks
//   load(rv, ptr)  store(ptr, rv)  load<G>(sv, ptr)  store<G>(ptr, sv)
//
// Alignment: register tiles move element pairs, so `ptr` and `stride` must keep pairs aligned
// (even stride). Shared tiles move 16-byte chunks: ptr and stride*sizeof(T) must be multiples of
// 16 bytes. For the asynchronous copy into shared memory see memory_async.cuh.
// Shared tiles written here are read by other threads only after a barrier (G::sync or
// __syncthreads); for TMA or wgmma reads also after fence.proxy.async (hopper-facts §6.4).
#pragma once
#include "memory_shared.cuh"

namespace tk {

inline constexpr int ALL_ROWS = 1 << 30;

// ---- global -> register tile (warp w of G takes rows w*rt::rows ..) ----
template <scope G = warp, register_tile RT, typename T>
__device__ inline void load(RT& dst, const T* src, int row_stride, int rows_valid = ALL_ROWS) {
    using base = typename RT::base;
    using L = typename RT::layout;
    const int row0 = G::warpid() * RT::rows;
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = row0 + 16 * i + base::row(q, 0), c = 16 * j + base::col(q, 0);
                const int r2 = r + detail::pair_step_r<L>, c2 = c + detail::pair_step_c<L>;
                pair_t<T> p;
                if constexpr (std::same_as<L, row_l>) {
                    p = r < rows_valid ? *reinterpret_cast<const pair_t<T>*>(src + size_t(r) * row_stride + c) : constants<pair_t<T>>::zero();
                } else {
                    p.x = r < rows_valid ? src[size_t(r) * row_stride + c] : constants<T>::zero();
                    p.y = r2 < rows_valid ? src[size_t(r2) * row_stride + c2] : constants<T>::zero();
                }
                dst.tiles[i][j].data[q] = convert<typename RT::T2>(p);
            }
}

// ---- register tile -> global ----
template <scope G = warp, register_tile RT, typename T>
__device__ inline void store(T* dst, const RT& src, int row_stride, int rows_valid = ALL_ROWS) {
    using base = typename RT::base;
    using L = typename RT::layout;
    const int row0 = G::warpid() * RT::rows;
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = row0 + 16 * i + base::row(q, 0), c = 16 * j + base::col(q, 0);
                const int r2 = r + detail::pair_step_r<L>, c2 = c + detail::pair_step_c<L>;
                const pair_t<T> p = convert<pair_t<T>>(src.tiles[i][j].data[q]);
                if constexpr (std::same_as<L, row_l>) {
                    if (r < rows_valid) *reinterpret_cast<pair_t<T>*>(dst + size_t(r) * row_stride + c) = p;
                } else {
                    if (r < rows_valid) dst[size_t(r) * row_stride + c] = lo(p);
                    if (r2 < rows_valid) dst[size_t(r2) * row_stride + c2] = hi(p);
                }
            }
}

// ---- global -> shared tile, 16 bytes per thread per step, consecutive threads along a row ----
template <scope G = warp, shared_tile ST>
__device__ inline void load(ST& dst, const typename ST::dtype* src, int row_stride, int rows_valid = ALL_ROWS) {
    constexpr int per_chunk = 16 / int(sizeof(typename ST::dtype));
    constexpr int chunks_per_row = ST::cols / per_chunk;
    constexpr int chunks = ST::rows * chunks_per_row;
    for (int k = G::thread_rank(); k < chunks; k += G::threads) {
        const int r = k / chunks_per_row, c = (k % chunks_per_row) * per_chunk;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < rows_valid) v = *reinterpret_cast<const float4*>(src + size_t(r) * row_stride + c);
        *reinterpret_cast<float4*>(dst.ptr(r, c)) = v;
    }
}

// ---- shared tile -> global ----
template <scope G = warp, shared_tile ST>
__device__ inline void store(typename ST::dtype* dst, const ST& src, int row_stride, int rows_valid = ALL_ROWS) {
    constexpr int per_chunk = 16 / int(sizeof(typename ST::dtype));
    constexpr int chunks_per_row = ST::cols / per_chunk;
    constexpr int chunks = ST::rows * chunks_per_row;
    for (int k = G::thread_rank(); k < chunks; k += G::threads) {
        const int r = k / chunks_per_row, c = (k % chunks_per_row) * per_chunk;
        if (r < rows_valid) *reinterpret_cast<float4*>(dst + size_t(r) * row_stride + c) = *reinterpret_cast<const float4*>(src.ptr(r, c));
    }
}

// ---- global <-> register vector ----
template <register_vec RV, typename T>
__device__ inline void load(RV& dst, const T* src) {
#pragma unroll
    for (int o = 0; o < RV::outer; o++)
#pragma unroll
        for (int i = 0; i < RV::inner; i++) dst.data[o][i] = convert<typename RV::dtype>(src[RV::index(o, i)]);
}
template <typename T, register_vec RV>
__device__ inline void store(T* dst, const RV& src) {
    if (!RV::is_writer()) return;
#pragma unroll
    for (int o = 0; o < RV::outer; o++)
#pragma unroll
        for (int i = 0; i < RV::inner; i++) dst[RV::index(o, i)] = convert<T>(src.data[o][i]);
}

// ---- global <-> shared vector ----
template <scope G = warp, shared_vec SV>
__device__ inline void load(SV& dst, const typename SV::dtype* src) {
    for (int k = G::thread_rank(); k < SV::length; k += G::threads) dst[k] = src[k];
}
template <scope G = warp, shared_vec SV>
__device__ inline void store(typename SV::dtype* dst, const SV& src) {
    for (int k = G::thread_rank(); k < SV::length; k += G::threads) dst[k] = src[k];
}

}  // namespace tk

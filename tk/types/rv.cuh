// tk/types/rv.cuh: register vectors, one value per row or per column of a register tile, spread
// over the warp the same way that tile axis is. Read after rt_base.cuh, before rt.cuh.
//
// A vector of length N is N/16 chunks; chunk o covers indices 16*o .. 16*o+15 and each lane
// keeps the few of them it needs to meet its tile elements without shuffles:
//
//   ortho_l: data[o][i], i = 0..1, index 16*o + g + 8*i          (g = lane/4; quads agree)
//   align_l: data[o][i], i = 0..3, index 16*o + 2t + (i&1) + 8*(i>>1)   (t = lane%4; quads agree)
//
// Which one a tile uses (rt::col_vec, rt::row_vec) follows from rt_base's maps:
//   row_l tile: per-row values (col_vec) are ortho_l, per-column values (row_vec) are align_l;
//   col_l tile: the other way round.
#pragma once
#include "rt_base.cuh"

namespace tk {

template <typename T, int N, rv_layout L> struct rv {
    static_assert(N % 16 == 0 && N > 0, "rv: length must be a positive multiple of 16");
    using identifier = detail::rv_tag;
    using dtype = T;
    using layout = L;
    static constexpr int length = N;
    static constexpr int outer = N / 16;           // chunks
    static constexpr int inner = L::per_chunk;     // values per chunk held by each lane

    T data[outer][inner];

    // The vector index of data[o][i] on this lane.
    __device__ static __forceinline__ int index(int o, int i) {
        const int lane = threadIdx.x & 31;
        if constexpr (std::same_as<L, ortho_l>) return 16 * o + (lane >> 2) + 8 * i;
        else return 16 * o + 2 * (lane & 3) + (i & 1) + 8 * (i >> 1);
    }
    // Is this lane the one that writes data[o][*] out (the others hold copies)?
    __device__ static __forceinline__ bool is_writer() {
        const int lane = threadIdx.x & 31;
        if constexpr (std::same_as<L, ortho_l>) return (lane & 3) == 0;
        else return (lane >> 2) == 0;
    }
};

template <int N, rv_layout L> using rv_fl = rv<float, N, L>;
template <int N, rv_layout L> using rv_bf = rv<bf16, N, L>;
template <int N, rv_layout L> using rv_hf = rv<half, N, L>;

}  // namespace tk

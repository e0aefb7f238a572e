// tk/types/rt_base.cuh: the 16x16 base fragment, the unit every register tile is made of, laid
// out exactly as mma.sync.m16n8k16 wants its operands. Read first in tk/types/.
//
// A warp holds a 16x16 tile as 8 elements per lane, in 4 pairs data[0..3]. With
// g = lane/4 (0..7) and t = lane%4 (0..3), pair q (0..3) and half h (0 = .x, 1 = .y) hold:
//
//   row_l: row = g + 8*(q&1),        col = 2t + h + 8*(q>>1)     (pairs run along a row)
//   col_l: row = 2t + h + 8*(q>>1),  col = g + 8*(q&1)           (pairs run along a column)
//
//        cols 0-7   cols 8-15                 row_l, lane 5 (g=1, t=1):
//   rows  +--------+--------+                   data[0] = (1,2) (1,3)   data[1] = (9,2) (9,3)
//   0-7   | q = 0  | q = 2  |                    data[2] = (1,10)(1,11)  data[3] = (9,10)(9,11)
//   8-15  | q = 1  | q = 3  |
//         +--------+--------+
//
// row_l is the mma A fragment (a0..a7) and the fp32 accumulator (two n8 halves side by side).
// col_l is the mma B fragment of A*B: pairs along K. A row_l tile R x C holds exactly the same
// registers as the col_l tile C x R of its transpose, which is why transpose_sep is free.
#pragma once
#include "../common/common.cuh"

namespace tk {

template <typename T, rt_layout L> struct rt_base {
    using dtype = T;                 // scalar type: float, bf16 or half
    using T2 = pair_t<T>;            // what one register (pair) holds
    using layout = L;
    static constexpr int tile_size = 16;
    static constexpr int pairs_per_thread = 4;
    static constexpr int elements_per_thread = 8;

    T2 data[pairs_per_thread];

    // Coordinates inside the 16x16 tile of this lane's pair q, half h.
    __device__ static __forceinline__ int row(int q, int h) {
        const int lane = threadIdx.x & 31;
        if constexpr (std::same_as<L, row_l>) return (lane >> 2) + 8 * (q & 1);
        else return 2 * (lane & 3) + h + 8 * (q >> 1);
    }
    __device__ static __forceinline__ int col(int q, int h) {
        const int lane = threadIdx.x & 31;
        if constexpr (std::same_as<L, row_l>) return 2 * (lane & 3) + h + 8 * (q >> 1);
        else return (lane >> 2) + 8 * (q & 1);
    }
    // Which slot of a per-row vector (index = row) and of a per-column vector (index = col)
    // pair q, half h belongs to, in the vector layouts of tk/types/rv.cuh.
    __device__ static constexpr int row_slot(int q, int h) {
        if constexpr (std::same_as<L, row_l>) return q & 1;          // ortho_l: rows g, g+8
        else return h + 2 * (q >> 1);                                // align_l: rows 2t,2t+1,2t+8,2t+9
    }
    __device__ static constexpr int col_slot(int q, int h) {
        if constexpr (std::same_as<L, row_l>) return h + 2 * (q >> 1);  // align_l
        else return q & 1;                                              // ortho_l
    }
};

}  // namespace tk

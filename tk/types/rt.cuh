// tk/types/rt.cuh: register tiles rt<T, rows, cols, layout>, a grid of 16x16 base fragments held
// by one warp. Read after rt_base.cuh and rv.cuh.
//
//   tk::rt_bf<16, 64>          16x64 bf16, row layout (an mma A operand, or B of A*B^T)
//   tk::rt_bf<64, 64, col_l>   64x64 bf16, col layout (the B operand of A*B)
//   tk::rt_fl<16, 64>          16x64 fp32 accumulator (always row layout)
//
// Element (r, c) lives in tiles[r/16][c/16], at the place rt_base gives for (r%16, c%16).
// col_vec is the type of a per-row vector (length rows, like a column), row_vec of a per-column
// vector (length cols, like a row): `row_max(col_vec&, tile)` reduces each row to one value.
#pragma once
#include "rv.cuh"

namespace tk {

template <typename T, int R, int C, rt_layout L = row_l> struct rt {
    static_assert(R % 16 == 0 && C % 16 == 0 && R > 0 && C > 0,
                  "rt: rows and cols must be positive multiples of 16 (the mma fragment size)");
    static_assert(std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, half>,
                  "rt: dtype must be float, bf16 or half");
    using identifier = detail::rt_tag;
    using dtype = T;
    using T2 = pair_t<T>;
    using layout = L;
    using base = rt_base<T, L>;
    static constexpr int rows = R, cols = C;
    static constexpr int height = R / 16, width = C / 16;   // in base tiles
    static constexpr int pairs_per_thread = height * width * base::pairs_per_thread;

    base tiles[height][width];

    using col_vec = rv<T, R, std::conditional_t<std::same_as<L, row_l>, ortho_l, align_l>>;  // per row
    using row_vec = rv<T, C, std::conditional_t<std::same_as<L, row_l>, align_l, ortho_l>>;  // per column
};

template <int R, int C, rt_layout L = row_l> using rt_fl = rt<float, R, C, L>;
template <int R, int C, rt_layout L = row_l> using rt_bf = rt<bf16, R, C, L>;
template <int R, int C, rt_layout L = row_l> using rt_hf = rt<half, R, C, L>;

}  // namespace tk

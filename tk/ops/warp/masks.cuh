// tk/ops/warp/masks.cuh: masks on register tiles, for causal attention and for tails. Each keeps
// some elements of src and writes `fill` (default 0; -INFINITY before a softmax) elsewhere.
// Read after conversions.cuh.
//
//   tril(dst, src, diagonal, fill)    keep (r, c) with c - r <= diagonal   (lower triangle)
//   triu(dst, src, diagonal, fill)    keep (r, c) with c - r >= diagonal   (upper triangle)
//   right_fill(dst, src, col_limit, fill)   fill columns c >= col_limit  (key tail)
//   left_fill (dst, src, col_limit, fill)   fill columns c <  col_limit
//   lower_fill(dst, src, row_limit, fill)   fill rows    r >= row_limit  (query tail)
//   upper_fill(dst, src, row_limit, fill)   fill rows    r <  row_limit
//   mask_map(dst, src, keep(r, c), fill)   any other predicate
//
// Tiles off the diagonal: a causal mask for the score tile of queries q0.. and keys k0.. keeps
// key k0+c for query q0+r when k0 + c <= q0 + r, i.e. tril(s, s, q0 - k0, -INFINITY).
// diagonal >= cols-1 keeps everything, diagonal < -(rows-1) keeps nothing.
#pragma once
#include "conversions.cuh"

namespace tk {

template <register_tile RT, typename Keep>
__device__ inline void mask_map(RT& dst, const RT& src, Keep keep, float fill) {
    using base = typename RT::base;
    using S = typename RT::dtype;
    const S f = convert<S>(fill);
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                typename RT::T2 p = src.tiles[i][j].data[q];
                if (!keep(16 * i + base::row(q, 0), 16 * j + base::col(q, 0))) p.x = f;
                if (!keep(16 * i + base::row(q, 1), 16 * j + base::col(q, 1))) p.y = f;
                dst.tiles[i][j].data[q] = p;
            }
}

template <register_tile RT> __device__ inline void tril(RT& dst, const RT& src, int diagonal, float fill = 0.0f) {
    mask_map(dst, src, [=](int r, int c) { return c - r <= diagonal; }, fill);
}
template <register_tile RT> __device__ inline void triu(RT& dst, const RT& src, int diagonal, float fill = 0.0f) {
    mask_map(dst, src, [=](int r, int c) { return c - r >= diagonal; }, fill);
}
template <register_tile RT> __device__ inline void right_fill(RT& dst, const RT& src, int col_limit, float fill = 0.0f) {
    mask_map(dst, src, [=](int, int c) { return c < col_limit; }, fill);
}
template <register_tile RT> __device__ inline void left_fill(RT& dst, const RT& src, int col_limit, float fill = 0.0f) {
    mask_map(dst, src, [=](int, int c) { return c >= col_limit; }, fill);
}
template <register_tile RT> __device__ inline void lower_fill(RT& dst, const RT& src, int row_limit, float fill = 0.0f) {
    mask_map(dst, src, [=](int r, int) { return r < row_limit; }, fill);
}
template <register_tile RT> __device__ inline void upper_fill(RT& dst, const RT& src, int row_limit, float fill = 0.0f) {
    mask_map(dst, src, [=](int r, int) { return r >= row_limit; }, fill);
}

}  // namespace tk

// tk/ops/warp/conversions.cuh: changing a register tile's dtype, its layout, or transposing it.
// Read after reductions.cuh.
//
//   copy(dst, src)            same shape and layout, any dtypes (fp32 accumulator -> bf16 operand)
//   swap_layout(dst, src)     same tile, row_l <-> col_l (the registers must move between lanes)
//   transpose_sep(dst, src)   dst = src^T with the layout flipped: free, registers are reused as is
//   transpose(dst, src)       dst = src^T in the same layout: transpose_sep + swap_layout
//
// swap_layout, 16-bit: each 8x8 block of a fragment is one movmatrix (an in-register 8x8
// transpose), and block (a, b) of the row_l tile becomes pair index (b, a) of the col_l tile.
// fp32: no movmatrix for 32-bit values, so each lane fetches its 8 elements by shuffles; the
// source of (row 2t+h, col g) in a row_l fragment is lane 4*(2t+h) + g/2, half g%2.
#pragma once
#include "reductions.cuh"

namespace tk {

template <register_tile D, register_tile S>
    requires(!std::same_as<D, S>)
__device__ inline void copy(D& dst, const S& src) {
    static_assert(D::rows == S::rows && D::cols == S::cols && std::same_as<typename D::layout, typename S::layout>,
                  "copy(dst, src): tiles must have the same shape and layout (use swap_layout to change layout)");
#pragma unroll
    for (int i = 0; i < D::height; i++)
#pragma unroll
        for (int j = 0; j < D::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) dst.tiles[i][j].data[q] = convert<typename D::T2>(src.tiles[i][j].data[q]);
}
template <register_vec D, register_vec S>
    requires(!std::same_as<D, S>)
__device__ inline void copy(D& dst, const S& src) {
    static_assert(D::length == S::length && std::same_as<typename D::layout, typename S::layout>,
                  "copy(dst, src): vectors must have the same length and layout");
#pragma unroll
    for (int o = 0; o < D::outer; o++)
#pragma unroll
        for (int i = 0; i < D::inner; i++) dst.data[o][i] = convert<typename D::dtype>(src.data[o][i]);
}

namespace detail {
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
// pair q of a row_l fragment covers block (q&1, q>>1); in col_l the same block is pair (q>>1) + 2*(q&1).
__device__ constexpr int swap_pair(int q) { return ((q & 1) << 1) | (q >> 1); }

template <typename T, rt_layout LD, rt_layout LS>
__device__ inline void swap_layout_base(rt_base<T, LD>& dst, const rt_base<T, LS>& src) {
    if constexpr (is_16bit_v<T>) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t x = *reinterpret_cast<const uint32_t*>(&src.data[q]);
            const uint32_t y = movmatrix_trans(x);
            dst.data[swap_pair(q)] = *reinterpret_cast<const pair_t<T>*>(&y);
        }
    } else {
        const int lane = laneid(), g = lane >> 2, t = lane & 3;
        pair_t<T> out[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const pair_t<T> v = shfl_sync(src.data[swap_pair(q)], 4 * (2 * t + h) + g / 2);
                const scalar_t<T> e = (g & 1) ? hi(v) : lo(v);
                if (h == 0) out[q].x = e; else out[q].y = e;
            }
#pragma unroll
        for (int q = 0; q < 4; q++) dst.data[q] = out[q];
    }
}
}  // namespace detail

template <typename T, int R, int C, rt_layout L>
__device__ inline void swap_layout(rt<T, R, C, transpose_layout<L>>& dst, const rt<T, R, C, L>& src) {
#pragma unroll
    for (int i = 0; i < R / 16; i++)
#pragma unroll
        for (int j = 0; j < C / 16; j++) detail::swap_layout_base(dst.tiles[i][j], src.tiles[i][j]);
}

template <typename T, int R, int C, rt_layout L>
__device__ inline void transpose_sep(rt<T, C, R, transpose_layout<L>>& dst, const rt<T, R, C, L>& src) {
#pragma unroll
    for (int i = 0; i < R / 16; i++)
#pragma unroll
        for (int j = 0; j < C / 16; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) dst.tiles[j][i].data[q] = src.tiles[i][j].data[q];
}

template <typename T, int R, int C, rt_layout L>
__device__ inline void transpose(rt<T, C, R, L>& dst, const rt<T, R, C, L>& src) {
    rt<T, C, R, transpose_layout<L>> tmp;
    transpose_sep(tmp, src);
    swap_layout(dst, tmp);
}

}  // namespace tk

// tk/ops/warp/reductions.cuh: row and column reductions of a register tile into a register
// vector, and broadcasts of a vector back across a tile. Read after maps.cuh.
// Naming: a `row_` prefix reduces (row_max: each row -> one value), a `_row` suffix broadcasts
// (sub_row: subtract from each row its own value). Destination first.
//
//   row_max(v, t)          v[r] = max_c t(r, c)              v: tile::col_vec (one value per row)
//   row_max(v, t, acc)     v[r] = max(acc[r], max_c t(r, c))    (running max, as in softmax)
//   row_min row_sum, col_max col_min col_sum (v: tile::row_vec, one value per column)
//   add_row(t, s, v)       t(r, c) = s(r, c) + v[r]     also sub_ mul_ div_ max_ min_row
//   add_col(t, s, v)       t(r, c) = s(r, c) + v[c]     also sub_ mul_ div_ max_ min_col
//   broadcast_row(t, v)    t(r, c) = v[r];   broadcast_col(t, v)   t(r, c) = v[c]
//
// How a row reduction runs (row_l tile): a lane holds rows g and g+8 of every base tile, at
// columns 2t, 2t+1, 2t+8, 2t+9. It first combines its own values of each row, then the 4 lanes
// of its quad (same g, t = 0..3) combine theirs with two xor-shuffles (lane masks 1 and 2); every
// lane of the quad ends with the result, which is the ortho_l vector layout. A column reduction
// of a row_l tile combines across g instead (masks 4, 8, 16) and lands in align_l. For col_l
// tiles the roles swap. The vector's dtype is the accumulation type (use rv_fl for bf16 tiles).
#pragma once
#include "maps.cuh"

namespace tk {
namespace detail {
// Finish a reduction across the lanes that share this vector slot.
template <typename Op, rv_layout VL, typename T> __device__ __forceinline__ T reduce_across_lanes(T x) {
    if constexpr (std::same_as<VL, ortho_l>) {
        x = Op::template op<T>(x, shfl_xor_sync(x, 1));
        x = Op::template op<T>(x, shfl_xor_sync(x, 2));
    } else {
        x = Op::template op<T>(x, shfl_xor_sync(x, 4));
        x = Op::template op<T>(x, shfl_xor_sync(x, 8));
        x = Op::template op<T>(x, shfl_xor_sync(x, 16));
    }
    return x;
}
// axis_rows = true: reduce each row (vector indexed by row); false: reduce each column.
template <typename Op, bool axis_rows, register_vec V, register_tile RT>
__device__ inline void reduce(V& dst, const RT& src, const V* accum) {
    using base = typename RT::base;
    using VT = typename V::dtype;
    using want = std::conditional_t<axis_rows, typename RT::col_vec, typename RT::row_vec>;
    static_assert(V::length == want::length && std::same_as<typename V::layout, typename want::layout>,
                  "row_/col_ reduction: the vector must be tile::col_vec (row_*) or tile::row_vec (col_*), any dtype");
    constexpr int outer = axis_rows ? RT::height : RT::width;
    constexpr int across = axis_rows ? RT::width : RT::height;
#pragma unroll
    for (int o = 0; o < outer; o++) {
        VT acc[V::inner];
#pragma unroll
        for (int s = 0; s < V::inner; s++) acc[s] = base_ops::identity<Op, VT>();
#pragma unroll
        for (int a = 0; a < across; a++) {
            const auto& t = [&]() -> const auto& { if constexpr (axis_rows) return src.tiles[o][a]; else return src.tiles[a][o]; }();
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float2 v = convert<float2>(t.data[q]);
                const int s0 = axis_rows ? base::row_slot(q, 0) : base::col_slot(q, 0);
                const int s1 = axis_rows ? base::row_slot(q, 1) : base::col_slot(q, 1);
                acc[s0] = Op::template op<VT>(acc[s0], convert<VT>(v.x));
                acc[s1] = Op::template op<VT>(acc[s1], convert<VT>(v.y));
            }
        }
#pragma unroll
        for (int s = 0; s < V::inner; s++) {
            VT r = reduce_across_lanes<Op, typename V::layout>(acc[s]);
            dst.data[o][s] = accum ? Op::template op<VT>(accum->data[o][s], r) : r;
        }
    }
}
// axis_rows = true: dst(r, c) = Op(src(r, c), v[r]); false: Op(src(r, c), v[c]).
template <typename Op, bool axis_rows, register_tile RT, register_vec V>
__device__ inline void broadcast(RT& dst, const RT& src, const V& v) {
    using base = typename RT::base;
    using T2 = typename RT::T2;
    using want = std::conditional_t<axis_rows, typename RT::col_vec, typename RT::row_vec>;
    static_assert(V::length == want::length && std::same_as<typename V::layout, typename want::layout>,
                  "_row / _col broadcast: the vector must be tile::col_vec (_row) or tile::row_vec (_col), any dtype");
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int o = axis_rows ? i : j;
                const int s0 = axis_rows ? base::row_slot(q, 0) : base::col_slot(q, 0);
                const int s1 = axis_rows ? base::row_slot(q, 1) : base::col_slot(q, 1);
                const T2 b = make_pair<T2>(convert<typename RT::dtype>(v.data[o][s0]), convert<typename RT::dtype>(v.data[o][s1]));
                dst.tiles[i][j].data[q] = Op::template op<T2>(src.tiles[i][j].data[q], b);
            }
}
}  // namespace detail

// ---- reductions ----
template <register_vec V, register_tile RT> __device__ inline void row_max(V& d, const RT& s) { detail::reduce<base_ops::max, true>(d, s, (const V*)nullptr); }
template <register_vec V, register_tile RT> __device__ inline void row_min(V& d, const RT& s) { detail::reduce<base_ops::min, true>(d, s, (const V*)nullptr); }
template <register_vec V, register_tile RT> __device__ inline void row_sum(V& d, const RT& s) { detail::reduce<base_ops::sum, true>(d, s, (const V*)nullptr); }
template <register_vec V, register_tile RT> __device__ inline void col_max(V& d, const RT& s) { detail::reduce<base_ops::max, false>(d, s, (const V*)nullptr); }
template <register_vec V, register_tile RT> __device__ inline void col_min(V& d, const RT& s) { detail::reduce<base_ops::min, false>(d, s, (const V*)nullptr); }
template <register_vec V, register_tile RT> __device__ inline void col_sum(V& d, const RT& s) { detail::reduce<base_ops::sum, false>(d, s, (const V*)nullptr); }
// ... and the accumulating forms: d = Op(acc, reduction of s); d and acc may be the same vector.
template <register_vec V, register_tile RT> __device__ inline void row_max(V& d, const RT& s, const V& acc) { detail::reduce<base_ops::max, true>(d, s, &acc); }
template <register_vec V, register_tile RT> __device__ inline void row_min(V& d, const RT& s, const V& acc) { detail::reduce<base_ops::min, true>(d, s, &acc); }
template <register_vec V, register_tile RT> __device__ inline void row_sum(V& d, const RT& s, const V& acc) { detail::reduce<base_ops::sum, true>(d, s, &acc); }
template <register_vec V, register_tile RT> __device__ inline void col_max(V& d, const RT& s, const V& acc) { detail::reduce<base_ops::max, false>(d, s, &acc); }
template <register_vec V, register_tile RT> __device__ inline void col_min(V& d, const RT& s, const V& acc) { detail::reduce<base_ops::min, false>(d, s, &acc); }
template <register_vec V, register_tile RT> __device__ inline void col_sum(V& d, const RT& s, const V& acc) { detail::reduce<base_ops::sum, false>(d, s, &acc); }

// ---- broadcasts across rows (v has one value per row) ----
template <register_tile RT, register_vec V> __device__ inline void add_row(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::sum, true>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void sub_row(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::sub, true>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void mul_row(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::mul, true>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void div_row(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::div, true>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void max_row(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::max, true>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void min_row(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::min, true>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void broadcast_row(RT& d, const V& v) { detail::broadcast<take_second, true>(d, d, v); }
// ---- broadcasts across columns (v has one value per column) ----
template <register_tile RT, register_vec V> __device__ inline void add_col(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::sum, false>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void sub_col(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::sub, false>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void mul_col(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::mul, false>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void div_col(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::div, false>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void max_col(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::max, false>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void min_col(RT& d, const RT& s, const V& v) { detail::broadcast<base_ops::min, false>(d, s, v); }
template <register_tile RT, register_vec V> __device__ inline void broadcast_col(RT& d, const V& v) { detail::broadcast<take_second, false>(d, d, v); }

}  // namespace tk

// tk/common/concepts.cuh: the layout tags (row_l, col_l for register tiles; ortho_l, align_l for
// register vectors) and the C++20 concepts that say which type an op accepts. Read after util.cuh
// and before tk/types/. A misuse reads like "constraints not satisfied: col_layout_tile<B>".
#pragma once
#include <concepts>
#include "util.cuh"

namespace tk {

// ---- register tile layouts (see tk/types/rt_base.cuh for the exact register maps) ----
// row_l: each register pair holds two neighbours along a ROW (the mma A operand, the accumulator).
// col_l: each register pair holds two neighbours along a COLUMN (the mma B operand of A*B).
struct row_l {};
struct col_l {};
template <typename L> concept rt_layout = std::same_as<L, row_l> || std::same_as<L, col_l>;
template <rt_layout L> using transpose_layout = std::conditional_t<std::same_as<L, row_l>, col_l, row_l>;

// ---- register vector layouts (see tk/types/rv.cuh) ----
// A vector of length N is stored in chunks of 16 (one per 16x16 base tile along its axis).
// ortho_l: 2 values per chunk, indices g and g+8 (g = lane/4); the 4 lanes of a quad agree.
// align_l: 4 values per chunk, indices 2t, 2t+1, 2t+8, 2t+9 (t = lane%4); the 8 quads agree.
struct ortho_l { static constexpr int per_chunk = 2; };
struct align_l { static constexpr int per_chunk = 4; };
template <typename L> concept rv_layout = std::same_as<L, ortho_l> || std::same_as<L, align_l>;

namespace detail {
struct rt_tag {};
struct rv_tag {};
struct st_tag {};
struct sv_tag {};
template <int N> std::true_type is_group(const group<N>*);
std::false_type is_group(const void*);
}  // namespace detail

// A scope: group<N> (warp = group<1>, warpgroup = group<4>).
template <typename G> concept scope = decltype(detail::is_group(static_cast<G*>(nullptr)))::value;

template <typename T> concept register_tile = std::same_as<typename T::identifier, detail::rt_tag>;
template <typename T> concept register_vec = std::same_as<typename T::identifier, detail::rv_tag>;
template <typename T> concept shared_tile = std::same_as<typename T::identifier, detail::st_tag>;
template <typename T> concept shared_vec = std::same_as<typename T::identifier, detail::sv_tag>;

template <typename T> concept row_layout_tile = register_tile<T> && std::same_as<typename T::layout, row_l>;
template <typename T> concept col_layout_tile = register_tile<T> && std::same_as<typename T::layout, col_l>;
// mma operands are bf16 or fp16; the accumulator is fp32 in row layout.
template <typename T> concept mma_operand_tile =
    register_tile<T> && (std::same_as<typename T::dtype, bf16> || std::same_as<typename T::dtype, half>);
template <typename T> concept fp32_accumulator_tile = row_layout_tile<T> && std::same_as<typename T::dtype, float>;

}  // namespace tk

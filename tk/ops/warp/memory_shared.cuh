// tk/ops/warp/memory_shared.cuh: moves between shared tiles and register tiles (ldmatrix in,
// stmatrix out where the hardware has it, plain 4/8-byte accesses where it does not), and
// between shared and register vectors. Read first in tk/ops/warp/.
//
//   load(rt, st)                    this warp reads the whole shared tile
//   load(rt, st, row0, col0)        this warp reads the rt-sized piece at (row0, col0)
//   load<G>(rt, st)                 warp w of group G reads rows [w*rt::rows, (w+1)*rt::rows)
//   store(st, rt) / store(st, rt, row0, col0) / store<G>(st, rt)    the reverse
//
// One ldmatrix.x4 fills a whole 16x16 bf16 fragment: lane l points at one 16-byte row of one of
// four 8x8 matrices, and each lane gets back exactly the pairs rt_base assigns it. For a col_l
// tile the .trans form reads the same rows and hands out columns. The swizzle never splits a
// 16-byte row, so each lane's address is simply st::addr(row, col) (hopper-facts §1.2, §3).
// Different dtypes (a bf16 tile into an fp32 register tile) go element pair by pair and convert.
#pragma once
#include "../../types/types.cuh"

namespace tk {
namespace detail {
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
#ifdef TK_SM90
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
#endif
// The row this lane addresses for ldmatrix/stmatrix .x4 over one 16x16 fragment, and its column.
// row_l: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = pairs q 0..3.
// col_l (.trans): matrix q must be the block at rows 8*(q>>1), cols 8*(q&1).
template <rt_layout L> __device__ __forceinline__ int x4_row(int lane) {
    if constexpr (std::same_as<L, row_l>) return lane % 16;
    else return 8 * ((lane / 8) >> 1) + lane % 8;
}
template <rt_layout L> __device__ __forceinline__ int x4_col(int lane) {
    if constexpr (std::same_as<L, row_l>) return 8 * (lane / 16);
    else return 8 * ((lane / 8) & 1);
}
// Pair q (h = 0, 1) of a fragment as two neighbours in memory: along a row for row_l, along a
// column for col_l; `second` is the (row, col) step from the first to the second element.
template <rt_layout L> inline constexpr int pair_step_r = std::same_as<L, row_l> ? 0 : 1;
template <rt_layout L> inline constexpr int pair_step_c = std::same_as<L, row_l> ? 1 : 0;
}  // namespace detail

// ---- shared tile -> register tile ----
template <register_tile RT, shared_tile ST>
__device__ inline void load(RT& dst, const ST& src, int row0, int col0) {
    static_assert(RT::rows <= ST::rows && RT::cols <= ST::cols, "load(rt, st): the register tile is larger than the shared tile");
    using L = typename RT::layout;
    using base = typename RT::base;
    const int lane = laneid();
    if constexpr (std::same_as<typename RT::dtype, typename ST::dtype> && is_16bit_v<typename RT::dtype>) {
#pragma unroll
        for (int i = 0; i < RT::height; i++)
#pragma unroll
            for (int j = 0; j < RT::width; j++) {
                uint32_t (&r)[4] = *reinterpret_cast<uint32_t(*)[4]>(dst.tiles[i][j].data);
                const uint32_t a = src.addr(row0 + 16 * i + detail::x4_row<L>(lane), col0 + 16 * j + detail::x4_col<L>(lane));
                if constexpr (std::same_as<L, row_l>) detail::ldmatrix_x4(a, r);
                else detail::ldmatrix_x4_trans(a, r);
            }
    } else {
        using S = typename ST::dtype;
#pragma unroll
        for (int i = 0; i < RT::height; i++)
#pragma unroll
            for (int j = 0; j < RT::width; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int r = row0 + 16 * i + base::row(q, 0), c = col0 + 16 * j + base::col(q, 0);
                    pair_t<S> p;
                    if constexpr (std::same_as<L, row_l>) p = *reinterpret_cast<const pair_t<S>*>(src.ptr(r, c));
                    else p = make_pair<pair_t<S>>(src(r, c), src(r + 1, c));
                    dst.tiles[i][j].data[q] = convert<typename RT::T2>(p);
                }
    }
}
template <scope G = warp, register_tile RT, shared_tile ST>
__device__ inline void load(RT& dst, const ST& src) {
    static_assert(ST::cols == RT::cols && ST::rows == RT::rows * G::warps,
                  "load<G>(rt, st): each warp of G loads rt::rows consecutive rows, so st::rows must be G::warps * rt::rows and the widths equal");
    load(dst, src, G::warpid() * RT::rows, 0);
}

// ---- register tile -> shared tile ----
template <shared_tile ST, register_tile RT>
__device__ inline void store(ST& dst, const RT& src, int row0, int col0) {
    static_assert(RT::rows <= ST::rows && RT::cols <= ST::cols, "store(st, rt): the register tile is larger than the shared tile");
    using L = typename RT::layout;
    using base = typename RT::base;
    const int lane = laneid();
#ifdef TK_SM90
    if constexpr (std::same_as<typename RT::dtype, typename ST::dtype> && is_16bit_v<typename RT::dtype>) {
#pragma unroll
        for (int i = 0; i < RT::height; i++)
#pragma unroll
            for (int j = 0; j < RT::width; j++) {
                const uint32_t (&r)[4] = *reinterpret_cast<const uint32_t(*)[4]>(src.tiles[i][j].data);
                const uint32_t a = dst.addr(row0 + 16 * i + detail::x4_row<L>(lane), col0 + 16 * j + detail::x4_col<L>(lane));
                if constexpr (std::same_as<L, row_l>) detail::stmatrix_x4(a, r);
                else detail::stmatrix_x4_trans(a, r);
            }
        return;
    }
#endif
    (void)lane;
    using S = typename ST::dtype;
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = row0 + 16 * i + base::row(q, 0), c = col0 + 16 * j + base::col(q, 0);
                const pair_t<S> p = convert<pair_t<S>>(src.tiles[i][j].data[q]);
                if constexpr (std::same_as<L, row_l>) {
                    *reinterpret_cast<pair_t<S>*>(dst.ptr(r, c)) = p;
                } else {
                    dst(r, c) = lo(p);
                    dst(r + 1, c) = hi(p);
                }
            }
}
template <scope G = warp, shared_tile ST, register_tile RT>
__device__ inline void store(ST& dst, const RT& src) {
    static_assert(ST::cols == RT::cols && ST::rows == RT::rows * G::warps,
                  "store<G>(st, rt): each warp of G stores rt::rows consecutive rows, so st::rows must be G::warps * rt::rows and the widths equal");
    store(dst, src, G::warpid() * RT::rows, 0);
}

// ---- shared vector <-> register vector (every lane reads what it holds; one copy writes) ----
template <register_vec RV, shared_vec SV>
__device__ inline void load(RV& dst, const SV& src) {
    static_assert(RV::length == SV::length, "load(rv, sv): lengths differ");
#pragma unroll
    for (int o = 0; o < RV::outer; o++)
#pragma unroll
        for (int i = 0; i < RV::inner; i++) dst.data[o][i] = convert<typename RV::dtype>(src[RV::index(o, i)]);
}
template <shared_vec SV, register_vec RV>
__device__ inline void store(SV& dst, const RV& src) {
    static_assert(RV::length == SV::length, "store(sv, rv): lengths differ");
    if (!RV::is_writer()) return;
#pragma unroll
    for (int o = 0; o < RV::outer; o++)
#pragma unroll
        for (int i = 0; i < RV::inner; i++) dst[RV::index(o, i)] = convert<typename SV::dtype>(src.data[o][i]);
}

}  // namespace tk

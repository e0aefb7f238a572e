// tk/ops/warp/mma.cuh: warp-level matrix multiply-accumulate on register tiles with
// mma.sync.m16n8k16 (bf16 or fp16 in, fp32 accumulate; sm_80+). Read after the memory files.
//
//   mma_AB  (d, a, b, c)   d = a   * b   + c    a: M x K row_l   b: K x N col_l
//   mma_ABt (d, a, b, c)   d = a   * b^T + c    a: M x K row_l   b: N x K row_l
//   mma_AtB (d, a, b, c)   d = a^T * b   + c    a: K x M col_l   b: K x N col_l
//   mma_AtBt(d, a, b, c)   d = a^T * b^T + c    a: K x M col_l   b: N x K row_l
//   mm_AB(d, a, b) etc.    the same with c = 0 (mm overwrites, mma accumulates)
//   d, c: fp32 row_l (M x N); d and c may be the same tile.
//
// Why all four are one instruction: the A fragment wants pairs along K, and a row_l M x K tile
// and a col_l K x M tile both hold exactly that (rt_base.cuh); the B fragment wants pairs along
// K for each n, which a col_l K x N and a row_l N x K tile both hold. So the variants differ only
// in which base tiles are paired up, never in registers. A wrong layout is a compile error.
#pragma once
#include "maps.cuh"

namespace tk {
namespace detail {
// One m16n8k16: d[16x8] = a[16x16] * b[16x8] + c, registers as in hopper-facts §1.1.
template <typename T>
__device__ __forceinline__ void mma16816(float2& d0, float2& d1, const pair_t<T> (&a)[4], const pair_t<T>& b0,
                                         const pair_t<T>& b1, const float2& c0, const float2& c1) {
    const uint32_t* A = reinterpret_cast<const uint32_t*>(a);
    const uint32_t B0 = *reinterpret_cast<const uint32_t*>(&b0), B1 = *reinterpret_cast<const uint32_t*>(&b1);
    if constexpr (std::same_as<T, bf16>) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                     : "=f"(d0.x), "=f"(d0.y), "=f"(d1.x), "=f"(d1.y)
                     : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B0), "r"(B1),
                       "f"(c0.x), "f"(c0.y), "f"(c1.x), "f"(c1.y));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                     : "=f"(d0.x), "=f"(d0.y), "=f"(d1.x), "=f"(d1.y)
                     : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B0), "r"(B1),
                       "f"(c0.x), "f"(c0.y), "f"(c1.x), "f"(c1.y));
    }
}
// One 16x16x16 step on base tiles: two m16n8k16, one per 8-column half of d.
// Pairs of d: 0 = (row g, cols 0-7), 1 = (row g+8, cols 0-7), 2 and 3 the same for cols 8-15.
// Pairs of b for output columns n = g: b[0] (k 0-7), b[2] (k 8-15); for n = g+8: b[1], b[3].
template <typename T, typename BA, typename BB>
__device__ __forceinline__ void mma_base(rt_base<float, row_l>& d, const BA& a, const BB& b, const rt_base<float, row_l>& c) {
    mma16816<T>(d.data[0], d.data[1], a.data, b.data[0], b.data[2], c.data[0], c.data[1]);
    mma16816<T>(d.data[2], d.data[3], a.data, b.data[1], b.data[3], c.data[2], c.data[3]);
}
// The shared loop: d[m][n] = c[m][n] + sum_k A(m, k) * B(k, n), with accessors picking base tiles.
template <bool a_transposed, bool b_transposed, typename D, typename A, typename B, typename C>
__device__ inline void mma_loop(D& d, const A& a, const B& b, const C& c) {
    using T = typename A::dtype;
    static_assert(std::same_as<T, typename B::dtype>, "mma: a and b must have the same dtype (bf16 or half)");
    constexpr int M = a_transposed ? A::width : A::height;
    constexpr int K = a_transposed ? A::height : A::width;
    constexpr int N = b_transposed ? B::height : B::width;
    constexpr int KB = b_transposed ? B::width : B::height;
    static_assert(K == KB, "mma: the inner (K) dimensions of a and b differ");
    static_assert(D::height == M && D::width == N && C::height == M && C::width == N,
                  "mma: d and c must be M x N, with M from a and N from b");
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int n = 0; n < N; n++)
#pragma unroll
            for (int k = 0; k < K; k++) {
                const auto& at = [&]() -> const auto& { if constexpr (a_transposed) return a.tiles[k][m]; else return a.tiles[m][k]; }();
                const auto& bt = [&]() -> const auto& { if constexpr (b_transposed) return b.tiles[n][k]; else return b.tiles[k][n]; }();
                mma_base<T>(d.tiles[m][n], at, bt, k == 0 ? c.tiles[m][n] : d.tiles[m][n]);
            }
}
}  // namespace detail

template <fp32_accumulator_tile D, row_layout_tile A, col_layout_tile B, fp32_accumulator_tile C>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mma_AB(D& d, const A& a, const B& b, const C& c) { detail::mma_loop<false, false>(d, a, b, c); }

template <fp32_accumulator_tile D, row_layout_tile A, row_layout_tile B, fp32_accumulator_tile C>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mma_ABt(D& d, const A& a, const B& b, const C& c) { detail::mma_loop<false, true>(d, a, b, c); }

template <fp32_accumulator_tile D, col_layout_tile A, col_layout_tile B, fp32_accumulator_tile C>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mma_AtB(D& d, const A& a, const B& b, const C& c) { detail::mma_loop<true, false>(d, a, b, c); }

template <fp32_accumulator_tile D, col_layout_tile A, row_layout_tile B, fp32_accumulator_tile C>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mma_AtBt(D& d, const A& a, const B& b, const C& c) { detail::mma_loop<true, true>(d, a, b, c); }

template <fp32_accumulator_tile D, row_layout_tile A, col_layout_tile B>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mm_AB(D& d, const A& a, const B& b) { zero(d); mma_AB(d, a, b, d); }

template <fp32_accumulator_tile D, row_layout_tile A, row_layout_tile B>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mm_ABt(D& d, const A& a, const B& b) { zero(d); mma_ABt(d, a, b, d); }

template <fp32_accumulator_tile D, col_layout_tile A, col_layout_tile B>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mm_AtB(D& d, const A& a, const B& b) { zero(d); mma_AtB(d, a, b, d); }

template <fp32_accumulator_tile D, col_layout_tile A, row_layout_tile B>
    requires mma_operand_tile<A> && mma_operand_tile<B>
__device__ inline void mm_AtBt(D& d, const A& a, const B& b) { zero(d); mma_AtBt(d, a, b, d); }

}  // namespace tk

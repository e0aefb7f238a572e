// tk/ops/warp/maps.cuh: elementwise maps over register tiles and register vectors, destination
// first: exp(dst, src), add(dst, a, b), mul(dst, a, 0.125f), zero(dst), ... Read after the memory
// files. Every op works on pairs (one register of a tile); the ops themselves are
// tk/common/base_ops.cuh. Scalars are floats and are converted to the tile's dtype once.
//
//   fills:    zero one pos_infty neg_infty fill(dst, value)
//   unary:    copy neg abs relu exp exp2 log log2 sqrt rsqrt        (dst, src)
//   binary:   add sub mul div max min     (dst, a, b) with b a tile/vector of the same type or a float
//   generic:  unary_map<Op>(dst, src), bin_map<Op>(dst, a, b)
#pragma once
#include "memory_async.cuh"

namespace tk {

template <typename T> concept register_obj = register_tile<T> || register_vec<T>;

// ---- generic maps ----
template <typename Op, register_tile RT> __device__ inline void unary_map(RT& dst, const RT& src) {
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) dst.tiles[i][j].data[q] = Op::template op<typename RT::T2>(src.tiles[i][j].data[q]);
}
template <typename Op, register_tile RT> __device__ inline void bin_map(RT& dst, const RT& a, const RT& b) {
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                dst.tiles[i][j].data[q] = Op::template op<typename RT::T2>(a.tiles[i][j].data[q], b.tiles[i][j].data[q]);
}
template <typename Op, register_tile RT> __device__ inline void bin_map(RT& dst, const RT& a, float b) {
    const typename RT::T2 b2 = constants<typename RT::T2>::from_float(b);
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) dst.tiles[i][j].data[q] = Op::template op<typename RT::T2>(a.tiles[i][j].data[q], b2);
}
template <typename Op, register_vec RV> __device__ inline void unary_map(RV& dst, const RV& src) {
#pragma unroll
    for (int o = 0; o < RV::outer; o++)
#pragma unroll
        for (int i = 0; i < RV::inner; i++) dst.data[o][i] = Op::template op<typename RV::dtype>(src.data[o][i]);
}
template <typename Op, register_vec RV> __device__ inline void bin_map(RV& dst, const RV& a, const RV& b) {
#pragma unroll
    for (int o = 0; o < RV::outer; o++)
#pragma unroll
        for (int i = 0; i < RV::inner; i++) dst.data[o][i] = Op::template op<typename RV::dtype>(a.data[o][i], b.data[o][i]);
}
template <typename Op, register_vec RV> __device__ inline void bin_map(RV& dst, const RV& a, float b) {
    const typename RV::dtype bs = convert<typename RV::dtype>(b);
#pragma unroll
    for (int o = 0; o < RV::outer; o++)
#pragma unroll
        for (int i = 0; i < RV::inner; i++) dst.data[o][i] = Op::template op<typename RV::dtype>(a.data[o][i], bs);
}

// ---- fills ----
template <register_obj R> __device__ inline void zero(R& dst) { unary_map<base_ops::zero>(dst, dst); }
template <register_obj R> __device__ inline void one(R& dst) { unary_map<base_ops::one>(dst, dst); }
template <register_obj R> __device__ inline void pos_infty(R& dst) { unary_map<base_ops::pos_infty>(dst, dst); }
template <register_obj R> __device__ inline void neg_infty(R& dst) { unary_map<base_ops::neg_infty>(dst, dst); }
// fill(dst, v): every element = v. Written as "b of (a, b)" so the same bin_map does it.
struct take_second { template <typename T> __device__ static T op(const T&, const T& b) { return b; } };
template <register_obj R> __device__ inline void fill(R& dst, float value) { bin_map<take_second>(dst, dst, value); }

// ---- unary ----
template <register_obj R> __device__ inline void copy(R& dst, const R& src) { unary_map<base_ops::copy>(dst, src); }
template <register_obj R> __device__ inline void neg(R& dst, const R& src) { unary_map<base_ops::neg>(dst, src); }
template <register_obj R> __device__ inline void abs(R& dst, const R& src) { unary_map<base_ops::abs>(dst, src); }
template <register_obj R> __device__ inline void relu(R& dst, const R& src) { unary_map<base_ops::relu>(dst, src); }
template <register_obj R> __device__ inline void exp(R& dst, const R& src) { unary_map<base_ops::exp>(dst, src); }
template <register_obj R> __device__ inline void exp2(R& dst, const R& src) { unary_map<base_ops::exp2>(dst, src); }
template <register_obj R> __device__ inline void log(R& dst, const R& src) { unary_map<base_ops::log>(dst, src); }
template <register_obj R> __device__ inline void log2(R& dst, const R& src) { unary_map<base_ops::log2>(dst, src); }
template <register_obj R> __device__ inline void sqrt(R& dst, const R& src) { unary_map<base_ops::sqrt>(dst, src); }
template <register_obj R> __device__ inline void rsqrt(R& dst, const R& src) { unary_map<base_ops::rsqrt>(dst, src); }

// ---- binary: b is a register object of the same type, or a float ----
template <register_obj R, typename B> __device__ inline void add(R& dst, const R& a, const B& b) { bin_map<base_ops::sum>(dst, a, b); }
template <register_obj R, typename B> __device__ inline void sub(R& dst, const R& a, const B& b) { bin_map<base_ops::sub>(dst, a, b); }
template <register_obj R, typename B> __device__ inline void mul(R& dst, const R& a, const B& b) { bin_map<base_ops::mul>(dst, a, b); }
template <register_obj R, typename B> __device__ inline void div(R& dst, const R& a, const B& b) { bin_map<base_ops::div>(dst, a, b); }
template <register_obj R, typename B> __device__ inline void max(R& dst, const R& a, const B& b) { bin_map<base_ops::max>(dst, a, b); }
template <register_obj R, typename B> __device__ inline void min(R& dst, const R& a, const B& b) { bin_map<base_ops::min>(dst, a, b); }

}  // namespace tk

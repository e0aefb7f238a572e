// tk/common/base_ops.cuh: the elementwise operations (exp, add, max, ...) as small structs with
// one static `op`, usable on any scalar or pair type. Read after base_types.cuh.
//
// Tile and vector maps (tk/ops/warp/maps.cuh), reductions and broadcasts all take one of these
// as a template argument: `unary_map<base_ops::exp>(dst, src)`. Each op computes in float and
// converts back, except where a native pair instruction exists (bf16_2/half_2 add, mul, ...),
// so the same op is exact for float tiles and rounds once for 16-bit tiles.
#pragma once
#include "base_types.cuh"

namespace tk {
namespace detail {
// Apply f (float -> float) to each element of a scalar or a pair of any type.
template <typename T, typename F> __device__ __forceinline__ T apply1(const T& x, F f) {
    if constexpr (std::is_same_v<T, float>) {
        return f(x);
    } else if constexpr (is_pair_v<T>) {
        float2 v = convert<float2>(x);
        return convert<T>(make_float2(f(v.x), f(v.y)));
    } else {
        return convert<T>(f(convert<float>(x)));
    }
}
// Apply f (float, float -> float) elementwise to two scalars or two pairs of the same type.
template <typename T, typename F> __device__ __forceinline__ T apply2(const T& a, const T& b, F f) {
    if constexpr (std::is_same_v<T, float>) {
        return f(a, b);
    } else if constexpr (is_pair_v<T>) {
        float2 x = convert<float2>(a), y = convert<float2>(b);
        return convert<T>(make_float2(f(x.x, y.x), f(x.y, y.y)));
    } else {
        return convert<T>(f(convert<float>(a), convert<float>(b)));
    }
}
}  // namespace detail

namespace base_ops {

// ---- fills: ignore the input, return a constant ----
struct zero      { template <typename T> __device__ static T op(const T&) { return constants<T>::zero(); } };
struct one       { template <typename T> __device__ static T op(const T&) { return constants<T>::one(); } };
struct pos_infty { template <typename T> __device__ static T op(const T&) { return constants<T>::pos_infty(); } };
struct neg_infty { template <typename T> __device__ static T op(const T&) { return constants<T>::neg_infty(); } };

// ---- unary ----
struct copy { template <typename T> __device__ static T op(const T& x) { return x; } };
struct neg  { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return -v; }); } };
struct abs  { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return fabsf(v); }); } };
struct relu { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return fmaxf(v, 0.0f); }); } };
// exp(x) = 2^(x*log2 e): one multiply and one ex2.approx (2 ulp), as in flash attention.
struct exp  { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return __expf(v); }); } };
struct exp2 { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return exp2f(v); }); } };
struct log  { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return __logf(v); }); } };
struct log2 { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return __log2f(v); }); } };
struct sqrt { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return sqrtf(v); }); } };
struct rsqrt { template <typename T> __device__ static T op(const T& x) { return detail::apply1(x, [](float v) { return rsqrtf(v); }); } };

// ---- binary ----
// bf16_2 / half_2 have native pair instructions for these (HADD2/HMUL2/HMNMX2 on sm_80+).
struct sum {
    template <typename T> __device__ static T op(const T& a, const T& b) {
        if constexpr (std::is_same_v<T, bf16_2> || std::is_same_v<T, half_2>) return __hadd2(a, b);
        else return detail::apply2(a, b, [](float x, float y) { return x + y; });
    }
};
using add = sum;
struct sub {
    template <typename T> __device__ static T op(const T& a, const T& b) {
        if constexpr (std::is_same_v<T, bf16_2> || std::is_same_v<T, half_2>) return __hsub2(a, b);
        else return detail::apply2(a, b, [](float x, float y) { return x - y; });
    }
};
struct mul {
    template <typename T> __device__ static T op(const T& a, const T& b) {
        if constexpr (std::is_same_v<T, bf16_2> || std::is_same_v<T, half_2>) return __hmul2(a, b);
        else return detail::apply2(a, b, [](float x, float y) { return x * y; });
    }
};
struct div {
    template <typename T> __device__ static T op(const T& a, const T& b) {
        return detail::apply2(a, b, [](float x, float y) { return x / y; });
    }
};
struct max {
    template <typename T> __device__ static T op(const T& a, const T& b) {
        if constexpr (std::is_same_v<T, bf16_2> || std::is_same_v<T, half_2>) return __hmax2(a, b);
        else return detail::apply2(a, b, [](float x, float y) { return fmaxf(x, y); });
    }
};
struct min {
    template <typename T> __device__ static T op(const T& a, const T& b) {
        if constexpr (std::is_same_v<T, bf16_2> || std::is_same_v<T, half_2>) return __hmin2(a, b);
        else return detail::apply2(a, b, [](float x, float y) { return fminf(x, y); });
    }
};

// identity<Op, T>(): the value that leaves Op unchanged (0 for sum, -inf for max, ...).
template <typename Op, typename T> __device__ __forceinline__ T identity() {
    if constexpr (std::is_same_v<Op, sum>) return constants<T>::zero();
    else if constexpr (std::is_same_v<Op, mul>) return constants<T>::one();
    else if constexpr (std::is_same_v<Op, max>) return constants<T>::neg_infty();
    else if constexpr (std::is_same_v<Op, min>) return constants<T>::pos_infty();
    else static_assert(sizeof(Op) == 0, "identity: this op has no identity (use sum, mul, max or min)");
}

}  // namespace base_ops
}  // namespace tk

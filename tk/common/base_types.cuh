// tk/common/base_types.cuh: the scalar types a tile can hold (float, bf16, half), their packed
// pairs (float2, bf16_2, half_2), conversions between all of them, and the constants we fill with.
// Read first in tk/common/; everything else builds on `packing`, `convert` and `constants`.
//
// Why pairs: a tensor-core fragment keeps two neighbouring elements in one 32-bit register
// (bf16/half) or one float2 (fp32), so every register tile stores pairs and ops work on pairs.
//
// No implicit bf16 <-> float conversions or bf16 operators are used anywhere in tk/: PyTorch
// builds extensions with -D__CUDA_NO_BFLOAT16_CONVERSIONS__ (and the half twins), so tk/ calls
// the explicit intrinsics only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

namespace tk {

using bf16 = __nv_bfloat16;
using bf16_2 = __nv_bfloat162;
using half = __half;
using half_2 = __half2;

// packing<T>: for a scalar or a pair type, its scalar, its pair, and how many scalars it holds.
template <typename T> struct packing;
template <> struct packing<float>  { using scalar = float; using pair = float2; static constexpr int num = 1; };
template <> struct packing<float2> { using scalar = float; using pair = float2; static constexpr int num = 2; };
template <> struct packing<bf16>   { using scalar = bf16;  using pair = bf16_2; static constexpr int num = 1; };
template <> struct packing<bf16_2> { using scalar = bf16;  using pair = bf16_2; static constexpr int num = 2; };
template <> struct packing<half>   { using scalar = half;  using pair = half_2; static constexpr int num = 1; };
template <> struct packing<half_2> { using scalar = half;  using pair = half_2; static constexpr int num = 2; };

template <typename T> using pair_t = typename packing<T>::pair;      // bf16 -> bf16_2
template <typename T> using scalar_t = typename packing<T>::scalar;  // bf16_2 -> bf16
template <typename T> inline constexpr bool is_pair_v = packing<T>::num == 2;
template <typename T> inline constexpr bool is_16bit_v =
    std::is_same_v<scalar_t<T>, bf16> || std::is_same_v<scalar_t<T>, half>;

// lo / hi: the element at the lower / higher column (or row) of a pair; make_pair builds one.
// In a 32-bit register of two 16-bit values, `lo` lives in the low 16 bits.
template <typename P> __device__ __forceinline__ scalar_t<P> lo(const P& p) { return p.x; }
template <typename P> __device__ __forceinline__ scalar_t<P> hi(const P& p) { return p.y; }
template <typename P> __device__ __forceinline__ P make_pair(scalar_t<P> a, scalar_t<P> b) {
    P p; p.x = a; p.y = b; return p;
}

// convert<To>(x): any scalar or pair type to any other of the same arity, round-to-nearest-even.
template <typename To, typename From> __device__ __forceinline__ To convert(const From& x) {
    static_assert(packing<To>::num == packing<From>::num, "convert: scalar <-> pair is not a conversion");
    if constexpr (std::is_same_v<To, From>) {
        return x;
    } else if constexpr (std::is_same_v<To, float2> && std::is_same_v<From, bf16_2>) {
        return __bfloat1622float2(x);
    } else if constexpr (std::is_same_v<To, float2> && std::is_same_v<From, half_2>) {
        return __half22float2(x);
    } else if constexpr (std::is_same_v<To, bf16_2> && std::is_same_v<From, float2>) {
        return __float22bfloat162_rn(x);             // one cvt.rn.bf16x2.f32 (hi operand first)
    } else if constexpr (std::is_same_v<To, half_2> && std::is_same_v<From, float2>) {
        return __float22half2_rn(x);
    } else if constexpr (is_pair_v<To>) {            // bf16_2 <-> half_2: through float2
        return convert<To>(convert<float2>(x));
    } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, bf16>) {
        return __bfloat162float(x);
    } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, half>) {
        return __half2float(x);
    } else if constexpr (std::is_same_v<To, bf16> && std::is_same_v<From, float>) {
        return __float2bfloat16_rn(x);
    } else if constexpr (std::is_same_v<To, half> && std::is_same_v<From, float>) {
        return __float2half_rn(x);
    } else {                                          // bf16 <-> half: through float
        return convert<To>(convert<float>(x));
    }
}

// pack two floats into a pair of any type (lo = a goes to the lower address / low 16 bits).
template <typename P> __device__ __forceinline__ P pack(float a, float b) {
    return convert<P>(make_float2(a, b));
}

// constants<T>: zero, one, +inf, -inf for scalars and pairs (pairs get the value twice).
template <typename T> struct constants {
    using S = scalar_t<T>;
    __device__ static __forceinline__ T from_float(float v) {
        if constexpr (is_pair_v<T>) return make_pair<T>(convert<S>(v), convert<S>(v));
        else return convert<T>(v);
    }
    __device__ static __forceinline__ T zero() { return from_float(0.0f); }
    __device__ static __forceinline__ T one() { return from_float(1.0f); }
    __device__ static __forceinline__ T pos_infty() { return from_float(__int_as_float(0x7f800000)); }
    __device__ static __forceinline__ T neg_infty() { return from_float(__int_as_float(0xff800000)); }
};

}  // namespace tk

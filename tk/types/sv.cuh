// tk/types/sv.cuh: shared vectors sv<T, N>, a plain 16-byte-aligned array in shared memory (row
// statistics, a layernorm weight, a softmax max). Read after st.cuh.
#pragma once
#include "st.cuh"

namespace tk {

template <typename T, int N> struct alignas(16) sv {
    static_assert(N % 16 == 0 && N > 0, "sv: length must be a positive multiple of 16");
    using identifier = detail::sv_tag;
    using dtype = T;
    static constexpr int length = N;
    static constexpr int bytes = N * int(sizeof(T));
    T data[N];
    __device__ T& operator[](int i) { return data[i]; }
    __device__ const T& operator[](int i) const { return data[i]; }
    __device__ uint32_t addr(int i) const { return smem_addr(data) + uint32_t(i * int(sizeof(T))); }
};

template <int N> using sv_bf = sv<bf16, N>;
template <int N> using sv_hf = sv<half, N>;
template <int N> using sv_fl = sv<float, N>;

}  // namespace tk

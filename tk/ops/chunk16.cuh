// tk/ops/chunk16.cuh: a 16-byte chunk of a row (8 bf16 or 4 float) moved between global memory
// and registers with ONE vector instruction each way. For memory-bound row kernels (layernorm,
// softmax, elementwise), where the whole game is wide, coalesced loads and stores.
// Read after tk/common/ (uses bf16, bf16_2 and convert from base_types.cuh).
//
//     tk::chunk16<bf16> c;
//     tk::load(c, x + col);          // one ld.global.nc.v4; (x + col) must be 16-byte aligned
//     float a = c[3];                // element 3 as float (exact: a bf16 is a float's top half)
//     float v[8] = ...;
//     tk::store(y + col, v);         // rounds to bf16 (nearest even), one st.global.v4
//
// A chunk keeps the 16 bytes as loaded (4 registers), not as floats (8 registers for bf16):
// kernels that hold several rows' worth of chunks while they reduce need the registers, and
// widening a bf16 to a float is one instruction, paid where the value is used.
//
// Alignment: 16-byte vector accesses need 16-byte-aligned addresses; a misaligned one is
// undefined (hopper-facts 11.2). Callers check the base pointer and keep the row pitch a
// multiple of 16 bytes.
#pragma once
#include "../common/base_types.cuh"

namespace tk {

template <typename T> struct chunk16 {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>, "chunk16: float or bf16");
    static constexpr int elems = 16 / sizeof(T);   // 4 floats or 8 bf16
    uint32_t word[4];                               // the 16 bytes, as in memory

    // Element e (0 = lowest address) as a float. Use with a compile-time e (unrolled loops) so
    // the word index resolves to a register.
    __device__ __forceinline__ float operator[](int e) const {
        if constexpr (std::is_same_v<T, float>) {
            return __uint_as_float(word[e]);
        } else {   // little-endian: the lower address is the low half of the 32-bit word
            const uint32_t w = word[e / 2];
            return __uint_as_float((e % 2) ? (w & 0xffff0000u) : (w << 16));
        }
    }
    __device__ __forceinline__ void zero() { word[0] = word[1] = word[2] = word[3] = 0u; }
};

// 16 bytes of global memory -> chunk. `__ldg`: the read-only path, for inputs a kernel never
// writes.
template <typename T> __device__ __forceinline__ void load(chunk16<T>& c, const T* src) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src));
    c.word[0] = raw.x; c.word[1] = raw.y; c.word[2] = raw.z; c.word[3] = raw.w;
}

// chunk16<T>::elems floats -> 16 bytes of global memory, rounded to T.
template <typename T> __device__ __forceinline__ void store(T* dst, const float (&v)[chunk16<T>::elems]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (std::is_same_v<T, float>) {
            w[i] = __float_as_uint(v[i]);
        } else {
            const bf16_2 p = convert<bf16_2>(make_float2(v[2 * i], v[2 * i + 1]));   // .x = lower address
            w[i] = *reinterpret_cast<const uint32_t*>(&p);
        }
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// v rounded to T and back: exactly the value a store of v would write. A kernel that computes
// from a value it also stores should compute from the rounded one.
template <typename T> __device__ __forceinline__ float round_to(float v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return convert<float>(convert<T>(v));
}

}  // namespace tk

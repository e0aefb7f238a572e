// tk/ops/chunk16.cuh: a chunk of a row (16 bytes: 8 bf16 or 4 float; or 8 bytes) moved
// between global memory and registers with ONE vector instruction each way. For memory-bound row
// kernels (layernorm, softmax, elementwise), where the whole game is wide, coalesced loads and
// stores. Read after tk/common/ (uses bf16, bf16_2 and convert from base_types.cuh).
//
//     tk::chunk16<bf16> c;           // = tk::chunk<bf16, 8>: 16 bytes
//     tk::load(c, x + col);          // one ld.global.nc.v4; (x + col) must be 16-byte aligned
//     float a = c[3];                // element 3 as float (exact: a bf16 is a float's top half)
//     float v[8] = ...;
//     tk::store(y + col, v);         // rounds to bf16 (nearest even), one st.global.v4
//
// The narrower chunk, tk::chunk<T, E> with E * sizeof(T) = 8 bytes, serves a tensor that walks
// beside a wider one: 4 bf16 columns next to 4 float columns of another tensor move in 8 bytes
// (ld.global.nc.v2), so the same thread covers the same columns of both.
//
// A chunk keeps the bytes as loaded (4 registers for 16 bytes), not as floats (8 registers for
// bf16): kernels that hold several rows' worth of chunks while they reduce need the registers,
// and widening a bf16 to a float is one instruction, paid where the value is used.
//
// Alignment: vector accesses need addresses aligned to their size; a misaligned one is undefined
// (hopper-facts 11.2). Callers check the base pointer and keep the row pitch a multiple of it.
#pragma once
#include "../common/base_types.cuh"

namespace tk {

template <typename T, int E> struct chunk {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>, "chunk: float or bf16");
    static constexpr int elems = E;                        // columns
    static constexpr int words = E * int(sizeof(T)) / 4;   // 32-bit registers
    static_assert(words == 4 || words == 2, "chunk: 16 or 8 bytes, one instruction");
    uint32_t word[words];                                  // the bytes, as in memory

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
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int i = 0; i < words; ++i) word[i] = 0u;
    }
};

// The usual chunk: 16 bytes, 8 bf16 or 4 floats.
template <typename T> using chunk16 = chunk<T, 16 / int(sizeof(T))>;

// Global memory -> chunk, one ld.global.nc.v4 / .v2. `__ldg`: the read-only path,
// for inputs a kernel never writes.
template <typename T, int E> __device__ __forceinline__ void load(chunk<T, E>& c, const T* src) {
    if constexpr (chunk<T, E>::words == 4) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src));
        c.word[0] = raw.x; c.word[1] = raw.y; c.word[2] = raw.z; c.word[3] = raw.w;
    } else {
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(src));
        c.word[0] = raw.x; c.word[1] = raw.y;
    }
}

// E floats -> E elements of global memory, rounded to T (nearest even), one vector store.
template <typename T, int E> __device__ __forceinline__ void store(T* dst, const float (&v)[E]) {
    constexpr int words = chunk<T, E>::words;
    uint32_t w[words];
#pragma unroll
    for (int i = 0; i < words; ++i) {
        if constexpr (std::is_same_v<T, float>) {
            w[i] = __float_as_uint(v[i]);
        } else {
            const bf16_2 p = convert<bf16_2>(make_float2(v[2 * i], v[2 * i + 1]));   // .x = lower address
            w[i] = *reinterpret_cast<const uint32_t*>(&p);
        }
    }
    if constexpr (words == 4) *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    else *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
}

// v rounded to T and back: exactly the value a store of v would write. A kernel that computes
// from a value it also stores should compute from the rounded one.
template <typename T> __device__ __forceinline__ float round_to(float v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return convert<float>(convert<T>(v));
}

}  // namespace tk

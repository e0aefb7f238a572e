// tests/attention_emu/tk/sm80_instructions.cuh: CPU emulation of tk/sm80_instructions.cuh, with
// the same names and the PTX fragment layouts (hopper-facts.md section 1) written out as loops.
#pragma once
#include <cstdint>
#include <cmath>
#include "cuda_runtime.h"
#include "cuda_bf16.h"

namespace tk::sm80 {

inline float bf16_lo(uint32_t r) { return __bfloat162float({uint16_t(r & 0xffff)}); }
inline float bf16_hi(uint32_t r) { return __bfloat162float({uint16_t(r >> 16)}); }

inline void ldmatrix_impl(uint32_t r[4], const void* row_address, bool trans) {
    uint64_t in = reinterpret_cast<uintptr_t>(row_address);
    if (in % 16) { fprintf(stderr, "ldmatrix: misaligned row address\n"); std::abort(); }
    emu::exchange(&in, 1, [&](uint64_t (*slot)[8]) {
        const int l = emu::lane;
        for (int j = 0; j < 4; ++j) {
            uint16_t lo, hi;
            if (!trans) {
                const uint16_t* row = reinterpret_cast<const uint16_t*>(slot[8 * j + l / 4][0]);
                lo = row[2 * (l % 4)];
                hi = row[2 * (l % 4) + 1];
            } else {
                lo = reinterpret_cast<const uint16_t*>(slot[8 * j + 2 * (l % 4)][0])[l / 4];
                hi = reinterpret_cast<const uint16_t*>(slot[8 * j + 2 * (l % 4) + 1][0])[l / 4];
            }
            r[j] = uint32_t(lo) | (uint32_t(hi) << 16);
        }
    });
}
inline void ldmatrix_x4(uint32_t r[4], const void* p) { ldmatrix_impl(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void* p) { ldmatrix_impl(r, p, true); }

// d (16x8) += a (16x16) b (16x8), fragments as in PTX: lane = 4g + t.
inline void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    uint64_t in[6] = {a[0], a[1], a[2], a[3], b0, b1};
    float out[4];
    emu::exchange(in, 6, [&](uint64_t (*slot)[8]) {
        auto A = [&](int row, int k) {  // reg (row/8) + 2 (k/8) of lane 4 (row%8) + (k%8)/2
            uint32_t r = (uint32_t)slot[4 * (row % 8) + (k % 8) / 2][(row / 8) + 2 * (k / 8)];
            return k % 2 ? bf16_hi(r) : bf16_lo(r);
        };
        auto B = [&](int k, int n) {  // reg k/8 of lane 4 n + (k%8)/2
            uint32_t r = (uint32_t)slot[4 * n + (k % 8) / 2][4 + k / 8];
            return k % 2 ? bf16_hi(r) : bf16_lo(r);
        };
        const int g = emu::lane / 4, t = emu::lane % 4;
        for (int i = 0; i < 4; ++i) {
            int row = g + 8 * (i / 2), col = 2 * t + i % 2;
            float acc = d[i];
            for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
            out[i] = acc;
        }
    });
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// cp.async done at once (the emulation cannot catch a missing wait; racecheck on the GPU can).
inline void cp_async_16(void* dst, const void* src, bool valid) {
    if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16) {
        fprintf(stderr, "cp.async: misaligned address\n");
        std::abort();
    }
    if (valid) std::memcpy(dst, src, 16); else std::memset(dst, 0, 16);
}
inline void cp_async_4(void* dst, const void* src, bool valid) {
    if (reinterpret_cast<uintptr_t>(dst) % 4 || reinterpret_cast<uintptr_t>(src) % 4) {
        fprintf(stderr, "cp.async: misaligned address\n");
        std::abort();
    }
    if (valid) std::memcpy(dst, src, 4); else std::memset(dst, 0, 4);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}

inline uint32_t pack_bf16x2(float lo, float hi) {
    return uint32_t(__float2bfloat16(lo).bits) | (uint32_t(__float2bfloat16(hi).bits) << 16);
}
inline float exp2_approx(float x) { return std::exp2(x); }

}  // namespace tk::sm80

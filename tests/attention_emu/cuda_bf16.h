// tests/attention_emu/cuda_bf16.h: host bf16 for the CPU emulation (round to nearest even).
#pragma once
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fc0};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {uint16_t(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = uint32_t(b.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {__float2bfloat16(lo), __float2bfloat16(hi)}; }
struct alignas(8) float2 { float x, y; };
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }

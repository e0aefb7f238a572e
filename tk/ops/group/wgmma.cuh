// tk/ops/group/wgmma.cuh — warpgroup matrix multiply (wgmma.mma_async, sm_90a): the 64-bit
// shared-memory matrix descriptors built from a shared tile's swizzle, fence / commit / wait,
// the instruction wrappers (A from shared memory or registers, B from shared memory) and the
// accumulator they fill. Read in order: descriptor, accumulator, fence/commit/wait, mma.
// Facts used (all checked bit-exact on our H200): shared/docs/hopper-facts.md §4 and §5.
#pragma once
#include <cstdint>
#include <type_traits>
#include "sync.cuh"

namespace tk::wgmma {

// ---------------------------------------------------------------------------------------------
// Descriptors. A shared tile here is `rows` x `cols` elements stored the way TMA writes it:
// column blocks of (swizzle_bytes / sizeof(T)) columns, each block rows x swizzle_bytes bytes,
// contiguous, swizzled, 1024-byte aligned (so the descriptor's base offset is 0).
// Such a tile can be read by wgmma two ways:
//  - K-major ("rows = M or N, cols = K"): the contraction index is contiguous (x, W in x·Wᵀ).
//    SBO = 8 rows x swizzle_bytes; LBO unused (1). k-step j starts 32·j bytes into the row.
//  - MN-major ("rows = K, cols = M or N"): the output index is contiguous (W in dy·W).
//    LBO = next column block (rows x swizzle_bytes); SBO = next 8 K-rows; k-step j = 16 rows.
// ---------------------------------------------------------------------------------------------
enum class major { K, MN };

// Swizzle code in the descriptor's bits 62-63. NOT the TMA enum (there 3 means 128B).
__host__ __device__ constexpr uint64_t swizzle_code(int swizzle_bytes) {
    return swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 3 : 0;
}

__device__ inline uint64_t make_desc(uint32_t start, uint32_t lbo, uint32_t sbo, int swizzle_bytes) {
    return uint64_t((start & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
           (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (swizzle_code(swizzle_bytes) << 62);
}

// Descriptor of the 64 (M) or N rows starting at `first` (row for K-major, column for MN-major)
// of a bf16 tile at shared address `base`, for k-step `k` (16 elements of K per step).
template <major M, int rows, int swizzle_bytes, typename T = uint16_t>
__device__ inline uint64_t desc(uint32_t base, int first, int k) {
    static_assert(swizzle_bytes == 32 || swizzle_bytes == 64 || swizzle_bytes == 128,
                  "wgmma tiles here are swizzled (32/64/128 B rows)");
    constexpr int esize = 2;  // bf16 / fp16
    if constexpr (M == major::K) {
        // k-step k starts k*32 bytes along the row; a row of one column block holds swizzle_bytes.
        int kb = k * 16 * esize;
        uint32_t start = base + (kb / swizzle_bytes) * rows * swizzle_bytes + (kb % swizzle_bytes)
                       + first * swizzle_bytes;
        return make_desc(start, 16, 8 * swizzle_bytes, swizzle_bytes);
    } else {
        // `first` is a column; columns come in blocks of swizzle_bytes/esize.
        int cb = first * esize;
        uint32_t start = base + (cb / swizzle_bytes) * rows * swizzle_bytes + (cb % swizzle_bytes)
                       + k * 16 * swizzle_bytes;
        return make_desc(start, rows * swizzle_bytes, 8 * swizzle_bytes, swizzle_bytes);
    }
}

// The same for a shared tile S (tk::st): its swizzle and row count come from the type. `first`
// is the first row (K-major) or column (MN-major) of the 64 or N rows/columns this wgmma reads.
template <major M, typename S>
__device__ inline uint64_t desc(const S& tile, int first, int k) {
    static_assert(std::is_same_v<typename S::dtype, bf16>,
                  "the wgmma wrappers below issue bf16 instructions: a tile of another type would be read as bf16");
    return desc<M, S::rows, S::swizzle_bytes>(smem_addr(&tile), first, k);
}

// ---------------------------------------------------------------------------------------------
// The accumulator of one m64nNk16 wgmma: N/2 floats per thread. Thread tid of the warpgroup
// (w = tid/32, g = lane/4, t = lane%4) holds element i at
//     row = 16w + g + 8·((i>>1)&1),   col = 8·(i>>2) + 2t + (i&1)
// i.e. each warp owns 16 rows, laid out like mma.sync's m16n8 C fragment per 8-column block.
// ---------------------------------------------------------------------------------------------
template <int N>
struct accumulator {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma N is a multiple of 8 up to 256");
    static constexpr int cols = N;
    float d[N / 2];
    __device__ static inline int row(int i) { int tid = threadIdx.x % 128;
        return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((i >> 1) & 1); }
    __device__ static inline int col(int i) { return 8 * (i >> 2) + 2 * (threadIdx.x % 4) + (i & 1); }
};

// Keep the compiler from moving reads/writes of the accumulator across the async region
// (reading it before wait() is undefined). Empty asm that "uses and redefines" every register.
template <int N>
__device__ inline void fence_operand(accumulator<N>& acc) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(acc.d[i]) :: "memory");
}

// wgmma.fence before the first wgmma and whenever registers it uses were touched by others.
__device__ inline void fence() {
#ifdef TK_HOPPER
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
// Close the group of wgmmas issued so far.
__device__ inline void commit_group() {
#ifdef TK_HOPPER
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Wait until at most `pending` committed groups are still running.
template <int pending = 0>
__device__ inline void wait_group() {
#ifdef TK_HOPPER
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(pending) : "memory");
#endif
}

// ---------------------------------------------------------------------------------------------
// The instructions: m64nNk16, bf16 inputs, fp32 accumulators. scale_d = 0 overwrites D (use it
// on the first k-step instead of zeroing registers), 1 accumulates. trans = 1 means MN-major.
// (Generated operand lists: one accumulator register per "+f".)
// ---------------------------------------------------------------------------------------------
template <int N, int trans_a, int trans_b> struct wgmma_op {
    static_assert(N == 32 || N == 64 || N == 128 || N == 256,
                  "tk wraps wgmma m64nNk16 for N = 32, 64, 128 and 256: use one of those (or add its operand list below)");
};

template <int trans_a, int trans_b>
struct wgmma_op<32, trans_a, trans_b> {
    __device__ static inline void ss(float (&d)[16], uint64_t a_desc, uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"
            " %16, %17, p, 1, 1, %19, %20;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(trans_a), "n"(trans_b));
#endif
    }
    __device__ static inline void rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"
            " {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(trans_b));
#endif
    }
};

template <int trans_a, int trans_b>
struct wgmma_op<64, trans_a, trans_b> {
    __device__ static inline void ss(float (&d)[32], uint64_t a_desc, uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
            " %32, %33, p, 1, 1, %35, %36;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(trans_a), "n"(trans_b));
#endif
    }
    __device__ static inline void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
            " {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(trans_b));
#endif
    }
};

template <int trans_a, int trans_b>
struct wgmma_op<128, trans_a, trans_b> {
    __device__ static inline void ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
            " %64, %65, p, 1, 1, %67, %68;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(trans_a), "n"(trans_b));
#endif
    }
    __device__ static inline void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
            " {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(trans_b));
#endif
    }
};

template <int trans_a, int trans_b>
struct wgmma_op<256, trans_a, trans_b> {
    __device__ static inline void ss(float (&d)[128], uint64_t a_desc, uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"
            " %128, %129, p, 1, 1, %131, %132;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
            : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(trans_a), "n"(trans_b));
#endif
    }
    __device__ static inline void rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
#ifdef TK_HOPPER
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"
            " {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(trans_b));
#endif
    }
};

// A (64 x 16, from shared memory) times B (16 x N, from shared memory), one k-step.
template <major MajA, major MajB, int N>
__device__ inline void mma_ss(accumulator<N>& acc, uint64_t a_desc, uint64_t b_desc, int scale_d) {
    wgmma_op<N, MajA == major::MN, MajB == major::MN>::ss(acc.d, a_desc, b_desc, scale_d);
}
// A from registers (the mma.sync A fragment of each warp's 16 rows), B from shared memory.
template <major MajB, int N>
__device__ inline void mma_rs(accumulator<N>& acc, const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
    wgmma_op<N, 0, MajB == major::MN>::rs(acc.d, a, b_desc, scale_d);
}

}  // namespace tk::wgmma

// tk/sm80_instructions.cuh: the raw warp-level instructions of sm_80+ tensor-core code, one
// small inline function each: ldmatrix, mma.sync m16n8k16 (bf16 -> fp32), cp.async with
// zero-fill (16 and 4 bytes), bf16x2 packing and ex2. Read it top to bottom; fragment layouts are in
// shared/docs/hopper-facts.md section 1 (all of them verified on our H200).
//
// These are the instructions themselves, not tiles: kernels that want whole register/shared
// tiles use tk's rt/st types; kernels written at fragment level (kernels/attention_portable.cu)
// use these directly. Runs on sm_80, sm_86, sm_89 and sm_90.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

namespace tk::sm80 {

// Shared-memory address of a generic pointer, as the 32-bit operand PTX wants.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- ldmatrix: four 8x8 b16 matrices from shared memory into registers -----------------
// Lane l gives the address of one 16-byte row: lanes 8j..8j+7 the rows of matrix j.
// Without .trans, register j of lane l holds row l/4 of matrix j, columns 2(l%4), 2(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row_address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row_address)));
}
// With .trans each matrix is read column-major: lane l gets (row 2(l%4), col l/4) and
// (row 2(l%4)+1, col l/4), which is the B fragment of a K x N matrix stored N-contiguous.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row_address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row_address)));
}

// ---- mma.sync m16n8k16: d = a (16x16 bf16) * b (16x8 bf16) + d (16x8 fp32) ---------------
// Lane l = 4g + t holds a: rows g, g+8, cols 2t.., 2t+8..; b: k rows 2t.., 2t+8.., col g;
// d: rows g (d[0], d[1]) and g+8 (d[2], d[3]), cols 2t and 2t+1.
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- cp.async: 16 bytes global -> shared without passing through registers -------------
// valid == false copies nothing and fills the 16 bytes with zeros (src must still be a legal
// address): this is how sequence tails are masked without padding the tensors.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* global_src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_u32(smem_dst)), "l"(global_src), "r"(valid ? 16 : 0));
}
// The same for 4 bytes (one float), through L1 (.ca: only .ca takes sizes below 16).
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* global_src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_u32(smem_dst)), "l"(global_src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N of this thread's committed groups are still in flight. Other threads
// see the data only after a __syncthreads() that follows their own wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// ---- numerics -------------------------------------------------------------------------
// Two floats -> one register of two bf16, `lo` in the low half (the lower column).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
// 2^x in one instruction (ex2.approx, 2 ulp); 2^-inf = +0.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace tk::sm80

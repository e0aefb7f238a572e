// tk/ops/group/tma_4d.cuh — TMA over a 4-D tensor with arbitrary strides: the tensor map for a
// (batch, heads, seq, dim) view whose last dimension is contiguous but whose other strides are
// whatever they are (q, k, v sliced straight out of a packed (B, T, 3, H, D) qkv tensor, or an
// output written as (B, T, H, D)), and the one-box load that reads from it.
// Read in order: make_bhtd_tensor_map (host), load_box_4d (device).
// Facts: shared/docs/hopper-facts.md §7 (strides multiple of 16 B, base 16-B aligned, box inner
// bytes <= swizzle span, out-of-range elements of a box read as zero; expect the FULL box bytes).
//
// Why 4-D and not 2-D: the map's dimensions are {dim, seq, heads, batch} (innermost first), so a
// box of `rows` sequence positions that runs past the end of the sequence reads zeros instead of
// the next head's rows. That is what lets a kernel handle any sequence length without padding.
#pragma once
#include <cstdint>
#include <string>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include "sync.cuh"
#include "../../types/global.cuh"   // tk::tensor_map_encoder()

namespace tk::tma {

// Host: the map of a bf16 tensor of logical shape (batch, heads, seq, dim), element strides
// (stride_batch, stride_head, stride_seq, 1), moved in boxes of `box_rows` sequence positions
// by 64 dims (128 bytes, 128B swizzle: exactly one swizzle span per row). A tile with dim = 128
// is moved as two boxes, at dim offsets 0 and 64.
// Returns an empty string on success, else what is wrong (the caller turns it into an error).
inline std::string make_bhtd_tensor_map(CUtensorMap* map, const void* data, int batch, int heads,
                                        int seq, int dim, int64_t stride_batch, int64_t stride_head,
                                        int64_t stride_seq, int box_rows) {
    constexpr int64_t esize = 2;  // bf16
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0)
        return "the tensor's data pointer must be 16-byte aligned";
    // A dimension of size 1 is never stepped over, so its stride is irrelevant (torch may report
    // anything there); give TMA a harmless legal value.
    int64_t strides[3] = {stride_seq, stride_head, stride_batch};
    int64_t sizes[3] = {seq, heads, batch};
    for (int i = 0; i < 3; ++i) {
        if (sizes[i] == 1) strides[i] = 16 / esize;
        if (strides[i] <= 0 || (strides[i] * esize) % 16 != 0 || strides[i] * esize >= (int64_t(1) << 40))
            return "every stride (batch, head, seq) must be positive and a multiple of 8 elements (16 bytes)";
    }
    cuuint64_t dims[4] = {cuuint64_t(dim), cuuint64_t(seq), cuuint64_t(heads), cuuint64_t(batch)};
    cuuint64_t byte_strides[3] = {cuuint64_t(strides[0] * esize), cuuint64_t(strides[1] * esize),
                                  cuuint64_t(strides[2] * esize)};
    cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
    cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    PFN_cuTensorMapEncodeTiled_v12000 encode;
    try { encode = tensor_map_encoder(); } catch (const std::exception& e) { return e.what(); }
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(data), dims,
                        byte_strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return "cuTensorMapEncodeTiled refused the tensor (CUresult " + std::to_string(int(r)) + ")";
    return "";
}

// Device, one thread: copy the box at element coordinates (d, t, h, b) into shared memory at
// `dst` (1024-byte aligned for the 128B swizzle), completing on `bar` (whose phase the caller
// announced with mbar::arrive_expect_bytes, full box bytes).
__device__ inline void load_box_4d(uint32_t dst, const CUtensorMap* map, int d, int t, int h, int b,
                                   mbarrier& bar) {
#ifdef TK_SM90
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];"
                 :: "r"(dst), "l"(map), "r"(d), "r"(t), "r"(h), "r"(b), "r"(smem_addr(&bar)) : "memory");
#endif
}

}  // namespace tk::tma

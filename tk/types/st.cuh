// tk/types/st.cuh: shared tiles st<T, rows, cols>, stored in the swizzled layout that TMA writes
// and wgmma reads, so the same tile feeds ldmatrix, cp.async, TMA and wgmma. Read after rt.cuh.
//
// Why swizzle: 32 banks x 4 bytes. In a plain row-major tile with 128-byte rows, the same
// 16-byte column chunk of 8 consecutive rows sits in the same 4 banks, so an ldmatrix that reads
// 8 rows of one chunk is an 8-way bank conflict. Swizzling XORs the chunk index with the row:
//
//   128B mode: chunk c of row r (r = 0..7 in each 1024 B atom) is stored at chunk c ^ r
//        row 0:  0 1 2 3 4 5 6 7
//        row 1:  1 0 3 2 5 4 7 6
//        row 2:  2 3 0 1 6 7 4 5      every column of chunks now meets 8 different bank groups
//        ...
//
// The layout (hopper-facts §3): the swizzle width S is the largest of 128/64/32 bytes dividing a
// row (cols*sizeof(T)). The tile is cut into column blocks S bytes wide; each block is stored as
// rows x S bytes, contiguously, blocks one after another. Inside, with o the byte offset from the
// tile base, physical = o ^ (((o >> 7) & m) << 4), m = 7, 3, 1 for S = 128, 64, 32 (CuTe's
// Swizzle<3|2|1,4,3>). Only 16-byte chunks move, so 8 consecutive bf16 of a row stay together.
//
// The tile must start on the swizzle's repeat (8*S bytes: 1024 for 128B) for TMA and wgmma to
// agree with this formula; alignas does that for static __shared__ tiles, shared_allocator for
// dynamic ones. Rows must be a multiple of 8 (we ask 16) so blocks start on a repeat too.
#pragma once
#include "rt.cuh"

namespace tk {

template <typename T, int R, int C> struct st_swizzle {
    static constexpr int row_bytes = C * int(sizeof(T));
    static constexpr int bytes = row_bytes % 128 == 0 ? 128 : row_bytes % 64 == 0 ? 64 : 32;
    static_assert(row_bytes % 32 == 0, "st: a row must be a multiple of 32 bytes (16 bf16 or 8 floats)");
};

template <typename T, int R, int C>
struct alignas(8 * st_swizzle<T, R, C>::bytes) st {
    static_assert(R % 16 == 0 && C % 16 == 0 && R > 0 && C > 0, "st: rows and cols must be positive multiples of 16");
    using identifier = detail::st_tag;
    using dtype = T;
    static constexpr int rows = R, cols = C;
    static constexpr int num_elements = R * C;
    static constexpr int bytes = R * C * int(sizeof(T));
    static constexpr int swizzle_bytes = st_swizzle<T, R, C>::bytes;   // 32, 64 or 128
    static constexpr int swizzle_repeat = 8 * swizzle_bytes;            // alignment the tile needs
    static constexpr int block_cols = swizzle_bytes / int(sizeof(T));  // columns per swizzle block
    static constexpr int num_blocks = C / block_cols;
    static constexpr int block_bytes = R * swizzle_bytes;               // one column block

    T data[R * C];

    // Byte offset of element (r, c) from the tile base: the swizzle formula above.
    __host__ __device__ static constexpr uint32_t offset(int r, int c) {
        const uint32_t o = uint32_t((c / block_cols) * block_bytes + r * swizzle_bytes + (c % block_cols) * int(sizeof(T)));
        return o ^ (((o >> 7) & uint32_t(swizzle_bytes / 16 - 1)) << 4);
    }
    __device__ T* ptr(int r, int c) { return reinterpret_cast<T*>(reinterpret_cast<char*>(data) + offset(r, c)); }
    __device__ const T* ptr(int r, int c) const {
        return reinterpret_cast<const T*>(reinterpret_cast<const char*>(data) + offset(r, c));
    }
    __device__ T& operator()(int r, int c) { return *ptr(r, c); }
    __device__ const T& operator()(int r, int c) const { return *ptr(r, c); }
    // Shared-window address of element (r, c), for ldmatrix/stmatrix/cp.async operands.
    __device__ uint32_t addr(int r, int c) const { return smem_addr(data) + offset(r, c); }
};

template <int R, int C> using st_bf = st<bf16, R, C>;
template <int R, int C> using st_hf = st<half, R, C>;
template <int R, int C> using st_fl = st<float, R, C>;

}  // namespace tk

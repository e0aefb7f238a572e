// tk/types/global.cuh — gl, the global-memory view a kernel receives: a pointer, its dimensions
// (each fixed at compile time or given at run time) and the TMA descriptors (CUtensorMap) for
// the shared-tile shapes the kernel will move, built once on the host. Pass it to the kernel as
// `const __grid_constant__`, so the descriptors stay in parameter space (hopper-facts §7.3).
// Read in order: tma_tile (what a tile must say about itself), dim, gl, make_tensor_map.
//
// Layout: row-major [batch][rows][cols]; cols contiguous. The TMA map is 3-D
// {cols, rows, batch}, so a box never runs into the next batch entry: out-of-range rows and
// columns read as zero and are dropped on store. Tile coordinates are in units of the tile.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <cuda.h>            // CUtensorMap and its enums (types only: we do not link -lcuda)
#include <cudaTypedefs.h>    // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tk {

// What gl needs to know about a shared tile to build its TMA box: element type, shape, and the
// swizzle it is stored with. A tile wider than its swizzle span (e.g. 128 bf16 with 128B
// swizzle) is stored as column blocks of swizzle_bytes each; TMA moves it one block (box) at a time.
template <typename S>
concept tma_tile = requires {
    typename S::dtype;
    { S::rows } -> std::convertible_to<int>;
    { S::cols } -> std::convertible_to<int>;
    { S::swizzle_bytes } -> std::convertible_to<int>;
};

template <tma_tile S>
struct tma_box {
    static constexpr int esize = sizeof(typename S::dtype);
    static constexpr int cols = S::swizzle_bytes ? S::swizzle_bytes / esize : S::cols;  // per box
    static constexpr int rows = S::rows;
    static constexpr int blocks = S::cols / cols;                   // boxes per tile
    static constexpr int block_bytes = rows * cols * esize;         // bytes of one box in smem
    static constexpr int bytes = S::rows * S::cols * esize;         // what expect_bytes announces
    static_assert(S::cols % cols == 0, "tile width must be a whole number of swizzle blocks");
    static_assert(rows <= 256 && cols <= 256, "a TMA box is at most 256 elements per dimension");
    static_assert((cols * esize) % 16 == 0, "a TMA box row is a multiple of 16 bytes");
};

// A dimension known at compile time (N > 0) or at run time (N = runtime).
inline constexpr int runtime = -1;
template <int N> struct dim {
    static_assert(N > 0, "a compile-time dimension is positive");
    __host__ __device__ constexpr dim(int = N) {}
    __host__ __device__ constexpr operator int() const { return N; }
};
template <> struct dim<runtime> {
    int value;
    __host__ __device__ constexpr dim(int v = 0) : value(v) {}
    __host__ __device__ constexpr operator int() const { return value; }
};

template <typename T> constexpr CUtensorMapDataType tma_dtype() {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    else if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    else if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    else static_assert(sizeof(T) == 0, "TMA maps here cover bf16, fp16 and fp32");
}

// The driver's encoder, fetched through the runtime so nothing links -lcuda (hopper-facts §7.1).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult status{};
        cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                           cudaEnableDefault, &status);
        if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || !p)
            throw std::runtime_error("tk: cuTensorMapEncodeTiled is not available from the driver");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// Build the TMA descriptor for moving tiles of type S in/out of a [batch][rows][cols] tensor.
template <typename T, tma_tile S>
inline CUtensorMap make_tensor_map(const T* data, int batch, int rows, int cols) {
    static_assert(std::is_same_v<typename S::dtype, T>, "tile and global view hold different types");
    using box = tma_box<S>;
    CUtensorMap map{};
    cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(batch)};
    cuuint64_t strides[2] = {cuuint64_t(cols) * sizeof(T), cuuint64_t(rows) * cols * sizeof(T)};
    cuuint32_t box_dims[3] = {cuuint32_t(box::cols), cuuint32_t(box::rows), 1};
    cuuint32_t elem_strides[3] = {1, 1, 1};
    CUtensorMapSwizzle swz = S::swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                           : S::swizzle_bytes == 64  ? CU_TENSOR_MAP_SWIZZLE_64B
                           : S::swizzle_bytes == 32  ? CU_TENSOR_MAP_SWIZZLE_32B
                                                     : CU_TENSOR_MAP_SWIZZLE_NONE;
    CUresult r = tensor_map_encoder()(&map, tma_dtype<T>(), 3, const_cast<T*>(data), dims, strides,
                                      box_dims, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw std::runtime_error("tk: cuTensorMapEncodeTiled failed (error " + std::to_string(int(r)) +
            "): the base must be 16-byte aligned and each row a multiple of 16 bytes; got rows=" +
            std::to_string(rows) + " cols=" + std::to_string(cols));
    return map;
}

template <typename Needle, typename... Hay> struct index_of;
template <typename Needle, typename... Rest> struct index_of<Needle, Needle, Rest...> { static constexpr int value = 0; };
template <typename Needle, typename First, typename... Rest> struct index_of<Needle, First, Rest...> {
    static constexpr int value = 1 + index_of<Needle, Rest...>::value;
};
template <typename Needle> struct index_of<Needle> {
    static_assert(sizeof(Needle) == 0, "this gl carries no TMA map for that tile type: list it in gl<..., Tiles>");
};

// gl<T, Rows, Cols, Tiles...>: Rows/Cols = runtime or a fixed size; one TMA map per tile type.
template <typename T, int Rows, int Cols, tma_tile... Tiles>
struct gl {
    using dtype = T;
    T* data;
    int batch;
    dim<Rows> rows;
    dim<Cols> cols;
    CUtensorMap maps[sizeof...(Tiles) > 0 ? sizeof...(Tiles) : 1];

    __host__ gl(T* data_, int batch_, int rows_, int cols_) : data(data_), batch(batch_), rows(rows_), cols(cols_) {
        if ((Rows != runtime && rows_ != Rows) || (Cols != runtime && cols_ != Cols))
            throw std::runtime_error("tk::gl: dimensions differ from the compile-time ones");
        int i = 0;
        ((maps[i++] = make_tensor_map<T, Tiles>(data_, batch_, rows_, cols_)), ...);
    }
    // The descriptor for tiles of type S (a generic address, as the TMA instructions take it).
    template <tma_tile S>
    __host__ __device__ const CUtensorMap* tma() const { return &maps[index_of<S, Tiles...>::value]; }

    __host__ __device__ T& operator()(int b, int r, int c) const {
        return data[(size_t(b) * int(rows) + r) * int(cols) + c];
    }
};

}  // namespace tk

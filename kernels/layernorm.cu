// kernels/layernorm.cu: fused residual add + LayerNorm on tk, forward and backward.
//
//   forward   h = x + r                         (r optional; without it h is x and is not written)
//             y = (h - mean) * rstd * w + b     mean, rstd = 1/sqrt(var + eps) saved per row, fp32
//   backward  xhat = (h - mean) * rstd,  g = dy * w
//             dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//             dh_out = dh + dx                  h also feeds the residual stream, whose gradient
//                                               dh arrives here; dh_out is the grad of x and of r
//             dw = sum over rows of dy * xhat,  db = sum over rows of dy
//
// THE LESSON: this op is memory-bound. Per element the forward does about ten flops and moves
// 8 bytes (bf16 x and r in, h and y out). The H200 does ~67 fp32 TFLOP/s but moves ~4.2 TB/s,
// so the time is bytes / bandwidth, and the whole plan is (1) touch every byte once and
// (2) keep enough loads in flight to hide DRAM latency:
//   - One read, one write. A row of 768 bf16 (1.5 KB) fits in ONE warp's registers, 24 floats
//     a lane. We read x and r once, keep the row in registers for both reductions (mean, then
//     the variance from the same registers: the stable two-pass formula without a second read),
//     and write h and y once. The backward reads h, dy and dh once and writes dh_out once:
//     8 passes over the tensor in all, which is the floor.
//   - Where the reductions happen: in each thread's registers, then across the warp with five
//     butterfly shuffles (tk::warp_sum), and only for wide rows (G = 2..8 warps per row, so no
//     lane holds more than 32 elements) across warps through a few floats of shared memory.
//     No atomics anywhere: results are bitwise reproducible run to run.
//   - 16-byte vector loads and stores (tk::chunk16): 8 bf16 per instruction, consecutive threads
//     on consecutive 16 bytes, so one warp instruction moves 512 contiguous bytes.
//   - Parameters (w, b, dw, db) are fp32 or bf16 as the caller has them: converted on load and
//     store, never by extra passes.
//   - dw and db are sums over ALL rows. Each thread adds up its own columns over every row its
//     warp visits (a persistent grid of ~2 blocks per SM), the block adds its row groups' sums
//     in shared memory and writes one fp32 row of partials, and a second tiny kernel adds the
//     partials column by column: ~2 MB of extra traffic next to hundreds of MB.
//
// Read in this order: RowGroup (who holds which columns), group_sum, forward_kernel,
// backward_kernel, column_sum_kernel, then the launchers at the bottom (grid sizing, dispatch).
#include "layernorm.h"
#include "tk/common/common.cuh"
#include "tk/ops/chunk16.cuh"

namespace tk_layernorm {
namespace {

using tk::bf16;
using tk::chunk16;

constexpr int BLOCK_WARPS = 8;
constexpr int BLOCK_THREADS = BLOCK_WARPS * 32;
constexpr int MAX_CHUNKS = 4;   // 16-byte chunks per thread per row: at most 32 bf16 or 16 floats

// A block's 8 warps split into row groups of G warps; each group normalizes one row at a time,
// so a block steps over 8/G rows at once. Thread t of a group holds chunks t, t + 32G,
// t + 64G, ... of the row: at each step the group's threads cover a contiguous span (coalesced).
struct RowGroup {
    int G;               // warps per row: 1 for C <= 1024 (bf16), up to 8 for C = 4096 fp32
    int threads;         // 32 * G
    int t;               // this thread's rank in its group
    int slot;            // which of the block's rows (0 .. 8/G - 1) this group takes
    int rows_per_step;   // 8 / G
    int chunks;          // 16-byte chunks in a row: cols / elems
    __device__ RowGroup(int G_, int chunks_)
        : G(G_), threads(32 * G_), t(threadIdx.x % (32 * G_)), slot(threadIdx.x / (32 * G_)),
          rows_per_step(BLOCK_WARPS / G_), chunks(chunks_) {}
    __device__ bool has(int i) const { return t + i * threads < chunks; }   // chunk i exists?
    __device__ int col(int i, int elems) const { return (t + i * threads) * elems; }
};

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float2 add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }

// The sum of v over the row group's G warps, returned to every thread of the group. Every thread
// of the block must call it at the same time: with G > 1 it crosses warps through shared memory
// and __syncthreads. Each thread adds the G warp sums in the same order, so all agree exactly.
template <typename V> __device__ V group_sum(V v, const RowGroup& g, V* scratch /* [BLOCK_WARPS] */) {
    v = tk::warp_sum(v);
    if (g.G == 1) return v;
    if (tk::laneid() == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    V total = scratch[g.slot * g.G];
    for (int w = 1; w < g.G; ++w) total = add(total, scratch[g.slot * g.G + w]);
    __syncthreads();   // scratch is reused by the next call
    return total;
}

// weight or bias for the E columns of one chunk, widened to float. Parameters are fp32 or bf16
// (one runtime flag, the same for every thread: no divergence, no extra template instances).
// Every row reads the same few KB, so after the first row they come from L1, not DRAM.
template <int E> __device__ __forceinline__ void load_params(float (&p)[E], const void* src, int col, bool is_bf16) {
    if (is_bf16) {   // E bf16 = E/2 words; the lower column is the low half of each word
        const uint32_t* s = reinterpret_cast<const uint32_t*>(static_cast<const bf16*>(src) + col);
#pragma unroll
        for (int j = 0; j < E / 2; ++j) {
            const uint32_t word = __ldg(s + j);
            p[2 * j] = __uint_as_float(word << 16);
            p[2 * j + 1] = __uint_as_float(word & 0xffff0000u);
        }
    } else {
        const float4* s = reinterpret_cast<const float4*>(static_cast<const float*>(src) + col);
#pragma unroll
        for (int j = 0; j < E / 4; ++j) {
            const float4 q = __ldg(s + j);
            p[4 * j] = q.x; p[4 * j + 1] = q.y; p[4 * j + 2] = q.z; p[4 * j + 3] = q.w;
        }
    }
}

// ---- forward: one read of x and r, one write of h and y ----------------------------------------
template <typename T, int CHUNKS>
__global__ void __launch_bounds__(BLOCK_THREADS)
forward_kernel(const T* __restrict__ x, const T* __restrict__ r, const void* __restrict__ w,
               const void* __restrict__ b, bool params_bf16, T* __restrict__ y, T* __restrict__ h,
               float* __restrict__ mean_out, float* __restrict__ rstd_out,
               int64_t rows, int cols, int G, float eps) {
    constexpr int E = chunk16<T>::elems;
    __shared__ float scratch[BLOCK_WARPS];
    const RowGroup g(G, cols / E);
    // Persistent loop. Its trip count depends only on blockIdx, so every thread of the block runs
    // it equally often and group_sum's __syncthreads is safe; rows past the end are "not live".
    for (int64_t first = int64_t(blockIdx.x) * g.rows_per_step; first < rows;
         first += int64_t(gridDim.x) * g.rows_per_step) {
        const int64_t row = first + g.slot;
        const bool live = row < rows;
        const int64_t base = row * cols;

        // 1. The one read: every load is issued before any is used, so they are all in flight.
        chunk16<T> xc[CHUNKS], rc[CHUNKS];
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            xc[i].zero();
            rc[i].zero();
            if (live && g.has(i)) {
                tk::load(xc[i], x + base + g.col(i, E));
                if (r != nullptr) tk::load(rc[i], r + base + g.col(i, E));
            }
        }
        float v[CHUNKS][E];   // h = x + r in fp32, rounded to T: exactly the h we store and the
        float s = 0.0f;       // backward reads, so forward and backward see the same input
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e) {
                v[i][e] = tk::round_to<T>(xc[i][e] + rc[i][e]);
                s += v[i][e];
            }

        // 2. mean, then 3. variance from the same registers (missing chunks are zeros: skip them).
        const float mean = group_sum(s, g, scratch) / cols;
        float q = 0.0f;
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!g.has(i)) continue;
#pragma unroll
            for (int e = 0; e < E; ++e) q += (v[i][e] - mean) * (v[i][e] - mean);
        }
        const float rstd = rsqrtf(group_sum(q, g, scratch) / cols + eps);   // rsqrt.approx: 2^-22.9

        // 4. The one write: h, then y = xhat * w + b.
        if (!live) continue;
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!g.has(i)) continue;
            const int col = g.col(i, E);
            if (h != nullptr) tk::store<T>(h + base + col, v[i]);
            float wv[E], bv[E] = {};
            load_params<E>(wv, w, col, params_bf16);
            if (b != nullptr) load_params<E>(bv, b, col, params_bf16);
#pragma unroll
            for (int e = 0; e < E; ++e) v[i][e] = (v[i][e] - mean) * rstd * wv[e] + bv[e];
            tk::store<T>(y + base + col, v[i]);
        }
        if (g.t == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
    }
}

// ---- backward: one read of h, dy and dh, one write of dh_out; dw, db summed on the way ----------
// Two blocks (16 warps) per SM need <= 128 registers a thread; we ask for that where it costs no
// spills (up to 3 chunks: 24 bf16 a lane, C = 768 with one warp a row). With 4 chunks the
// 64 fp32 dw/db accumulators alone would not fit, so those instances get one block per SM.
template <typename T, int CHUNKS>
__global__ void __launch_bounds__(BLOCK_THREADS, CHUNKS <= 3 ? 2 : 1)
backward_kernel(const T* __restrict__ dy, const T* __restrict__ dh, const T* __restrict__ h,
                const float* __restrict__ mean, const float* __restrict__ rstd,
                const void* __restrict__ w, bool params_bf16, T* __restrict__ dh_out, float* __restrict__ partial,
                int64_t rows, int cols, int G) {
    constexpr int E = chunk16<T>::elems;
    __shared__ float2 scratch[BLOCK_WARPS];
    __shared__ float col_sums[2 * MAX_COLS];   // this block's dw (first cols) and db (next cols)
    const RowGroup g(G, cols / E);
    float dw[CHUNKS][E], db[CHUNKS][E];        // this thread's columns, summed over its rows
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i)
#pragma unroll
        for (int e = 0; e < E; ++e) dw[i][e] = db[i][e] = 0.0f;

    for (int64_t first = int64_t(blockIdx.x) * g.rows_per_step; first < rows;
         first += int64_t(gridDim.x) * g.rows_per_step) {
        const int64_t row = first + g.slot;
        const bool live = row < rows;
        const int64_t base = row * cols;

        // 1. The one read (all loads in flight together), kept as loaded: 4 registers a chunk.
        //    Missing data reads as zero, which adds nothing to dw, db or the row sums.
        chunk16<T> hc[CHUNKS], dyc[CHUNKS], dhc[CHUNKS];
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            hc[i].zero();
            dyc[i].zero();
            dhc[i].zero();
            if (live && g.has(i)) {
                tk::load(hc[i], h + base + g.col(i, E));
                tk::load(dyc[i], dy + base + g.col(i, E));
                if (dh != nullptr) tk::load(dhc[i], dh + base + g.col(i, E));
            }
        }
        const float mu = live ? mean[row] : 0.0f;
        const float rs = live ? rstd[row] : 0.0f;

        // 2. dw, db, and this thread's part of sum(g) and sum(g * xhat), g = dy * w.
        float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!g.has(i)) continue;
            float wv[E];
            load_params<E>(wv, w, g.col(i, E), params_bf16);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const float xhat = (hc[i][e] - mu) * rs;
                const float grad = dyc[i][e] * wv[e];
                dw[i][e] += dyc[i][e] * xhat;
                db[i][e] += dyc[i][e];
                sums.x += grad;
                sums.y += grad * xhat;
            }
        }
        sums = group_sum(sums, g, scratch);
        const float mean_g = sums.x / cols, mean_gx = sums.y / cols;

        // 3. The one write: dh_out = dh + rstd * (g - mean(g) - xhat * mean(g * xhat)). xhat and
        //    g are recomputed (two multiply-adds) rather than kept: registers are the scarce
        //    thing here, they decide how many warps (and so how many loads) are in flight.
        if (!live) continue;
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!g.has(i)) continue;
            float wv[E], out[E];
            load_params<E>(wv, w, g.col(i, E), params_bf16);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const float xhat = (hc[i][e] - mu) * rs;
                const float grad = dyc[i][e] * wv[e];
                out[e] = dhc[i][e] + rs * (grad - mean_g - xhat * mean_gx);
            }
            tk::store<T>(dh_out + base + g.col(i, E), out);
        }
    }

    // 4. The block's dw, db: its row groups hold sums for the same columns; add them one group
    //    after another (a fixed order, so the result is reproducible), then write one row.
    for (int s = 0; s < g.rows_per_step; ++s) {
        if (g.slot == s) {
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                if (!g.has(i)) continue;
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    const int c = g.col(i, E) + e;
                    col_sums[c] = (s == 0 ? 0.0f : col_sums[c]) + dw[i][e];
                    col_sums[cols + c] = (s == 0 ? 0.0f : col_sums[cols + c]) + db[i][e];
                }
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < 2 * cols; c += BLOCK_THREADS)
        partial[int64_t(blockIdx.x) * 2 * cols + c] = col_sums[c];
}

// ---- dw[c], db[c] = sum of the blocks' partial rows ---------------------------------------------
// A block takes 32 columns (one coalesced 128-byte segment per partial row) with 32 warps; warp k
// adds partial rows k, k + 32, ... with four independent accumulators, so a thread has several
// loads in flight instead of waiting out DRAM latency once per row. Warp 0 then adds the 32
// warp sums from shared memory, in a fixed order, and writes fp32 or bf16.
constexpr int COLSUM_WARPS = 32;

__global__ void __launch_bounds__(COLSUM_WARPS * 32)
column_sum_kernel(const float* __restrict__ partial, int blocks, int cols, void* __restrict__ dw,
                  void* __restrict__ db, bool params_bf16) {
    __shared__ float sums[COLSUM_WARPS][33];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int c = blockIdx.x * 32 + lane;   // 0 .. 2*cols-1: dw columns, then db columns
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (c < 2 * cols) {
        int p = warp;
        for (; p + 3 * COLSUM_WARPS < blocks; p += 4 * COLSUM_WARPS)
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[k] += partial[int64_t(p + k * COLSUM_WARPS) * 2 * cols + c];
        for (; p < blocks; p += COLSUM_WARPS) acc[0] += partial[int64_t(p) * 2 * cols + c];
    }
    sums[warp][lane] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    __syncthreads();
    if (warp != 0 || c >= 2 * cols) return;
    float total = 0.0f;
    for (int k = 0; k < COLSUM_WARPS; ++k) total += sums[k][lane];
    void* out = c < cols ? dw : db;
    const int col = c < cols ? c : c - cols;
    if (params_bf16) static_cast<bf16*>(out)[col] = tk::convert<bf16>(total);
    else static_cast<float*>(out)[col] = total;
}

// ---- launchers: pick G and CHUNKS, size the persistent grid, launch -------------------------

struct Plan {
    int G;        // warps per row
    int chunks;   // 16-byte chunks per thread (the CHUNKS template argument)
};

Plan plan_for(int cols, DType dtype) {
    const int elems = dtype == DType::bf16 ? 8 : 4;
    const int row_chunks = cols / elems;
    int G = 1;
    while (G * 32 * MAX_CHUNKS < row_chunks) G *= 2;   // <= 8 because cols <= 4096
    return {G, (row_chunks + 32 * G - 1) / (32 * G)};
}

// Blocks of the persistent grid: as many as fit on the GPU at once, but no more than there are
// row steps. Occupancy is asked of the runtime once per kernel (registers decide it).
template <auto kernel> int grid_for(int64_t rows, int G) {
    static int per_sm = 0;   // one per kernel instance (the template argument)
    static int sms = 0;
    if (per_sm == 0) {
        int device = 0;
        cudaGetDevice(&device);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, BLOCK_THREADS, 0);
        if (per_sm < 1) per_sm = 1;
    }
    const int64_t steps = (rows + BLOCK_WARPS / G - 1) / (BLOCK_WARPS / G);
    return int(steps < int64_t(sms) * per_sm ? steps : int64_t(sms) * per_sm);
}

template <typename T, int CHUNKS> cudaError_t launch_forward(const ForwardArgs& a, int G, cudaStream_t stream) {
    forward_kernel<T, CHUNKS><<<grid_for<forward_kernel<T, CHUNKS>>(a.rows, G), BLOCK_THREADS, 0, stream>>>(
        static_cast<const T*>(a.x), static_cast<const T*>(a.residual), a.weight, a.bias, a.params_bf16, static_cast<T*>(a.y),
        static_cast<T*>(a.h), a.mean, a.rstd, a.rows, a.cols, G, a.eps);
    return cudaGetLastError();
}

template <typename T, int CHUNKS> int backward_grid(const BackwardArgs& a, int G) {
    return grid_for<backward_kernel<T, CHUNKS>>(a.rows, G);
}

template <typename T, int CHUNKS> cudaError_t launch_backward(const BackwardArgs& a, int G, cudaStream_t stream) {
    const int blocks = backward_grid<T, CHUNKS>(a, G);
    backward_kernel<T, CHUNKS><<<blocks, BLOCK_THREADS, 0, stream>>>(
        static_cast<const T*>(a.dy), static_cast<const T*>(a.dh), static_cast<const T*>(a.h), a.mean, a.rstd,
        a.weight, a.params_bf16, static_cast<T*>(a.dh_out), a.partial, a.rows, a.cols, G);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    column_sum_kernel<<<(2 * a.cols + 31) / 32, COLSUM_WARPS * 32, 0, stream>>>(a.partial, blocks, a.cols, a.dweight,
                                                                                a.dbias, a.params_bf16);
    return cudaGetLastError();
}

// Calls f.template operator()<T, CHUNKS>() for the plan's instance: 2 dtypes x 4 chunk counts.
template <typename F> auto dispatch(DType dtype, int chunks, F&& f) {
    if (dtype == DType::bf16) {
        switch (chunks) {
            case 1: return f.template operator()<bf16, 1>();
            case 2: return f.template operator()<bf16, 2>();
            case 3: return f.template operator()<bf16, 3>();
            default: return f.template operator()<bf16, 4>();
        }
    }
    switch (chunks) {
        case 1: return f.template operator()<float, 1>();
        case 2: return f.template operator()<float, 2>();
        case 3: return f.template operator()<float, 3>();
        default: return f.template operator()<float, 4>();
    }
}

}  // namespace

int backward_partial_blocks(int64_t rows, int cols, DType dtype) {
    const Plan p = plan_for(cols, dtype);
    BackwardArgs a{};
    a.rows = rows;
    return dispatch(dtype, p.chunks, [&]<typename T, int CHUNKS>() { return backward_grid<T, CHUNKS>(a, p.G); });
}

cudaError_t forward(const ForwardArgs& a, cudaStream_t stream) {
    if (a.rows == 0) return cudaSuccess;
    const Plan p = plan_for(a.cols, a.dtype);
    return dispatch(a.dtype, p.chunks, [&]<typename T, int CHUNKS>() { return launch_forward<T, CHUNKS>(a, p.G, stream); });
}

cudaError_t backward(const BackwardArgs& a, cudaStream_t stream) {
    if (a.rows == 0) return cudaSuccess;
    const Plan p = plan_for(a.cols, a.dtype);
    return dispatch(a.dtype, p.chunks, [&]<typename T, int CHUNKS>() { return launch_backward<T, CHUNKS>(a, p.G, stream); });
}

}  // namespace tk_layernorm

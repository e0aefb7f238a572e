// kernels/cross_entropy.cu: softmax cross-entropy over a chunk of logit rows, loss AND gradient
// in one kernel, writing the gradient over the logits in place. The LM head (kernels/lm_head_op.py)
// calls it between two GEMMs per chunk of rows:
//
//     logits = x_c · Wᵀ            (the tk GEMM, or cuBLAS) [n][V] bf16, V = 50304 for GPT-2
//     per row r, target t:                                 (this file)
//         m    = max_j logits[r][j]
//         lse  = m + log(sum_j exp(logits[r][j] - m))
//         loss[r] = lse - logits[r][t]
//         logits[r][j] <- (exp(logits[r][j] - lse) - [j == t]) * grad_scale    (dloss/dlogits)
//     dx_c = dlogits · W,  dW += dlogitsᵀ · x_c    (cuBLAS)
//
// THE LESSON: the loss and its gradient only need each row's max and sum of exponentials, and
// the gradient of the mean loss is known the moment the row's statistics are: softmax − onehot,
// scaled by 1/(rows not ignored). So the forward pass can produce the gradient right away, in
// the memory the logits already occupy, and the backward pass has nothing left to do but scale
// it by the incoming grad_output. PyTorch's F.cross_entropy instead writes log_softmax (fp32
// under autocast: a cast kernel first), keeps it for the backward, and the backward reads it
// again to write the gradient: three or four passes over a 3.3 GB tensor where this does one
// read and one write (2 + 2 bytes an element for bf16 logits).
//
// The kernel is memory-bound: per element ~10 flops and 4 bytes. The plan:
//   - One block per row (512 threads). A GPT-2 row is 50304 bf16 = 98 KB.
//   - Read the row from DRAM ONCE, keep it on chip for three sweeps (max; sum of exponentials;
//     gradient, written back), each sweep finished by a block reduction. Where to keep 98 KB?
//     rows_in_registers: in the threads' registers, VECS 16-byte chunks a thread (tk::chunk16:
//       8 bf16 or 4 floats; VECS a template argument, 1..16, so the chunks stay in registers).
//       Simple, but 98 KB of registers is 40% of an SM's register file: ONE block fits per SM,
//       and while it reduces or computes exponentials, nothing is loading.
//     rows_in_shared: in shared memory, copied there with cp.async (no registers on the way).
//       Two 98 KB rows fit in an SM's 227 KB, so two blocks share it: one loads while the
//       other computes. Each thread reads back only the chunks it copied itself, so waiting
//       for its own copies is enough (no barrier). Not the launcher's automatic choice (below),
//       but what kernels/lm_head_op.py asks for by name for wide rows (GPT-2's) since session 4.
//       The final call of session 3 measured it at 0.221 ms vs rows_in_registers' 0.327 ms on a
//       4096-row GPT-2 chunk (3.7 vs 2.5 TB/s).
//     The automatic choice is rows_in_registers where it fits, else rows_streamed: what ran on
//     the H200 (kernels/NOTES.md, "Session 3: fused LM head", has the figures).
//     A persistent variant (one block per SM, two row buffers, the next row loading while this
//       one is swept: rows_pipelined, session 11) was bit-identical but slower on the H200
//       (253.6 vs 220.3 us a 4096-row chunk, session 12) and was removed (kernels/NOTES.md, session 12).
//   - rows_streamed: everything else (a row not 16-byte aligned, e.g. V = 65 for
//     shakespeare-char, or too wide). Scalar loads, two sweeps over global memory: an online
//     max/sum (the running sum is rescaled whenever the max grows), then the gradient. The
//     second read of a row usually hits L2 (the block read it microseconds ago).
//   - rows_per_warp: narrow rows (up to 1024 columns, any alignment), one WARP per row, up to
//     32 values a lane in registers, warp shuffles only (no shared memory, no barrier). A
//     512-thread block on a 65-wide row leaves 447 threads idle through two block reductions;
//     here 64 rows share an SM at once. Not the automatic choice either, but what
//     kernels/lm_head_op.py asks for by name for rows of at most 1024 since session 4; measured
//     at 0.013 ms vs rows_streamed's 0.067 ms on 16384 x 65 in session 3's final call.
//   - Exponentials as exp2f(x·log2(e) − m·log2(e)): exp2f is one MUFU.EX2 instruction (relative
//     error ~2^-22), written here where the reader sees it; build.py keeps --use_fast_math off.
//   - All arithmetic in fp32; the stored gradient is rounded once, to the logits' dtype.
//   - In place is safe: each element is read and then written by the same thread, and every
//     read of the row (target logit included) happens before the block's last barrier that
//     precedes the writes. The loads are plain ld.global, not the read-only __ldg path
//     (tk::load): that path's contract is that the memory is not written during the kernel.
//   - grad_scale is a device pointer, not a host float: 1/(rows not ignored) is counted on the
//     GPU, so the host never waits for it (CUDA graphs capture this unchanged).
//
// Read in this order: block_reduce, finish_row (the per-row scalars all kernels share),
// rows_in_registers, rows_in_shared, rows_streamed, rows_per_warp, then the launcher (which
// kernel, which VECS).
#include <cmath>
#include <type_traits>

#include "cross_entropy.h"
#include "tk/common/common.cuh"
#include "tk/ops/chunk16.cuh"             // tk::chunk16 (16 bytes of a row as loaded)
#include "tk/ops/warp/memory_async.cuh"   // tk::cp_async_commit / cp_async_wait

namespace tk_cross_entropy {
namespace {

using tk::bf16;

constexpr int THREADS = 512;                  // one block per row
constexpr int WARPS = THREADS / tk::WARP_THREADS;
constexpr int MAX_VECS = 16;                  // chunks per thread in rows_in_registers
constexpr int WARP_ROW_COLS = 1024;           // rows_per_warp: at most 32 values a lane
constexpr int WARP_ROWS_PER_BLOCK = 8;        // rows_per_warp: 256-thread blocks
constexpr float LOG2E = 1.4426950408889634f;
constexpr float NEG_INF = -__builtin_huge_valf();

template <typename T> __device__ __forceinline__ float to_float(T v) { return tk::convert<float>(v); }
template <typename T> __device__ __forceinline__ T from_float(float v) { return tk::convert<T>(v); }

// Op over every thread of the block, returned to every thread: warp butterflies, one float per
// warp through shared memory, then every warp reduces the WARPS partials itself (no second
// barrier round to broadcast). The trailing barrier lets the caller reuse `partial` at once.
template <typename Op> __device__ __forceinline__ float block_reduce(float v, float* partial, float identity) {
    v = tk::warp_reduce<Op>(v);
    if (tk::laneid() == 0) partial[threadIdx.x / tk::WARP_THREADS] = v;
    __syncthreads();
    v = tk::laneid() < WARPS ? partial[tk::laneid()] : identity;
    v = tk::warp_reduce<Op>(v);
    __syncthreads();
    return v;
}

// What a row needs once its max m and sum of exponentials s = sum exp(x - m) are known.
struct RowResult {
    float neg_lse_log2e;   // -lse·log2(e): exp(x - lse) = exp2f(x·log2(e) + neg_lse_log2e)
    float scale;           // grad_scale, or 0 for an ignored or invalid row (gradient all zeros)
};

// Thread 0 writes the row's loss; every thread gets the gradient's constants. target_logit is
// the target's logit as read before any write (only thread 0's copy is used).
__device__ __forceinline__ RowResult finish_row(float m, float s, int64_t target, int64_t cols, float target_logit,
                                                float* loss_row, const float* grad_scale, bool write_grad) {
    const float lse = m + logf(s);
    const bool ignored = target == -1;
    const bool valid = target >= 0 && target < cols;
    if (threadIdx.x == 0) *loss_row = valid ? lse - target_logit : (ignored ? 0.0f : __int_as_float(0x7fc00000));
    return RowResult{-lse * LOG2E, (write_grad && valid) ? *grad_scale : 0.0f};
}

// The gradient of one element: (softmax - onehot) * scale.
__device__ __forceinline__ float grad_of(float x, bool is_target, const RowResult& r) {
    const float p = exp2f(fmaf(x, LOG2E, r.neg_lse_log2e));
    return (is_target ? p - 1.0f : p) * r.scale;
}

// 16 bytes as loaded (a plain load or a shared-memory read) -> a chunk.
template <typename T> __device__ __forceinline__ tk::chunk16<T> chunk_of(uint4 raw) {
    tk::chunk16<T> c;
    c.word[0] = raw.x; c.word[1] = raw.y; c.word[2] = raw.z; c.word[3] = raw.w;
    return c;
}

// ---- the row in registers: one DRAM read, one DRAM write -----------------------------------
// Thread i holds chunks i, i + THREADS, i + 2·THREADS, ... of the row (consecutive threads on
// consecutive 16-byte chunks: a warp moves 512 contiguous bytes per instruction). Needs cols and
// ld multiples of the chunk width and a 16-byte aligned base (the launcher checks).
template <typename T, int VECS>
__global__ void __launch_bounds__(THREADS) rows_in_registers(Args a) {
    using Chunk = tk::chunk16<T>;
    constexpr int E = Chunk::elems;
    __shared__ float partial[WARPS];
    const int64_t row = blockIdx.x;
    T* x = static_cast<T*>(a.logits) + row * a.ld;
    const int64_t target = a.targets[row];
    const int chunks = int(a.cols / E);

    float target_logit = 0.0f;
    if (threadIdx.x == 0 && target >= 0 && target < a.cols) target_logit = to_float(x[target]);

    Chunk c[VECS];
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int k = v * THREADS + threadIdx.x;
        if (k < chunks) {   // a plain load, not __ldg: this kernel writes the row afterwards
            c[v] = chunk_of<T>(*reinterpret_cast<const uint4*>(x + int64_t(k) * E));
        }
    }

    float m = NEG_INF;
#pragma unroll
    for (int v = 0; v < VECS; ++v)
        if (v * THREADS + int(threadIdx.x) < chunks)
#pragma unroll
            for (int e = 0; e < E; ++e) m = fmaxf(m, c[v][e]);
    m = block_reduce<tk::base_ops::max>(m, partial, NEG_INF);

    const float neg_m_log2e = -m * LOG2E;
    float s = 0.0f;
#pragma unroll
    for (int v = 0; v < VECS; ++v)
        if (v * THREADS + int(threadIdx.x) < chunks)
#pragma unroll
            for (int e = 0; e < E; ++e) s += exp2f(fmaf(c[v][e], LOG2E, neg_m_log2e));
    s = block_reduce<tk::base_ops::sum>(s, partial, 0.0f);   // its barriers also order every read before any write

    const RowResult r = finish_row(m, s, target, a.cols, target_logit, a.loss_rows + row, a.grad_scale, a.write_grad);
    if (!a.write_grad) return;
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int k = v * THREADS + threadIdx.x;
        if (k < chunks) {
            float g[E];
#pragma unroll
            for (int e = 0; e < E; ++e) g[e] = grad_of(c[v][e], int64_t(k) * E + e == target, r);
            tk::store(x + int64_t(k) * E, g);
        }
    }
}

// ---- the row in shared memory: one DRAM read, one DRAM write, two rows per SM --------------
// The same three sweeps as rows_in_registers, over chunks in dynamic shared memory (chunks * 16
// bytes). Thread i copies and later reads chunks i, i + THREADS, ...: its own, so after
// cp_async_wait<0>() (which covers this thread's copies) it may read them without a barrier.
template <typename T>
__global__ void __launch_bounds__(THREADS, 2) rows_in_shared(Args a) {
    using Chunk = tk::chunk16<T>;
    constexpr int E = Chunk::elems;
    extern __shared__ __align__(16) uint4 row_chunks[];
    __shared__ float partial[WARPS];
    const int64_t row = blockIdx.x;
    T* x = static_cast<T*>(a.logits) + row * a.ld;
    const int64_t target = a.targets[row];
    const int chunks = int(a.cols / E);

    float target_logit = 0.0f;
    if (threadIdx.x == 0 && target >= 0 && target < a.cols) target_logit = to_float(x[target]);

    for (int k = threadIdx.x; k < chunks; k += THREADS)   // .cg: through L2 only, 16 bytes each
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                     ::"r"(tk::smem_addr(&row_chunks[k])), "l"(x + int64_t(k) * E) : "memory");
    tk::cp_async_commit();
    tk::cp_async_wait<0>();

    float m = NEG_INF;
    for (int k = threadIdx.x; k < chunks; k += THREADS) {
        const Chunk c = chunk_of<T>(row_chunks[k]);
#pragma unroll
        for (int e = 0; e < E; ++e) m = fmaxf(m, c[e]);
    }
    m = block_reduce<tk::base_ops::max>(m, partial, NEG_INF);

    const float neg_m_log2e = -m * LOG2E;
    float s = 0.0f;
    for (int k = threadIdx.x; k < chunks; k += THREADS) {
        const Chunk c = chunk_of<T>(row_chunks[k]);
#pragma unroll
        for (int e = 0; e < E; ++e) s += exp2f(fmaf(c[e], LOG2E, neg_m_log2e));
    }
    s = block_reduce<tk::base_ops::sum>(s, partial, 0.0f);   // its barriers order every read before any write

    const RowResult r = finish_row(m, s, target, a.cols, target_logit, a.loss_rows + row, a.grad_scale, a.write_grad);
    if (!a.write_grad) return;
    for (int k = threadIdx.x; k < chunks; k += THREADS) {
        const Chunk c = chunk_of<T>(row_chunks[k]);
        float g[E];
#pragma unroll
        for (int e = 0; e < E; ++e) g[e] = grad_of(c[e], int64_t(k) * E + e == target, r);
        tk::store(x + int64_t(k) * E, g);
    }
}

// ---- any row: two sweeps over global memory ------------------------------------------------
// Sweep 1 keeps a running max m and a sum s of exp(x - m); when x exceeds m, s is rescaled by
// exp(m_old - m_new) (the "online softmax" recurrence). The block then merges the threads' (m, s)
// pairs: M = max m, S = sum of s·exp(m - M). Sweep 2 reads the row again and writes the gradient.
template <typename T>
__global__ void __launch_bounds__(THREADS) rows_streamed(Args a) {
    __shared__ float partial[WARPS];
    const int64_t row = blockIdx.x;
    T* x = static_cast<T*>(a.logits) + row * a.ld;
    const int64_t target = a.targets[row];

    float target_logit = 0.0f;
    if (threadIdx.x == 0 && target >= 0 && target < a.cols) target_logit = to_float(x[target]);

    float m = NEG_INF, s = 0.0f;
    for (int64_t j = threadIdx.x; j < a.cols; j += THREADS) {
        const float v = to_float(x[j]);
        if (v > m) {   // the first element always lands here (s·exp2(-inf) = 0)
            s = s * exp2f((m - v) * LOG2E) + 1.0f;
            m = v;
        } else {
            s += exp2f((v - m) * LOG2E);
        }
    }
    const float M = block_reduce<tk::base_ops::max>(m, partial, NEG_INF);
    const float mine = m == NEG_INF ? 0.0f : s * exp2f((m - M) * LOG2E);   // a thread with no columns adds 0
    const float S = block_reduce<tk::base_ops::sum>(mine, partial, 0.0f);

    const RowResult r = finish_row(M, S, target, a.cols, target_logit, a.loss_rows + row, a.grad_scale, a.write_grad);
    if (!a.write_grad) return;
    for (int64_t j = threadIdx.x; j < a.cols; j += THREADS) x[j] = from_float<T>(grad_of(to_float(x[j]), j == target, r));
}

// ---- narrow rows: one warp per row ---------------------------------------------------------
// Lane l holds columns l, l + 32, ... (a warp instruction reads 32 consecutive values), PER_LANE
// of them (2..32, the launcher picks the fewest that cover the row: V = 65 takes 4). The
// target's logit comes from the lane that holds it, through a warp sum, not from memory: the
// warp writes the row afterwards, and a shuffle orders registers, not memory.
template <typename T, int PER_LANE>
__global__ void __launch_bounds__(WARP_ROWS_PER_BLOCK * tk::WARP_THREADS) rows_per_warp(Args a) {
    const int64_t row = int64_t(blockIdx.x) * WARP_ROWS_PER_BLOCK + threadIdx.x / tk::WARP_THREADS;
    if (row >= a.rows) return;   // whole warps leave together: the shuffles below stay full
    const int lane = tk::laneid();
    T* x = static_cast<T*>(a.logits) + row * a.ld;
    const int64_t target = a.targets[row];
    const int cols = int(a.cols);

    float v[PER_LANE];
    float m = NEG_INF, mine = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int j = lane + i * tk::WARP_THREADS;
        v[i] = j < cols ? to_float(x[j]) : NEG_INF;
        m = fmaxf(m, v[i]);
        if (j == target) mine = v[i];
    }
    m = tk::warp_max(m);
    const float target_logit = tk::warp_sum(mine);   // one lane holds it, the others add 0

    const float neg_m_log2e = -m * LOG2E;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i)
        if (lane + i * tk::WARP_THREADS < cols) s += exp2f(fmaf(v[i], LOG2E, neg_m_log2e));
    s = tk::warp_sum(s);

    // finish_row's arithmetic, with lane 0 (not thread 0) writing the loss
    const float lse = m + logf(s);
    const bool valid = target >= 0 && target < a.cols;
    if (lane == 0) a.loss_rows[row] = valid ? lse - target_logit : (target == -1 ? 0.0f : __int_as_float(0x7fc00000));
    if (!a.write_grad) return;
    const RowResult r{-lse * LOG2E, valid ? *a.grad_scale : 0.0f};
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int j = lane + i * tk::WARP_THREADS;
        if (j < cols) x[j] = from_float<T>(grad_of(v[i], j == target, r));
    }
}

// ---- launcher ------------------------------------------------------------------------------

template <typename T> bool aligned_rows(const Args& a) {
    const int64_t E = tk::chunk16<T>::elems;
    return a.cols % E == 0 && a.ld % E == 0 && reinterpret_cast<uintptr_t>(a.logits) % 16 == 0;
}

// VECS for rows_in_registers, or 0 when it cannot take the row.
template <typename T> int choose_vecs(const Args& a) {
    if (!aligned_rows<T>(a)) return 0;
    const int64_t per_thread = (a.cols / tk::chunk16<T>::elems + THREADS - 1) / THREADS;
    for (int v : {1, 2, 4, 8, MAX_VECS})
        if (per_thread <= v) return v;
    return 0;
}

// The most dynamic shared memory one block may have on this device (227 KB on the H200), set
// once per kernel as its limit; a launch then asks for what its row needs.
template <typename T> int64_t shared_limit() {
    static int64_t limit = -1;
    if (limit < 0) {
        int device = 0, optin = 0;
        cudaGetDevice(&device);
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        optin -= int(WARPS * sizeof(float));   // the reduction's partials live there too
        limit = cudaFuncSetAttribute(rows_in_shared<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) == cudaSuccess
                    ? optin : 0;
    }
    return limit;
}

template <typename T> bool fits_shared(const Args& a) {
    return aligned_rows<T>(a) && a.cols * int64_t(sizeof(T)) <= shared_limit<T>();
}

// The kernel a call takes: the requested one where it can take these rows, else the automatic
// choice (rows_in_registers where it fits, else rows_streamed: what ran on the H200 first).
template <typename T> Kernel resolve(const Args& a, int* vecs) {
    *vecs = choose_vecs<T>(a);
    const Kernel automatic = *vecs ? Kernel::registers : Kernel::streamed;
    switch (a.kernel) {
        case Kernel::registers: return *vecs ? Kernel::registers : automatic;
        case Kernel::shared: return fits_shared<T>(a) ? Kernel::shared : automatic;
        case Kernel::warp: return a.cols <= WARP_ROW_COLS ? Kernel::warp : automatic;
        case Kernel::streamed: return Kernel::streamed;
        default: return automatic;
    }
}

template <typename T> const char* launch(const Args& a, cudaStream_t stream) {
    const dim3 grid(unsigned(a.rows)), block(THREADS);
    int vecs = 0;
    switch (resolve<T>(a, &vecs)) {
        case Kernel::shared: {
            const size_t bytes = size_t(a.cols) * sizeof(T);
            rows_in_shared<T><<<grid, block, bytes, stream>>>(a);
            break;
        }
        case Kernel::registers:
            switch (vecs) {
                case 1: rows_in_registers<T, 1><<<grid, block, 0, stream>>>(a); break;
                case 2: rows_in_registers<T, 2><<<grid, block, 0, stream>>>(a); break;
                case 4: rows_in_registers<T, 4><<<grid, block, 0, stream>>>(a); break;
                case 8: rows_in_registers<T, 8><<<grid, block, 0, stream>>>(a); break;
                default: rows_in_registers<T, MAX_VECS><<<grid, block, 0, stream>>>(a); break;
            }
            break;
        case Kernel::warp: {
            const dim3 warp_grid(unsigned((a.rows + WARP_ROWS_PER_BLOCK - 1) / WARP_ROWS_PER_BLOCK));
            const dim3 warp_block(WARP_ROWS_PER_BLOCK * tk::WARP_THREADS);
            const int64_t per_lane = (a.cols + tk::WARP_THREADS - 1) / tk::WARP_THREADS;
            if (per_lane <= 2) rows_per_warp<T, 2><<<warp_grid, warp_block, 0, stream>>>(a);
            else if (per_lane <= 4) rows_per_warp<T, 4><<<warp_grid, warp_block, 0, stream>>>(a);
            else if (per_lane <= 8) rows_per_warp<T, 8><<<warp_grid, warp_block, 0, stream>>>(a);
            else if (per_lane <= 16) rows_per_warp<T, 16><<<warp_grid, warp_block, 0, stream>>>(a);
            else rows_per_warp<T, WARP_ROW_COLS / tk::WARP_THREADS><<<warp_grid, warp_block, 0, stream>>>(a);
            break;
        }
        default: rows_streamed<T><<<grid, block, 0, stream>>>(a); break;
    }
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

const char* plan_name(const Args& a) {
    int vecs = 0;
    const Kernel k = a.dtype == DType::bf16 ? resolve<bf16>(a, &vecs) : resolve<float>(a, &vecs);
    if (k == Kernel::shared) return "shared";
    if (k == Kernel::streamed) return "streamed";
    if (k == Kernel::warp) return "warp";
    switch (vecs) {
        case 1: return "registers(VECS=1)";
        case 2: return "registers(VECS=2)";
        case 4: return "registers(VECS=4)";
        case 8: return "registers(VECS=8)";
        default: return "registers(VECS=16)";
    }
}

const char* cross_entropy_rows(const Args& a, cudaStream_t stream) {
    if (a.rows < 0 || a.rows >= (int64_t(1) << 31)) return "rows must be between 0 and 2^31-1 (one block per row)";
    if (a.cols < 1 || a.ld < a.cols) return "cols must be >= 1 and ld >= cols";
    if (a.rows == 0) return nullptr;
    return a.dtype == DType::bf16 ? launch<bf16>(a, stream) : launch<float>(a, stream);
}

}  // namespace tk_cross_entropy

// kernels/layernorm.cu: fused residual add + LayerNorm on tk, forward and backward.
//
//   forward   h = x + r                         (r optional; without it h is x and is not written)
//             (or h = x + dropout(r): DROPOUT below; the backward regenerates the mask)
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
//     lane holds more than 16 bytes x 4 chunks) across warps through a few floats of shared
//     memory. No atomics anywhere: results are bitwise reproducible run to run.
//   - Wide vector loads and stores (Chunk below): 16 bytes per instruction, consecutive threads
//     on consecutive chunks, so one warp instruction moves 512 contiguous bytes.
//   - Parameters (w, b, dw, db) are fp32 or bf16 as the caller has them: converted on load and
//     store, never by extra passes.
//   - dw and db are sums over ALL rows. Each thread adds up its own columns over every row its
//     warp visits (a persistent grid of ~2 blocks per SM), the block adds its row groups' sums
//     in shared memory and writes one fp32 row of partials, and a second tiny kernel adds the
//     partials column by column: ~2 MB of extra traffic next to hundreds of MB.
//
// WHY THE TENSORS MAY HAVE DIFFERENT DTYPES (the same lesson, one level up): under bf16 autocast
// the model's residual stream h is fp32 (as in plain PyTorch) while each branch output (attention
// c_proj, MLP) is bf16, and y feeds a bf16 matmul. A same-dtype kernel needs four cast kernels
// around it per call: branch bf16 -> fp32 before the add, y fp32 -> bf16 for the matmul, and in
// the backward dy bf16 -> fp32 and the branch gradient fp32 -> bf16. Each cast reads and writes
// the whole tensor (6 bytes an element); with the kernel's own fp32 traffic that is 56 bytes an
// element per call, fwd+bwd. Reading and writing each tensor in the dtype it lives in instead
// (fp32 x, h, dh, dh_out; bf16 branch, y, dy and the branch's gradient) moves 28: forward reads
// x 4 + r 2, writes h 4 + y 2; backward reads dy 2 + dh 4 + h 4, writes dh_out 4 + dr 2.
// Measured on the H200 (bench.py --profile, GPT-2 124M, B=32, T=1024, bf16 autocast, tk path)
// ~13 of the 87 ms step were cast kernels, many of them from this seam; kernels/NOTES.md
// ("Session 2: mixed dtypes") has the predicted saving. Statistics and arithmetic stay fp32.
// The kernels are templates on three types, each float or bf16:
//   TH  x, h, dh, dh_out (the residual stream)          TR  r and its gradient dr
//   TY  y and dy
// and exist for TH = float with TR, TY each float or bf16, and for all-bf16 (launchers, bottom).
// x is the wider input: model.py calls add_layernorm(h, branch), the fp32 stream first, and
// kernels/layernorm.py swaps the two when a caller passes them the other way (x + r = r + x).
// A thread's chunk is always 16 bytes of h: 4 columns for fp32 h, 8 for bf16. A bf16 tensor
// beside fp32 h moves the same 4 columns in 8 bytes (a warp: 256 contiguous bytes, still
// coalesced).
//
// PLAN VARIANTS (session 3): the forward's grid, how the backward's block adds up dw/db, the
// backward's row order and programmatic dependent launches are runtime choices (set_variant,
// TK_LAYERNORM_VARIANT), so one process can time them against each other
// (kernels/layernorm_bench.py). The same arithmetic in every plan; kernels/NOTES.md ("Session 3:
// LayerNorm speed") has the measurements and the default. (8-byte "narrow" chunks and a
// next-row "prefetch" were tried there too, lost on the H200 and were removed.) Session 6's flags
// work on the seam between the forward and the backward under pdl (fwd_early_pdl, bwd_l2_first(2):
// kernel instances of their own, EARLY_PDL and FIRST_STEPS; with bwd_reverse they are in the
// default plan since session 6's call 3); its memory hints that lost (rows ahead in L2 inside the
// loops, evict-first loads, fewer forward blocks an SM) are in kernels/NOTES.md ("Session 6: L").
// Session 7 measured and removed smaller forward blocks (1, 2, 4 warps, like torch.compile's
// one-warp rows), an evenly split backward grid, a column sum in one L2 round trip, and other
// forms of the forward's loads (plain ld.global: the same; Triton's evict-first hints: slower):
// none was faster (kernels/NOTES.md, "Session 7: L"). Session 8: for rows of one warp (G = 1) the
// default plan runs forward_lean_kernel and backward_lean_kernel (flags fwd_lean, bwd_lean): the same
// arithmetic in fewer instructions (no group arithmetic, predicated loads and stores in one basic
// block, parameters loaded at once); fwd+bwd 61.4 -> 57.0 us at 16384x768 (NOTES, "Session 8: L").
// Session 9 (flag bwd_wide, in the default plan since session 9): the lean backward for GPT-2's rows
// under autocast, fp32 h at 768 columns (two warps a row), its G a template argument: backward 104.4
// -> 97.0 us at 32768x768. A lean forward with one warp a row there (fwd_wide) lost 0.3-2.7 us and was
// removed (code at commit d362a9e) (NOTES, "Session 9: L").
//
// DROPOUT of the branch (session 4): training drops elements of each residual branch (attention
// and MLP outputs) before adding them to the stream. Done by kernels of its own, dropout costs a
// read and a write of the branch each way plus a saved byte-per-element mask. Here it costs no bytes:
// the mask is a pure function of (seed, element index), a counter-based hash, computed in
// registers where r is added (forward) and again where r's gradient is written (backward).
// The seed is one int64 in device memory, drawn by the caller with torch's generator for every
// forward, so a CUDA graph replays a fresh mask each time and nothing waits for the host. The
// kernels are templates on DROP; without dropout the DROP = false instances run, which hold no
// dropout code at all.
//
// Read in this order: Chunk, RowGroup (who holds which columns), group_sum, the dropout mask,
// forward_kernel, forward_lean_kernel, backward_kernel, backward_lean_kernel, column_sum_kernel, the
// variants, then the launchers at the bottom (grid sizing, dispatch).
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "layernorm.h"
#include "tk/common/common.cuh"
#include "tk/ops/chunk16.cuh"   // tk::chunk, tk::load, tk::store, tk::round_to

namespace tk_layernorm {
namespace {

using tk::bf16;

constexpr int BLOCK_WARPS = 8;
constexpr int BLOCK_THREADS = BLOCK_WARPS * 32;
constexpr int MAX_CHUNKS = 4;   // chunks per thread per row: at most 32 bf16 or 16 floats

// A chunk is E consecutive columns of one row of a T tensor, kept as loaded and moved with ONE
// vector instruction each way: tk::chunk<T, E> (tk/ops/chunk16.cuh), 16 bytes of h, and for a
// bf16 tensor beside fp32 h the same E columns in 8 bytes.
// Elements widen to float on use (exact for bf16: a float's top half).
template <typename T, int E> using Chunk = tk::chunk<T, E>;

// A block's 8 warps split into row groups of G warps; each group normalizes one row at a time,
// so a block steps over 8/G rows at once. Thread t of a group holds chunks t, t + 32G,
// t + 64G, ... of the row: at each step the group's threads cover a contiguous span (coalesced).
struct RowGroup {
    int G;               // warps per row: 1 for C <= 1024 (bf16 h), up to 8 for C = 4096 fp32 h
    int threads;         // 32 * G
    int t;               // this thread's rank in its group
    int slot;            // which of the block's rows (0 .. 8/G - 1) this group takes
    int rows_per_step;   // 8 / G
    int chunks;          // chunks in a row: cols / E
    __device__ RowGroup(int G_, int chunks_)
        : G(G_), threads(32 * G_), t(threadIdx.x % (32 * G_)), slot(threadIdx.x / (32 * G_)),
          rows_per_step(BLOCK_WARPS / G_), chunks(chunks_) {}
    __device__ bool has(int i) const { return t + i * threads < chunks; }   // chunk i exists?
    __device__ int col(int i, int elems) const { return (t + i * threads) * elems; }
};

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float2 add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }

// Waits for the G warps of this thread's row group only: named barrier 1 + slot (barrier 0 is
// __syncthreads'), so the block's other groups keep streaming their own rows meanwhile.
// A cost to know (session 7, ncu "Block Limit Barriers"): with a barrier id known only at run time,
// ptxas reserves all 16 named barriers for the kernel ("used 16 barriers" in ptxas -v), and an SM
// then holds at most 4 of its blocks, whatever their size. Harmless here (the forward's registers
// allow 4 blocks of 8 warps anyway, the backward's 2), ruinous for small blocks (1-warp blocks: 4
// warps an SM). Blocks of 1, 2 or 4 warps without named barriers were measured too: no faster.
__device__ __forceinline__ void group_barrier(const RowGroup& g) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + g.slot), "r"(g.threads) : "memory");
}

// The sum of v over the row group's G warps, returned to every thread of the group. Every thread
// of the group must call it at the same time: with G > 1 it crosses warps through shared memory
// and the group's barrier. Each thread adds the G warp sums in the same order, so all agree exactly.
template <typename V> __device__ V group_sum(V v, const RowGroup& g, V* scratch /* [BLOCK_WARPS] */) {
    v = tk::warp_sum(v);
    if (g.G == 1) return v;
    if (tk::laneid() == 0) scratch[threadIdx.x / 32] = v;
    group_barrier(g);
    V total = scratch[g.slot * g.G];
    for (int w = 1; w < g.G; ++w) total = add(total, scratch[g.slot * g.G + w]);
    group_barrier(g);   // scratch is reused by the next call
    return total;
}

// E consecutive elements of a T vector, widened to float, in as few vector loads as the size
// allows (16 bytes at most each).
template <typename T, int E> __device__ __forceinline__ void load_floats(float (&p)[E], const T* src) {
    constexpr int PIECE = E * int(sizeof(T)) >= 16 ? 16 / int(sizeof(T)) : E;   // elements per load
#pragma unroll
    for (int k = 0; k < E / PIECE; ++k) {
        Chunk<T, PIECE> c;
        tk::load(c, src + k * PIECE);
#pragma unroll
        for (int e = 0; e < PIECE; ++e) p[k * PIECE + e] = c[e];
    }
}

// weight or bias for the E columns of one chunk, widened to float. Parameters are fp32 or bf16
// (one runtime flag, the same for every thread: no divergence, no extra template instances).
// Every row reads the same few KB, so after the first row they come from L1, not DRAM.
// (The bindings hand over 16-byte-aligned parameters.)
template <int E> __device__ __forceinline__ void load_params(float (&p)[E], const void* src, int col, bool is_bf16) {
    if (is_bf16) load_floats<bf16, E>(p, static_cast<const bf16*>(src) + col);
    else load_floats<float, E>(p, static_cast<const float*>(src) + col);
}

// E floats (a multiple of 4) to / added from shared or global memory in 16-byte vectors; p
// aligned to 16 bytes.
template <int E> __device__ __forceinline__ void store_vec(float* p, const float (&v)[E]) {
    static_assert(E % 4 == 0, "store_vec: a multiple of 4 floats");
#pragma unroll
    for (int k = 0; k < E / 4; ++k)
        reinterpret_cast<float4*>(p)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
}
template <int E> __device__ __forceinline__ void add_vec(float (&v)[E], const float* p) {
    static_assert(E % 4 == 0, "add_vec: a multiple of 4 floats");
#pragma unroll
    for (int k = 0; k < E / 4; ++k) {
        const float4 q = reinterpret_cast<const float4*>(p)[k];
        v[4 * k] += q.x; v[4 * k + 1] += q.y; v[4 * k + 2] += q.z; v[4 * k + 3] += q.w;
    }
}

// Programmatic dependent launch (sm_90): the column sum is launched while the backward still runs
// and waits here for it to finish and flush. Without that launch attribute (or before sm_90) these
// are no-ops.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for one row of a tensor, which this thread's group will load later: thread t of the group
// prefetches the row's 128-byte line t. Nothing in the SM waits for a prefetch (no register, no
// shared memory), and it is only a hint: L2 is where every SM's stores land, so a prefetch can
// bring in no stale data, even before griddepcontrol.wait (the backward's bwd_l2_first uses that).
template <typename T> __device__ __forceinline__ void prefetch_row_l2(const T* p, int64_t row, int cols, const RowGroup& g) {
    constexpr int per_line = 128 / int(sizeof(T));   // elements a line (cols is a multiple of 64: whole lines)
    if (g.t * per_line < cols) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + row * cols + g.t * per_line));
}

// ---- dropout: the mask as a function of (seed, index) ------------------------------------------
// Element i of the [rows, cols] branch (i = row * cols + col) is kept when its 16 bits of
// mix64(seed + (i / 4) * GAMMA) are >= threshold = round(p * 65536): one 64-bit hash gives the 16
// bits of 4 consecutive elements. mix64 is the finalizer of splitmix64 (Steele, Lea and Flood,
// "Fast splittable pseudorandom number generators", 2014): seed + n * GAMMA is its counter
// stream, so two seeds give unrelated masks unless the seeds are within ~rows*cols/4 steps of
// each other along that stream (a 2^-41 chance for 2^24 elements). About 20 integer
// instructions per 4 elements, hidden under the loads. p is kept to 16 bits (0.2 -> 13107/65536,
// keep rate 1 - p + 3e-6); kernels/layernorm.py's dropout_keep_mask is the same function in numpy.
struct DropoutMask {
    uint64_t seed;
    uint32_t threshold;   // drop when the 16 bits are below this (0 .. 65536)
    float scale;          // 1 / (1 - p) for the kept ones
};

constexpr uint64_t GAMMA = 0x9e3779b97f4a7c15ull;   // 2^64 / golden ratio, odd

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The multiplier of each of the E elements from flat index `index` (a multiple of 4, as every
// chunk starts at a multiple of 4 columns and cols is a multiple of 64): scale if kept, else 0.
template <int E> __device__ __forceinline__ void keep_scale(float (&k)[E], const DropoutMask& d, int64_t index) {
    static_assert(E % 4 == 0, "a chunk holds whole groups of 4 elements");
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
        const uint64_t bits = mix64(d.seed + uint64_t(index / 4 + q) * GAMMA);
#pragma unroll
        for (int j = 0; j < 4; ++j) k[4 * q + j] = uint32_t(bits >> (16 * j)) % 65536u >= d.threshold ? d.scale : 0.0f;
    }
}

// The mask's parameters for a kernel: the seed is read here, after wait_for_previous_grid (the
// kernel that drew it may be the one just before).
__device__ __forceinline__ DropoutMask read_mask(const int64_t* seed, uint32_t threshold, float scale) {
    return {uint64_t(*seed), threshold, scale};
}

// ---- forward: one read of x and r, one write of h and y ----------------------------------------
// Occupancy asked of ptxas: up to 3 chunks (48 bytes of h) a thread, four blocks (32 warps) an
// SM; more, no minimum.
template <typename TH, typename TR, int E, int CHUNKS> struct ForwardRow {
    Chunk<TH, E> x[CHUNKS];
    Chunk<TR, E> r[CHUNKS];
    // Issue every load of the row at `base` (zeros when !live): in flight until first used.
    __device__ __forceinline__ void issue(const TH* xp, const TR* rp, int64_t base, bool live, const RowGroup& g) {
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            x[i].zero();
            r[i].zero();
            if (live && g.has(i)) {
                tk::load(x[i], xp + base + g.col(i, E));
                if (rp != nullptr) tk::load(r[i], rp + base + g.col(i, E));
            }
        }
    }
};

// EARLY_PDL (flag fwd_early_pdl; it matters with pdl): each block lets the next kernel launch as
// soon as it starts (griddepcontrol.launch_dependents), not when it ends, so the backward's blocks
// take the SMs the forward's last blocks leave and can start asking L2 for their rows
// (bwd_l2_first) while the forward finishes. They still wait for all of it (wait_for_previous_grid).
template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP, bool EARLY_PDL = false>
__global__ void __launch_bounds__(BLOCK_THREADS, CHUNKS <= 3 ? 4 : 1)
forward_kernel(const TH* __restrict__ x, const TR* __restrict__ r, const void* __restrict__ w,
               const void* __restrict__ b, bool params_bf16, TY* __restrict__ y, TH* __restrict__ h,
               float* __restrict__ mean_out, float* __restrict__ rstd_out,
               int64_t rows, int cols, int G, float eps,
               const int64_t* __restrict__ seed, uint32_t threshold, float scale) {
    constexpr int E = 16 / int(sizeof(TH));   // columns per chunk
    __shared__ float scratch[BLOCK_WARPS];
    const RowGroup g(G, cols / E);
    const int64_t stride = int64_t(gridDim.x) * g.rows_per_step;
    wait_for_previous_grid();   // pdl: x and r (and the seed) are written by kernels before this one
    if constexpr (EARLY_PDL) allow_next_grid();
    DropoutMask mask{};
    if constexpr (DROP) mask = read_mask(seed, threshold, scale);
    // Persistent loop (or one trip, when the grid has a block per row step). Its trip count
    // depends only on blockIdx, so every group runs it equally often and group_sum's barriers
    // are safe; rows past the end are "not live".
    int64_t first = int64_t(blockIdx.x) * g.rows_per_step;
    for (; first < rows; first += stride) {
        const int64_t row = first + g.slot;
        const bool live = row < rows;
        const int64_t base = row * cols;

        // 1. The one read: every load is issued before any is used, so they are all in flight.
        ForwardRow<TH, TR, E, CHUNKS> in;
        in.issue(x, r, base, live, g);
        float v[CHUNKS][E];   // h = x + r in fp32, rounded to TH: exactly the h we store and the
        float s = 0.0f;       // backward reads, so forward and backward see the same input. A bf16
                              // r widens exactly, so for fp32 h this is torch's promoted x + r.
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            float k[E];   // dropout: r's multiplier, scale or 0 (its product is not rounded to TR)
            if constexpr (DROP) keep_scale<E>(k, mask, base + g.col(i, E));
#pragma unroll
            for (int e = 0; e < E; ++e) {
                if constexpr (DROP) v[i][e] = tk::round_to<TH>(in.x[i][e] + in.r[i][e] * k[e]);
                else v[i][e] = tk::round_to<TH>(in.x[i][e] + in.r[i][e]);
                s += v[i][e];
            }
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

        // 4. The one write: h (in TH), then y = xhat * w + b, rounded once to TY.
        if (live) {
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                if (!g.has(i)) continue;
                const int col = g.col(i, E);
                if (h != nullptr) tk::store(h + base + col, v[i]);
                float wv[E], bv[E] = {};
                load_params<E>(wv, w, col, params_bf16);
                if (b != nullptr) load_params<E>(bv, b, col, params_bf16);
#pragma unroll
                for (int e = 0; e < E; ++e) v[i][e] = (v[i][e] - mean) * rstd * wv[e] + bv[e];
                tk::store(y + base + col, v[i]);
            }
            if (g.t == 0) {
                mean_out[row] = mean;
                rstd_out[row] = rstd;
            }
        }
    }
    if constexpr (!EARLY_PDL) allow_next_grid();
}

// ---- forward, lean (flag fwd_lean, session 8): the same arithmetic in fewer instructions ----------
// torch.compile's Triton forward (one warp a row, like ours at C = 768 bf16) runs 1.8-3.9 us faster
// at 16384-65536 x 768 (kernels/NOTES.md, "Session 7: L"), and neither its block size nor its load
// forms were the reason. Its SASS is ~400 instructions a row, straight-line; forward_kernel's row
// path is about twice that (ncu, session 6: 0.66 instructions issued a cycle per scheduler in a
// kernel that should only wait on DRAM). Every instruction a warp issues after its row arrives
// keeps the warp, and so its slot for the next row's loads, away from DRAM. This kernel is
// forward_kernel for rows of ONE warp (G = 1: bf16 h up to 1024 columns, fp32 h up to 512) with:
//   - no run-time group arithmetic (forward_kernel divides threadIdx by 32 G) and no barriers;
//   - predicated loads and stores (load_if / store_if: one PTX instruction under a predicate, as
//     Triton writes them) instead of `if (chunk exists)` around each: the row's loads stay in one
//     basic block, where ptxas can keep them all in flight;
//   - the weight and bias chunks loaded all at once, early: WITH the row where the registers allow
//     (they come from L1 while x and r come from DRAM), else under the warp sums (PARAMS_AT),
//     rather than chunk by chunk between the stores;
//   - h rounded to TH once: packed for its store and unpacked (exact) for the statistics, where
//     forward_kernel rounded each element and then converted again to store;
//   - the weight and bias dtype a template argument (TP), not a run-time branch in every chunk.
// Bitwise the same h, mean, rstd and y as forward_kernel (the same operations in the same order).
// Parameters of E columns, as loaded: one 16-byte chunk, or two for 8 fp32 (bf16 h beside fp32 w).
template <typename TP, int E> struct ParamChunk {
    static constexpr int PIECE = E * int(sizeof(TP)) > 16 ? 16 / int(sizeof(TP)) : E;   // columns a load
    Chunk<TP, PIECE> piece[E / PIECE];
    __device__ __forceinline__ float operator[](int e) const { return piece[e / PIECE][e % PIECE]; }
};

// src[0 .. words) into c when pred, else zeros: ONE predicated load (no branch). volatile: kept
// after griddepcontrol.wait (pdl), as tk::load's loads are. NC (ld.global.nc, the read-only path):
// ptxas may then move the load above earlier stores (it assumes no aliasing), which is what the
// row's loads want; without it (plain ld.global) the load stays after the stores before it.
template <bool NC = true, typename T, int E> __device__ __forceinline__ void load_if(Chunk<T, E>& c, const T* src, bool pred) {
    c.zero();
    if constexpr (Chunk<T, E>::words == 4) {
        if constexpr (NC)
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t@p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                         : "+r"(c.word[0]), "+r"(c.word[1]), "+r"(c.word[2]), "+r"(c.word[3])
                         : "l"(src), "r"(int(pred)));
        else
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t@p ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                         : "+r"(c.word[0]), "+r"(c.word[1]), "+r"(c.word[2]), "+r"(c.word[3])
                         : "l"(src), "r"(int(pred)) : "memory");
    } else {
        if constexpr (NC)
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\t@p ld.global.nc.v2.u32 {%0, %1}, [%2];\n\t}"
                         : "+r"(c.word[0]), "+r"(c.word[1])
                         : "l"(src), "r"(int(pred)));
        else
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\t@p ld.global.v2.u32 {%0, %1}, [%2];\n\t}"
                         : "+r"(c.word[0]), "+r"(c.word[1])
                         : "l"(src), "r"(int(pred)) : "memory");
    }
}
template <bool NC = true, typename TP, int E> __device__ __forceinline__ void load_if(ParamChunk<TP, E>& c, const TP* src, bool pred) {
    constexpr int PIECE = ParamChunk<TP, E>::PIECE;
#pragma unroll
    for (int k = 0; k < E / PIECE; ++k) load_if<NC>(c.piece[k], src + k * PIECE, pred);
}

// E floats rounded to T (nearest even, as tk::store rounds) into one chunk's words.
template <typename T, int E> __device__ __forceinline__ Chunk<T, E> pack(const float (&v)[E]) {
    Chunk<T, E> c;
#pragma unroll
    for (int i = 0; i < Chunk<T, E>::words; ++i) {
        if constexpr (std::is_same_v<T, float>) {
            c.word[i] = __float_as_uint(v[i]);
        } else {
            const tk::bf16_2 p = tk::convert<tk::bf16_2>(make_float2(v[2 * i], v[2 * i + 1]));   // .x = lower address
            c.word[i] = *reinterpret_cast<const uint32_t*>(&p);
        }
    }
    return c;
}

// The chunk to dst when pred: ONE predicated st.global (no branch).
template <typename T, int E> __device__ __forceinline__ void store_if(T* dst, const Chunk<T, E>& c, bool pred) {
    if constexpr (Chunk<T, E>::words == 4) {
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t@p st.global.v4.u32 [%0], {%1, %2, %3, %4};\n\t}"
                     :: "l"(dst), "r"(c.word[0]), "r"(c.word[1]), "r"(c.word[2]), "r"(c.word[3]), "r"(int(pred))
                     : "memory");
    } else {
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\t@p st.global.v2.u32 [%0], {%1, %2};\n\t}"
                     :: "l"(dst), "r"(c.word[0]), "r"(c.word[1]), "r"(int(pred))
                     : "memory");
    }
}

enum class ParamsAt { with_row, with_h, after_stats };

// tk::warp_sum's butterfly (the same adds in the same order, so the same bits) with the lane masks
// as immediates: SHFL.BFLY instead of SHFL.IDX with five lane-index registers (tk::shfl_xor_sync
// computes laneid ^ mask), which the lean kernel's 64 registers cannot spare.
__device__ __forceinline__ float warp_sum_bfly(float v) {
#pragma unroll
    for (int mask = 16; mask >= 1; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
    return v;
}

template <typename TH, typename TR, typename TY, typename TP, int CHUNKS, bool EARLY_PDL>
__global__ void __launch_bounds__(BLOCK_THREADS, CHUNKS <= 3 ? 4 : 1)
forward_lean_kernel(const TH* __restrict__ x, const TR* __restrict__ r, const TP* __restrict__ w,
                    const TP* __restrict__ b, TY* __restrict__ y, TH* __restrict__ h,
                    float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int cols, float eps) {
    constexpr int E = 16 / int(sizeof(TH));   // columns per chunk
    // When the weight and bias chunks are loaded: with the row's loads where the registers allow
    // (a thread has 64 at four blocks an SM; CHUNKS = 4 has no such cap), else as soon as h is in
    // registers (their L1 round trip under the two warp sums), else after the statistics. The
    // byte budgets are where ptxas -v stops spilling (session 8, sm_90a).
    constexpr int ROW_BYTES = CHUNKS * E * (int(sizeof(TH)) + int(sizeof(TR)));   // x, r as loaded
    constexpr int PARAM_BYTES = 2 * CHUNKS * E * int(sizeof(TP));                  // w, b as loaded
    constexpr int V_BYTES = CHUNKS * E * 4;                                        // h as floats
    constexpr ParamsAt PARAMS_AT = CHUNKS > 3 || ROW_BYTES + PARAM_BYTES <= 160 ? ParamsAt::with_row
                                   : V_BYTES + PARAM_BYTES <= 128              ? ParamsAt::with_h
                                                                               : ParamsAt::after_stats;
    const int lane = threadIdx.x % 32;
    bool has[CHUNKS];   // chunk i of the row (columns col[i] ..) exists for this lane
    int col[CHUNKS];
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
        has[i] = lane + 32 * i < cols / E;
        col[i] = (lane + 32 * i) * E;
    }
    wait_for_previous_grid();   // pdl: x and r are written by kernels before this one
    if constexpr (EARLY_PDL) allow_next_grid();
    const int64_t stride = int64_t(gridDim.x) * BLOCK_WARPS;
    for (int64_t row = int64_t(blockIdx.x) * BLOCK_WARPS + threadIdx.x / 32; row < rows; row += stride) {
        const int64_t base = row * cols;

        // 1. The one read, and the parameters: every load issued before any is used.
        Chunk<TH, E> xc[CHUNKS];
        Chunk<TR, E> rc[CHUNKS];
        ParamChunk<TP, E> wc[CHUNKS], bc[CHUNKS];
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) load_if(xc[i], x + base + col[i], has[i]);
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) load_if(rc[i], r + base + col[i], has[i] && r != nullptr);
        // (Later than with the row: plain loads, which ptxas keeps after the h stores; read-only
        // ones it hoisted to the row's loads and spilled.)
        constexpr bool NC = PARAMS_AT == ParamsAt::with_row;
        auto load_params = [&] {
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                load_if<NC>(wc[i], w + col[i], has[i]);
                load_if<NC>(bc[i], b + col[i], has[i] && b != nullptr);
            }
        };
        if constexpr (PARAMS_AT == ParamsAt::with_row) load_params();

        // 2. h = x + r rounded to TH (packed once: the store's words), stored now; v holds it
        //    widened back (exact) for the statistics and y.
        float v[CHUNKS][E];
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            float sum[E];
#pragma unroll
            for (int e = 0; e < E; ++e) sum[e] = xc[i][e] + rc[i][e];
            const Chunk<TH, E> hc = pack<TH, E>(sum);
            store_if(h + base + col[i], hc, has[i] && h != nullptr);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                v[i][e] = hc[e];
                s += v[i][e];
            }
        }

        if constexpr (PARAMS_AT == ParamsAt::with_h) load_params();

        // 3. mean, then the variance from the same registers (missing chunks skipped).
        const float mean = warp_sum_bfly(s) / cols;
        float q = 0.0f;
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!has[i]) continue;
#pragma unroll
            for (int e = 0; e < E; ++e) q += (v[i][e] - mean) * (v[i][e] - mean);
        }
        const float rstd = rsqrtf(warp_sum_bfly(q) / cols + eps);

        // 4. y = xhat * w + b, rounded once to TY.
        if constexpr (PARAMS_AT == ParamsAt::after_stats) load_params();
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            float out[E];
#pragma unroll
            for (int e = 0; e < E; ++e) out[e] = (v[i][e] - mean) * rstd * wc[i][e] + bc[i][e];
            store_if(y + base + col[i], pack<TY, E>(out), has[i]);
        }
        if (lane == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
    }
    if constexpr (!EARLY_PDL) allow_next_grid();
}

// ---- backward: one read of h, dy and dh, one write of dh_out (and dr); dw, db summed on the way -
// Registers decide how many warps (so how many loads) are in flight. The 16-byte chunks ask for
// two blocks (16 warps) per SM, <= 128 registers a thread, where that costs no spills (up
// to 3 chunks: 24 bf16 a lane, C = 768 with one warp a row); with 4 chunks the 64 fp32 dw/db
// accumulators alone would not fit, so those get one block per SM.
// When TR differs from TH (a bf16 residual beside fp32 h) the residual's gradient is the same
// dh_out rounded to bf16: written here, next to dh_out, instead of by a cast kernel that would
// read dh_out back.
// reverse: walk the rows from the last to the first. The forward's persistent grid writes h from
// the first row to the last, so right after it the LAST rows of h are the ones still in L2.
template <typename TH, typename TY, int E, int CHUNKS> struct BackwardRow {
    Chunk<TH, E> h[CHUNKS], dh[CHUNKS];
    Chunk<TY, E> dy[CHUNKS];
    float mu, rs;   // the row's mean and rstd (zeros when not live)
    // Issue every load of `row` (zeros when !live; missing data reads as zero, which adds nothing
    // to dw, db or the row sums): in flight until first used.
    __device__ __forceinline__ void issue(const TY* dyp, const TH* dhp, const TH* hp, const float* mean,
                                          const float* rstd, int64_t row, int cols, bool live, const RowGroup& g) {
        const int64_t base = row * cols;
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            h[i].zero();
            dy[i].zero();
            dh[i].zero();
            if (live && g.has(i)) {
                tk::load(h[i], hp + base + g.col(i, E));
                tk::load(dy[i], dyp + base + g.col(i, E));
                if (dhp != nullptr) tk::load(dh[i], dhp + base + g.col(i, E));
            }
        }
        mu = live ? mean[row] : 0.0f;
        rs = live ? rstd[row] : 0.0f;
    }
};

// FIRST_STEPS (flags bwd_l2_first: 1, bwd_l2_first2: 2): before it waits for the kernel before it
// (pdl), each group asks L2 for the dy, dh and h rows of its first FIRST_STEPS row steps
// (prefetch_row_l2), so under pdl those reads overlap the forward's last blocks instead of
// starting after them. (Prefetching every next step inside the loop was measured too: slower.)
template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP, int FIRST_STEPS = 0>
__global__ void __launch_bounds__(BLOCK_THREADS, CHUNKS <= 3 ? 2 : 1)
backward_kernel(const TY* __restrict__ dy, const TH* __restrict__ dh, const TH* __restrict__ h,
                const float* __restrict__ mean, const float* __restrict__ rstd,
                const void* __restrict__ w, bool params_bf16, TH* __restrict__ dh_out,
                TR* __restrict__ dr_out, float* __restrict__ partial, int64_t rows, int cols, int G,
                bool reverse, bool tree, const int64_t* __restrict__ seed, uint32_t threshold, float scale) {
    constexpr int E = 16 / int(sizeof(TH));
    // r's gradient is its own tensor when r's dtype differs from h's, or with dropout
    // (dh_out * mask * scale); otherwise it is dh_out itself.
    constexpr bool WRITE_DR = !std::is_same_v<TH, TR> || DROP;
    __shared__ float2 scratch[BLOCK_WARPS];
    __shared__ __align__(16) float col_sums[2 * MAX_COLS];   // this block's dw (first cols) and db (next cols)
    const RowGroup g(G, cols / E);
    float dw[CHUNKS][E], db[CHUNKS][E];        // this thread's columns, summed over its rows
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i)
#pragma unroll
        for (int e = 0; e < E; ++e) dw[i][e] = db[i][e] = 0.0f;

    const int64_t stride = int64_t(gridDim.x) * g.rows_per_step;
    auto row_of = [&](int64_t step_row) { return reverse ? rows - 1 - step_row : step_row; };
#pragma unroll
    for (int k = 0; k < FIRST_STEPS; ++k) {
        const int64_t step_row = int64_t(blockIdx.x) * g.rows_per_step + g.slot + k * stride;
        if (step_row < rows) {
            prefetch_row_l2(dy, row_of(step_row), cols, g);
            if (dh != nullptr) prefetch_row_l2(dh, row_of(step_row), cols, g);
            prefetch_row_l2(h, row_of(step_row), cols, g);
        }
    }
    wait_for_previous_grid();   // pdl: dy, dh and h are written by kernels before this one
    DropoutMask mask{};
    if constexpr (DROP) mask = read_mask(seed, threshold, scale);   // the forward's seed: its mask
    int64_t first = int64_t(blockIdx.x) * g.rows_per_step;
    for (; first < rows; first += stride) {
        const int64_t step_row = first + g.slot;
        const bool live = step_row < rows;
        const int64_t row = row_of(step_row);
        const int64_t base = row * cols;

        // 1. The one read (all loads in flight together), kept as loaded.
        BackwardRow<TH, TY, E, CHUNKS> in;
        in.issue(dy, dh, h, mean, rstd, row, cols, live, g);
        const float mu = in.mu, rs = in.rs;

        // 2. dw, db, and this thread's part of sum(g) and sum(g * xhat), g = dy * w.
        float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!g.has(i)) continue;
            float wv[E];
            load_params<E>(wv, w, g.col(i, E), params_bf16);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const float xhat = (in.h[i][e] - mu) * rs;
                const float grad = in.dy[i][e] * wv[e];
                dw[i][e] += in.dy[i][e] * xhat;
                db[i][e] += in.dy[i][e];
                sums.x += grad;
                sums.y += grad * xhat;
            }
        }
        sums = group_sum(sums, g, scratch);
        const float mean_g = sums.x / cols, mean_gx = sums.y / cols;

        // 3. The one write: dh_out = dh + rstd * (g - mean(g) - xhat * mean(g * xhat)). xhat and
        //    g are recomputed (two multiply-adds) rather than kept: registers are the scarce
        //    thing here, they decide how many warps (and so how many loads) are in flight.
        if (live) {
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                if (!g.has(i)) continue;
                float wv[E], out[E];
                load_params<E>(wv, w, g.col(i, E), params_bf16);
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    const float xhat = (in.h[i][e] - mu) * rs;
                    const float grad = in.dy[i][e] * wv[e];
                    out[e] = in.dh[i][e] + rs * (grad - mean_g - xhat * mean_gx);
                }
                tk::store(dh_out + base + g.col(i, E), out);
                if constexpr (DROP) {   // r's gradient: dh_out where r was kept, times scale; else 0
                    float k[E];
                    keep_scale<E>(k, mask, base + g.col(i, E));
#pragma unroll
                    for (int e = 0; e < E; ++e) out[e] *= k[e];
                }
                if constexpr (WRITE_DR) tk::store(dr_out + base + g.col(i, E), out);   // in TR
            }
        }
    }
    allow_next_grid();   // the column sum may launch now; it waits for this grid to finish

    // 4. The block's dw, db: its row groups hold sums for the same columns; add them in a fixed
    //    order (so the result is reproducible), then write one row of partials.
    if (tree) {
        // bwd_tree: pairwise, log2(8/G) rounds. In each the upper half of the remaining groups
        // writes its sums to shared memory (vectors, all groups at once), the lower half adds
        // them; group 0 ends with the block's sums and writes them out.
        for (int width = g.rows_per_step / 2; width >= 1; width /= 2) {
            if (g.slot >= width && g.slot < 2 * width) {
                float* dst = col_sums + (g.slot - width) * 2 * cols;
#pragma unroll
                for (int i = 0; i < CHUNKS; ++i) {
                    if (!g.has(i)) continue;
                    store_vec(dst + g.col(i, E), dw[i]);
                    store_vec(dst + cols + g.col(i, E), db[i]);
                }
            }
            __syncthreads();
            if (g.slot < width) {
                const float* src = col_sums + g.slot * 2 * cols;
#pragma unroll
                for (int i = 0; i < CHUNKS; ++i) {
                    if (!g.has(i)) continue;
                    add_vec(dw[i], src + g.col(i, E));
                    add_vec(db[i], src + cols + g.col(i, E));
                }
            }
            __syncthreads();
        }
        if (g.slot == 0) {
            float* out = partial + int64_t(blockIdx.x) * 2 * cols;
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                if (!g.has(i)) continue;
                store_vec(out + g.col(i, E), dw[i]);
                store_vec(out + cols + g.col(i, E), db[i]);
            }
        }
        return;
    }
    // Otherwise one group after another, each adding its sums into shared memory.
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

// ---- backward, lean (flag bwd_lean, session 8): backward_kernel for rows of one warp ------------
// The forward_lean_kernel treatment (one warp a row, G = 1; predicated loads and stores in one basic
// block; no run-time group arithmetic or barriers in the row loop; the weight's dtype a template
// argument) applied to backward_kernel, plus: the weight's chunks are loaded once a row step and
// kept for both passes (backward_kernel loads them in each, chunk by chunk between the stores), and
// the bwd_l2_first(2) prefetch count is a run-time argument (first_steps) rather than an instance.
// Without dropout (with it, or G > 1, backward_kernel runs). The same arithmetic in the same order
// as backward_kernel: bitwise the same results for bf16 h; for fp32 h ptxas fuses one multiply-add
// differently (this kernel keeps g = dy * w from the first pass, backward_kernel recomputes it inside
// an FMA), so dx there may differ in its last bits (H200, session 8: within 1e-5 of the largest).
// G (flag bwd_wide, session 9): rows of TWO warps (G = 2, 3 chunks a thread: GPT-2's fp32 h at 768
// columns under autocast) in the same straight-line form: G is a template argument, so a thread's
// rank in its row and its row slot are shifts, and the two warps' sums meet through shared memory
// at one named barrier a row (pair_sum). G = 1 is session 8's kernel, the same PTX.
__device__ __forceinline__ float2 warp_sum_bfly(float2 v) {
#pragma unroll
    for (int mask = 16; mask >= 1; mask >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, mask);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, mask);
    }
    return v;
}

// The G warps of a row slot add their sums: each warp's (already warp-summed) v to shared memory,
// one named barrier for the slot's 32 G threads, then every thread adds the G values in the same
// order (backward_kernel's group_sum order: bitwise the same sums). scratch has two halves used by
// alternate rows (parity), so one barrier a row is enough: a warp writes a half again two rows
// later, after the barrier of the row between, which its partner reaches only after reading.
// (The barrier id is known only at run time, so ptxas reserves all 16 named barriers: at most 4 blocks
// an SM, and registers allow this kernel 2 anyway; group_barrier's comment says more.)
template <int G> __device__ __forceinline__ float2 pair_sum(float2 v, float2 (*scratch)[BLOCK_WARPS], int parity, int slot) {
    if (tk::laneid() == 0) scratch[parity][threadIdx.x / 32] = v;
    asm volatile("bar.sync %0, %1;" ::"r"(1 + slot), "n"(32 * G) : "memory");
    float2 total = scratch[parity][slot * G];
#pragma unroll
    for (int w = 1; w < G; ++w) total = add(total, scratch[parity][slot * G + w]);
    return total;
}

template <typename TH, typename TR, typename TY, typename TP, int CHUNKS, int G = 1>
__global__ void __launch_bounds__(BLOCK_THREADS, CHUNKS <= 3 ? 2 : 1)
backward_lean_kernel(const TY* __restrict__ dy, const TH* __restrict__ dh, const TH* __restrict__ h,
                     const float* __restrict__ mean, const float* __restrict__ rstd, const TP* __restrict__ w,
                     TH* __restrict__ dh_out, TR* __restrict__ dr_out, float* __restrict__ partial, int64_t rows,
                     int cols, bool reverse, int first_steps) {
    constexpr int E = 16 / int(sizeof(TH));
    constexpr bool WRITE_DR = !std::is_same_v<TH, TR>;   // r's gradient, when r's dtype differs from h's
    constexpr int SLOTS = BLOCK_WARPS / G;               // rows a block takes at once
    __shared__ __align__(16) float col_sums[2 * MAX_COLS];   // the block sum's tree (as backward_kernel's)
    const int t = threadIdx.x % (32 * G), slot = threadIdx.x / (32 * G);   // (G = 1: lane, warp)
    bool has[CHUNKS];
    int col[CHUNKS];
    float dw[CHUNKS][E], db[CHUNKS][E];   // this thread's columns, summed over its rows
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
        has[i] = t + 32 * G * i < cols / E;
        col[i] = (t + 32 * G * i) * E;
#pragma unroll
        for (int e = 0; e < E; ++e) dw[i][e] = db[i][e] = 0.0f;
    }
    const int64_t stride = int64_t(gridDim.x) * SLOTS;
    const int64_t first = int64_t(blockIdx.x) * SLOTS + slot;
    auto row_of = [&](int64_t step_row) { return reverse ? rows - 1 - step_row : step_row; };
    for (int k = 0; k < first_steps; ++k) {   // bwd_l2_first(2): ask L2 for the first rows before the wait
        const int64_t step_row = first + k * stride;
        if (step_row < rows) {
            const int64_t row = row_of(step_row);
            const RowGroup g(G, cols / E);
            prefetch_row_l2(dy, row, cols, g);
            if (dh != nullptr) prefetch_row_l2(dh, row, cols, g);
            prefetch_row_l2(h, row, cols, g);
        }
    }
    wait_for_previous_grid();   // pdl: dy, dh and h are written by kernels before this one
    [[maybe_unused]] int parity = 0;   // (G > 1) which half of pair_sum's scratch this row uses
    for (int64_t step_row = first; step_row < rows; step_row += stride) {
        const int64_t row = row_of(step_row);
        const int64_t base = row * cols;

        // 1. The one read, and the weight (from L1), all in flight together.
        Chunk<TH, E> hc[CHUNKS], dhc[CHUNKS];
        Chunk<TY, E> dyc[CHUNKS];
        ParamChunk<TP, E> wc[CHUNKS];
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            load_if(hc[i], h + base + col[i], has[i]);
            load_if(dyc[i], dy + base + col[i], has[i]);
            load_if(dhc[i], dh + base + col[i], has[i] && dh != nullptr);
        }
        const float mu = mean[row], rs = rstd[row];
        // The weight with the row, kept for both passes, where its registers fit (12: bf16 w beside
        // bf16 h, or fp32 w beside fp32 h); else loaded for each pass (plain loads: ptxas keeps them
        // where they are written instead of hoisting them to the row's).
        constexpr bool W_ONCE = CHUNKS * E * int(sizeof(TP)) <= 48;
        auto load_weight = [&] {
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) load_if<W_ONCE>(wc[i], w + col[i], has[i]);
        };
        load_weight();

        // 2. dw, db, and this thread's part of sum(g) and sum(g * xhat), g = dy * w.
        float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!has[i]) continue;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const float xhat = (hc[i][e] - mu) * rs;
                const float grad = dyc[i][e] * wc[i][e];
                dw[i][e] += dyc[i][e] * xhat;
                db[i][e] += dyc[i][e];
                sums.x += grad;
                sums.y += grad * xhat;
            }
        }
        sums = warp_sum_bfly(sums);
        if constexpr (G > 1) {
            __shared__ float2 scratch[2][BLOCK_WARPS];
            sums = pair_sum<G>(sums, scratch, parity, slot);
            parity ^= 1;
        }
        const float mean_g = sums.x / cols, mean_gx = sums.y / cols;

        // 3. The one write: dh_out = dh + rstd * (g - mean(g) - xhat * mean(g * xhat)).
        if constexpr (!W_ONCE) load_weight();
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            float out[E];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const float xhat = (hc[i][e] - mu) * rs;
                const float grad = dyc[i][e] * wc[i][e];
                out[e] = dhc[i][e] + rs * (grad - mean_g - xhat * mean_gx);
            }
            store_if(dh_out + base + col[i], pack<TH, E>(out), has[i]);
            if constexpr (WRITE_DR) store_if(dr_out + base + col[i], pack<TR, E>(out), has[i]);
        }
    }
    allow_next_grid();   // the column sum may launch now; it waits for this grid to finish

    // 4. The block's dw, db: backward_kernel's bwd_tree, row slot s in the place of row group s.
    for (int width = SLOTS / 2; width >= 1; width /= 2) {
        if (slot >= width && slot < 2 * width) {
            float* dst = col_sums + (slot - width) * 2 * cols;
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                if (!has[i]) continue;
                store_vec(dst + col[i], dw[i]);
                store_vec(dst + cols + col[i], db[i]);
            }
        }
        __syncthreads();
        if (slot < width) {
            const float* src = col_sums + slot * 2 * cols;
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                if (!has[i]) continue;
                add_vec(dw[i], src + col[i]);
                add_vec(db[i], src + cols + col[i]);
            }
        }
        __syncthreads();
    }
    if (slot == 0) {
        float* out = partial + int64_t(blockIdx.x) * 2 * cols;
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            if (!has[i]) continue;
            store_vec(out + col[i], dw[i]);
            store_vec(out + cols + col[i], db[i]);
        }
    }
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
    wait_for_previous_grid();   // launched early (programmatic dependent launch): partial is ready now
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

// ---- variants: runtime choices for measuring (set_variant / TK_LAYERNORM_VARIANT) -------------
// A plan is a set of flags; none of them is session 2's plan, DEFAULT_PLAN (below) the one
// measured best on the H200 (kernels/NOTES.md, "Session 3: LayerNorm speed"). Each flag changes
// one thing:
//   fwd_full     forward grid: a block per row step (the hardware fills SMs as blocks finish)
//                instead of a persistent grid of as many blocks as fit at once
//   bwd_tree     the backward's block sum of dw/db as a pairwise tree with vector accesses
//                instead of one row group after another
//   bwd_reverse  backward walks rows from the end (see backward_kernel)
//   pdl          every kernel launched as a programmatic dependent of the one before it (sm_90):
//                its launch overlaps the previous kernel's tail (the column sum the backward's,
//                the backward the forward's in a back-to-back fwd+bwd)
//   fwd_early_pdl    the forward lets the next kernel launch when each block starts (EARLY_PDL)
//   bwd_l2_first     the backward asks L2 for its first row step before its pdl wait (FIRST_STEPS 1)
//   bwd_l2_first2    the same for its first two row steps (FIRST_STEPS 2; wins over bwd_l2_first)
//                    (the three: session 6, instances without dropout only, so with dropout the
//                    plain kernels run; fwd_early_pdl and bwd_l2_first2 are in the default plan)
//   fwd_lean     rows of one warp (G = 1) run forward_lean_kernel (session 8; no dropout instances:
//                with dropout, or G > 1, forward_kernel runs)
//   bwd_lean     the same for the backward: backward_lean_kernel (always with bwd_tree's block sum)
//                (both in the default plan since session 8)
//   bwd_wide     rows of two warps with 3 chunks a thread (fp32 h 576..768, bf16 h 1088..1536 columns)
//                run backward_lean_kernel<..., G = 2> (session 9; no dropout, not bf16 h + fp32 w; in
//                the default plan since session 9). (Session 9's fwd_wide, the lean forward with one
//                warp a row at those widths, lost and was removed: code at commit d362a9e.)
struct Flag {
    const char* name;
    bool Variant::*field;
};
constexpr Flag FLAGS[] = {{"fwd_full", &Variant::fwd_full_grid},
                          {"bwd_reverse", &Variant::bwd_reverse},
                          {"bwd_tree", &Variant::bwd_tree},
                          {"pdl", &Variant::pdl},
                          {"fwd_early_pdl", &Variant::fwd_early_pdl},
                          {"bwd_l2_first", &Variant::bwd_l2_first},
                          {"bwd_l2_first2", &Variant::bwd_l2_first2},
                          {"fwd_lean", &Variant::fwd_lean},
                          {"bwd_lean", &Variant::bwd_lean},
                          {"bwd_wide", &Variant::bwd_wide}};

// The plan used unless TK_LAYERNORM_VARIANT or set_variant says otherwise ("default" names it).
// Chosen from the H200 measurements in kernels/NOTES.md; "none" is session 2's plan. Session 6's
// call 3 added fwd_early_pdl, bwd_l2_first2 and bwd_reverse: bench.py's fwd+bwd 65.2 -> 62.6 us at
// 16384x768, 114.3 -> 111.9 at 32768, 210.9 -> 208.6 at 65536 (same run, interleaved). Session 8
// added fwd_lean and bwd_lean (call 2, interleaved: 61.4 -> 57.0 us at 16384x768, 110.3 -> 105.6 at
// 32768, 206.5 -> 200.0 at 65536; eager 183.9 / 345.6 / 666.0). Session 9 added bwd_wide (GPT-2's
// rows of two warps, fp32 h under autocast, on the lean backward; layernorm_bench --interleaved
// --mixed, graphs, one run: backward 54.8 -> 49.5 us at 16384x768, 104.4 -> 97.0 at 32768, 203.6 ->
// 193.5 at 65536; fwd_wide lost 0.5-2.7 us at every size and was removed).
constexpr const char* DEFAULT_PLAN = "fwd_full,bwd_tree,pdl,fwd_early_pdl,bwd_l2_first2,bwd_reverse,fwd_lean,bwd_lean,bwd_wide";

// Flags are switched on one by one, starting from none; "default" switches on DEFAULT_PLAN's.
// An unknown name sets *error (when given) and is otherwise ignored.
Variant parse(const char* spec, std::string* error) {
    Variant v{};
    std::string s(spec), token;
    s += ',';
    for (char ch : s) {
        if (ch != ',' && ch != ' ') { token += ch; continue; }
        if (token == "default") {
            const Variant d = parse(DEFAULT_PLAN, nullptr);
            for (const Flag& f : FLAGS) v.*(f.field) = v.*(f.field) || d.*(f.field);
        } else if (!token.empty() && token != "none") {
            bool known = false;
            for (const Flag& f : FLAGS)
                if (token == f.name) { v.*(f.field) = true; known = true; }
            if (!known && error != nullptr && error->empty()) {
                *error = "unknown layernorm variant flag '" + token + "'; known: none, default,";
                for (const Flag& f : FLAGS) *error += std::string(" ") + f.name;
            }
        }
        token.clear();
    }
    return v;
}

Variant& current_variant() {
    static Variant v = [] {
        const char* env = std::getenv("TK_LAYERNORM_VARIANT");
        return parse(env != nullptr && env[0] != '\0' ? env : "default", nullptr);   // unknown flags ignored
    }();
    return v;
}

// ---- launchers: pick G and CHUNKS, size the grid, launch ----------------------------------------

struct Plan {
    int G;        // warps per row
    int chunks;   // chunks per thread (the CHUNKS template argument)
};

// The fewest warps a row (a power of 2) with at most MAX_CHUNKS 16-byte chunks a thread: at most
// 8 warps, since cols <= MAX_COLS.
Plan plan_for(int cols, DType h_dtype) {
    const int row_chunks = cols / (h_dtype == DType::bf16 ? 8 : 4);
    int G = 1;
    while (G * 32 * MAX_CHUNKS < row_chunks) G *= 2;
    return {G, (row_chunks + 32 * G - 1) / (32 * G)};
}

int sm_count_and_cc(int* cc_major) {
    static int sms = 0, major = 0;
    if (sms == 0) {
        int device = 0;
        cudaGetDevice(&device);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    }
    if (cc_major != nullptr) *cc_major = major;
    return sms;
}

// Blocks of the persistent grid: as many as fit on the GPU at once, but no more than there are
// row steps (all of them when `full`). Occupancy is asked of the runtime once per kernel
// (registers decide it).
template <auto kernel> int grid_for(int64_t rows, int G, bool full = false) {
    static int per_sm = 0;   // one per kernel instance (the template argument)
    if (per_sm == 0) {
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, BLOCK_THREADS, 0);
        if (per_sm < 1) per_sm = 1;
    }
    const int64_t steps = (rows + BLOCK_WARPS / G - 1) / (BLOCK_WARPS / G);
    const int64_t resident = int64_t(sm_count_and_cc(nullptr)) * per_sm;
    if (full) return int(steps < int64_t(1) << 30 ? steps : int64_t(1) << 30);   // the loop takes the rest
    return int(steps < resident ? steps : resident);
}

// Every launch goes through here: kernel<<<grid, block, 0, stream>>>(args...), and with the pdl
// variant (sm_90+) as a programmatic dependent of the kernel before it in the stream: it may be
// launched while that one finishes, and waits in wait_for_previous_grid() until it has.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
    int major = 0;
    sm_count_and_cc(&major);
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = current_variant().pdl && major >= 9 ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, Params(args)...);   // void* -> the kernel's T*
}

// The mask's threshold and scale from p (layernorm.h, Dropout): p is kept to 16 bits.
uint32_t drop_threshold(const Dropout& d) { return uint32_t(std::floor(d.p * 65536.0 + 0.5)); }
float keep_scale_of(const Dropout& d) { return float(1.0 / (1.0 - d.p)); }

// The forward and backward instances the plan asks for: f.template operator()<kernel>(). Session
// 6's flags have instances without dropout only; with dropout the plain instances run.
template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP, typename F> auto with_forward_kernel(F&& f) {
    if constexpr (!DROP) {
        if (current_variant().fwd_early_pdl) return f.template operator()<forward_kernel<TH, TR, TY, CHUNKS, DROP, true>>();
    }
    return f.template operator()<forward_kernel<TH, TR, TY, CHUNKS, DROP>>();
}

template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP, typename F> auto with_backward_kernel(F&& f) {
    if constexpr (!DROP) {
        const Variant& v = current_variant();
        if (v.bwd_l2_first2) return f.template operator()<backward_kernel<TH, TR, TY, CHUNKS, DROP, 2>>();
        if (v.bwd_l2_first) return f.template operator()<backward_kernel<TH, TR, TY, CHUNKS, DROP, 1>>();
    }
    return f.template operator()<backward_kernel<TH, TR, TY, CHUNKS, DROP>>();
}

template <typename TH, typename TR, typename TY, typename TP, int CHUNKS>
cudaError_t launch_forward_lean(const ForwardArgs& a, cudaStream_t stream) {
    auto go = [&]<auto kernel>() {
        return launch(kernel, grid_for<kernel>(a.rows, 1, current_variant().fwd_full_grid), BLOCK_THREADS, stream, a.x,
                      a.residual, a.weight, a.bias, a.y, a.h, a.mean, a.rstd, a.rows, a.cols, a.eps);
    };
    if (current_variant().fwd_early_pdl) return go.template operator()<forward_lean_kernel<TH, TR, TY, TP, CHUNKS, true>>();
    return go.template operator()<forward_lean_kernel<TH, TR, TY, TP, CHUNKS, false>>();
}

template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP>
cudaError_t launch_forward(const ForwardArgs& a, int G, cudaStream_t stream) {
    if constexpr (!DROP) {
        if (current_variant().fwd_lean && G == 1)
            return a.params_bf16 ? launch_forward_lean<TH, TR, TY, bf16, CHUNKS>(a, stream)
                                 : launch_forward_lean<TH, TR, TY, float, CHUNKS>(a, stream);
    }
    return with_forward_kernel<TH, TR, TY, CHUNKS, DROP>([&]<auto kernel>() {
        return launch(kernel, grid_for<kernel>(a.rows, G, current_variant().fwd_full_grid), BLOCK_THREADS, stream, a.x,
                      a.residual, a.weight, a.bias, a.params_bf16, a.y, a.h, a.mean, a.rstd, a.rows, a.cols, G, a.eps,
                      a.dropout.seed, drop_threshold(a.dropout), keep_scale_of(a.dropout));
    });
}

// Which lean backward runs, as the warps of its rows: 1 (bwd_lean: rows of one warp), 2 (bwd_wide:
// rows of two warps with 3 chunks a thread, e.g. fp32 h at 768 columns), or 0: backward_kernel. No
// dropout instances, and none for bf16 h beside fp32 parameters (the weight's 8 floats a chunk did
// not fit its registers at G = 1: spills).
template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP> int lean_backward_warps(int G, bool params_bf16) {
    if (DROP || (std::is_same_v<TH, bf16> && !params_bf16)) return 0;
    const Variant& v = current_variant();
    if (G == 1 && v.bwd_lean) return 1;
    if (G == 2 && CHUNKS == 3 && v.bwd_wide) return 2;
    return 0;
}

// f.template operator()<kernel>() for the lean backward instance of lean_backward_warps' answer (not 0).
template <typename TH, typename TR, typename TY, int CHUNKS, typename F> auto with_lean_backward_kernel(int warps, bool params_bf16, F&& f) {
    using TPf = std::conditional_t<std::is_same_v<TH, bf16>, bf16, float>;   // (bf16 h never has fp32 parameters here)
    if constexpr (CHUNKS == 3) {
        if (warps == 2)
            return params_bf16 ? f.template operator()<backward_lean_kernel<TH, TR, TY, bf16, CHUNKS, 2>>()
                               : f.template operator()<backward_lean_kernel<TH, TR, TY, TPf, CHUNKS, 2>>();
    }
    return params_bf16 ? f.template operator()<backward_lean_kernel<TH, TR, TY, bf16, CHUNKS>>()
                       : f.template operator()<backward_lean_kernel<TH, TR, TY, TPf, CHUNKS>>();
}

template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP> int backward_grid(const BackwardArgs& a, int G) {
    // (each kernel's own occupancy, which registers decide)
    if (const int warps = lean_backward_warps<TH, TR, TY, CHUNKS, DROP>(G, a.params_bf16))
        return with_lean_backward_kernel<TH, TR, TY, CHUNKS>(warps, a.params_bf16,
                                                             [&]<auto kernel>() { return grid_for<kernel>(a.rows, G); });
    return with_backward_kernel<TH, TR, TY, CHUNKS, DROP>([&]<auto kernel>() { return grid_for<kernel>(a.rows, G); });
}

template <typename TH, typename TR, typename TY, int CHUNKS, bool DROP>
cudaError_t launch_backward(const BackwardArgs& a, int G, cudaStream_t stream) {
    const int blocks = backward_grid<TH, TR, TY, CHUNKS, DROP>(a, G);
    cudaError_t err = cudaSuccess;
    if (const int warps = lean_backward_warps<TH, TR, TY, CHUNKS, DROP>(G, a.params_bf16)) {
        const Variant& v = current_variant();
        err = with_lean_backward_kernel<TH, TR, TY, CHUNKS>(warps, a.params_bf16, [&]<auto kernel>() {
            return launch(kernel, blocks, BLOCK_THREADS, stream, a.dy, a.dh, a.h, a.mean, a.rstd, a.weight, a.dh_out,
                          a.dresidual_out, a.partial, a.rows, a.cols, v.bwd_reverse, v.bwd_l2_first2 ? 2 : v.bwd_l2_first ? 1 : 0);
        });
    } else {
        err = with_backward_kernel<TH, TR, TY, CHUNKS, DROP>([&]<auto kernel>() {
            return launch(kernel, blocks, BLOCK_THREADS, stream, a.dy, a.dh, a.h, a.mean, a.rstd, a.weight, a.params_bf16,
                          a.dh_out, a.dresidual_out, a.partial, a.rows, a.cols, G, current_variant().bwd_reverse,
                          current_variant().bwd_tree, a.dropout.seed, drop_threshold(a.dropout), keep_scale_of(a.dropout));
        });
    }
    if (err != cudaSuccess) return err;
    return launch(column_sum_kernel, (2 * a.cols + 31) / 32, COLSUM_WARPS * 32, stream, a.partial, blocks, a.cols, a.dweight, a.dbias,
                  a.params_bf16);
}

// The dtype combinations there are kernels for: fp32 h with a float or bf16 residual and y, or
// bf16 everywhere. (h is x + r in the promoted dtype, so it is never narrower than r; y is h's
// dtype, or bf16 for a bf16 matmul.)
bool supported(DType h, DType r, DType y) {
    return h == DType::f32 || (r == DType::bf16 && y == DType::bf16);
}

// Calls f.template operator()<TH, TR, TY, CHUNKS, DROP>() for one instance: 5 dtype combinations
// x 4 chunk counts x with or without dropout. The caller has checked supported(h, r, y).
template <typename TH, typename TR, typename TY, bool DROP, typename F> auto with_chunks(int chunks, F& f) {
    switch (chunks) {
        case 1: return f.template operator()<TH, TR, TY, 1, DROP>();
        case 2: return f.template operator()<TH, TR, TY, 2, DROP>();
        case 3: return f.template operator()<TH, TR, TY, 3, DROP>();
        default: return f.template operator()<TH, TR, TY, 4, DROP>();
    }
}

template <typename TH, typename TR, typename TY, typename F> auto with_dropout(bool drop, int chunks, F& f) {
    return drop ? with_chunks<TH, TR, TY, true>(chunks, f) : with_chunks<TH, TR, TY, false>(chunks, f);
}

template <typename F> auto dispatch(DType h, DType r, DType y, bool drop, const Plan& p, F&& f) {
    if (h == DType::bf16) return with_dropout<bf16, bf16, bf16>(drop, p.chunks, f);
    if (r == DType::bf16)
        return y == DType::bf16 ? with_dropout<float, bf16, bf16>(drop, p.chunks, f)
                                : with_dropout<float, bf16, float>(drop, p.chunks, f);
    return y == DType::bf16 ? with_dropout<float, float, bf16>(drop, p.chunks, f)
                            : with_dropout<float, float, float>(drop, p.chunks, f);
}

// Dropout is on when the caller gave a seed; it needs 0 <= p < 1 (the bindings check that first).
bool dropout_on(const Dropout& d) { return d.seed != nullptr; }
bool dropout_ok(const Dropout& d) { return !dropout_on(d) || (d.p >= 0.0 && d.p < 1.0); }

// Without a residual there is no r: run the instance whose TR is TH (r is nullptr, never read).
DType residual_or_h(const ForwardArgs& a) { return a.residual != nullptr ? a.residual_dtype : a.x_dtype; }


}  // namespace

std::string set_variant(const char* spec) {
    std::string error;
    const Variant v = parse(spec, &error);
    if (error.empty()) current_variant() = v;
    return error;
}

std::string variant_name() {
    std::string s;
    for (const Flag& f : FLAGS)
        if (current_variant().*(f.field)) s += (s.empty() ? "" : ",") + std::string(f.name);
    return s.empty() ? "none" : s;
}

int backward_partial_blocks(const BackwardArgs& a) {
    if (!supported(a.h_dtype, a.residual_dtype, a.y_dtype)) return -1;
    const Plan p = plan_for(a.cols, a.h_dtype);
    return dispatch(a.h_dtype, a.residual_dtype, a.y_dtype, dropout_on(a.dropout), p,
                    [&]<typename TH, typename TR, typename TY, int CHUNKS, bool DROP>() {
                        return backward_grid<TH, TR, TY, CHUNKS, DROP>(a, p.G);
                    });
}

cudaError_t forward(const ForwardArgs& a, cudaStream_t stream) {
    const DType r = residual_or_h(a);
    if (!supported(a.x_dtype, r, a.y_dtype)) return cudaErrorInvalidValue;
    // dropout needs a residual to drop and a p in [0, 1)
    if (!dropout_ok(a.dropout) || (dropout_on(a.dropout) && a.residual == nullptr)) return cudaErrorInvalidValue;
    if (a.rows == 0) return cudaSuccess;
    const Plan p = plan_for(a.cols, a.x_dtype);
    return dispatch(a.x_dtype, r, a.y_dtype, dropout_on(a.dropout), p,
                    [&]<typename TH, typename TR, typename TY, int CHUNKS, bool DROP>() {
                        return launch_forward<TH, TR, TY, CHUNKS, DROP>(a, p.G, stream);
                    });
}

cudaError_t backward(const BackwardArgs& a, cudaStream_t stream) {
    if (!supported(a.h_dtype, a.residual_dtype, a.y_dtype)) return cudaErrorInvalidValue;
    if (!dropout_ok(a.dropout)) return cudaErrorInvalidValue;
    if (a.rows == 0) return cudaSuccess;   // (before the next check: an empty dresidual has no pointer)
    // dresidual_out is written exactly when the residual's dtype differs from h's, or with dropout.
    const bool write_dr = a.residual_dtype != a.h_dtype || dropout_on(a.dropout);
    if (write_dr != (a.dresidual_out != nullptr)) return cudaErrorInvalidValue;
    const Plan p = plan_for(a.cols, a.h_dtype);
    return dispatch(a.h_dtype, a.residual_dtype, a.y_dtype, dropout_on(a.dropout), p,
                    [&]<typename TH, typename TR, typename TY, int CHUNKS, bool DROP>() {
                        return launch_backward<TH, TR, TY, CHUNKS, DROP>(a, p.G, stream);
                    });
}

}  // namespace tk_layernorm

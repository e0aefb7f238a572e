// kernels/attention_portable.cu: causal (or full) flash attention for training, forward and
// backward, on warp-level tensor cores (mma.sync m16n8k16). Runs on sm_80, sm_86, sm_89, sm_90.
// This is the kernel to read first; the Hopper one (wgmma, TMA) does the same arithmetic.
//
// Read in this order: the algorithm (this comment), the shared-tile helpers, the forward
// kernel, then its variants 9 (D = 64's default since session 8) and 10 with the diagonal tiles as
// their own code path (attention_forward_split_kernel), the backward kernels (row sums, main, dQ conversion), the
// launchers at the bottom.
//
// ---- The algorithm --------------------------------------------------------------------
// Attention for one head: S = scale * Q K^T (T x T), P = softmax(S) row by row, O = P V.
// Materializing S costs T^2 memory; flash attention never does. A block of the forward kernel
// owns 64 rows of Q and walks over K and V in tiles of 64 rows, keeping for each of its rows
//   m = the largest score seen so far,  l = sum of exp(s - m) so far,  O = sum of exp(s - m) v.
// When a new tile raises the maximum from m to m', everything accumulated so far is rescaled
// by exp(m - m') ("online softmax"); at the end O / l is the exact softmax output. The
// exponentials are exp2 with the scale folded in: exp(scale*(s - m)) = 2^(s*c - m*c) with
// c = scale * log2(e), one FFMA and one ex2 per score (hopper-facts.md 11.1).
//
// The forward also writes LSE = m*scale + ln(l), the log of each row's softmax denominator.
// With it the backward can recompute any tile of P exactly, P = exp(scale*s - LSE), without
// the running maximum and without a second pass: that is why it is saved (4 bytes per row
// instead of T^2 probabilities).
//
// The backward (dO given): with D_i = sum_j dO_ij O_ij = rowsum(dO o O),
//   dV = P^T dO,   dP = dO V^T,   dS = P o (dP - D),   dQ = scale dS K,   dK = scale dS^T Q.
// A first small kernel computes D. The main kernel then gives each block 64 rows of K and V,
// walks over the tiles of Q (and dO, LSE, D) that can see them, recomputes P from LSE and
// accumulates dK and dV in registers. dQ gets contributions from every K/V block, so each
// block adds its share into an fp32 buffer with atomicAdd; a last kernel scales it and
// converts it to bf16.
//
// ---- How the work maps onto the hardware ----------------------------------------------
// A block is 4 warps (8 in some block shapes, see the launchers). In the forward pass each
// warp owns 16 query rows (or 2 x 16): its Q fragments stay
// in registers, S = Q K^T and O = P V are sequences of 16x8x16 mma.sync, and the softmax
// state (m, l) of a row lives in the 4 lanes that hold that row (a "quad"). P goes from the
// accumulator registers of S straight into the A operand of P V (the layouts line up). K and
// V tiles come through shared memory, loaded with cp.async two tiles deep, so the next tile
// loads while this one is computed. In the backward each warp owns 16 rows of K/V and works
// on transposed tiles (S^T = K Q^T), so dV and dK come straight from registers too; only dS
// goes through shared memory, for dQ.
//
// Sequence tails: rows past T are loaded as zeros (cp.async zero-fill) and their scores are
// masked to -inf, so any T >= 1 works without padding the tensors.
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "tk/sm80_instructions.cuh"
#include "attention_params.h"

namespace {

using namespace tk::sm80;
using bf16 = __nv_bfloat16;

constexpr int TILE = 64;                // query rows per step of the backward
constexpr float LOG2E = 1.4426950408889634f;

// ---- Shared tiles -------------------------------------------------------------------------
// A tile is ROWS x COLS bf16, row-major, with a swizzle: the 16-byte chunk c of row r is stored
// at chunk c ^ (r % 8). The 8 row addresses one ldmatrix reads (same chunk, 8 consecutive rows)
// then fall in 8 different bank groups instead of one (hopper-facts.md 3.1, 3.3).
template <int COLS>
__device__ __forceinline__ int swizzled(int row, int col) {
    static_assert(COLS % 64 == 0, "rows of at least 128 bytes (8 chunks) for the swizzle");
    return row * COLS + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

// Copy rows [row0, row0 + ROWS) of a (T x COLS) bf16 matrix into a shared tile with cp.async;
// rows at or past seq_len become zeros. All threads of the block take part.
template <int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* src, int64_t row_stride,
                                                int row0, int seq_len) {
    constexpr int CHUNKS = COLS / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NTHREADS) {
        int r = i / CHUNKS, c = i % CHUNKS;
        bool valid = row0 + r < seq_len;
        const bf16* from = valid ? src + (int64_t)(row0 + r) * row_stride + c * 8 : src;
        cp_async_16(tile + swizzled<COLS>(r, c * 8), from, valid);
    }
}

// A fragment (16 x 16, rows row0.., cols col0..) of a row-major shared tile.
template <int COLS>
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16* tile, int row0, int col0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + swizzled<COLS>(row0 + lane % 16, col0 + 8 * (lane / 16)));
}
// A fragment (16 x 16) of the TRANSPOSE of a shared tile: A[m][k] = tile[k0 + k][m0 + m].
template <int COLS>
__device__ __forceinline__ void load_a_transposed(uint32_t a[4], const bf16* tile, int m0, int k0) {
    int lane = threadIdx.x % 32, j = lane / 8;
    ldmatrix_x4_trans(a, tile + swizzled<COLS>(k0 + 8 * (j >> 1) + lane % 8, m0 + 8 * (j & 1)));
}
// B fragments for two 8-wide n blocks (n0, n0 + 8) and k = k0..k0+15, when the tile stores
// B^T, i.e. tile[n][k] (K for S = Q K^T). b[0], b[1]: block n0; b[2], b[3]: block n0 + 8.
template <int COLS>
__device__ __forceinline__ void load_b_from_rows(uint32_t b[4], const bf16* tile, int n0, int k0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(b, tile + swizzled<COLS>(n0 + 8 * (lane / 16) + lane % 8, k0 + 8 * ((lane / 8) % 2)));
}
// The same when the tile stores B itself, tile[k][n] (V for O = P V).
template <int COLS>
__device__ __forceinline__ void load_b_from_cols(uint32_t b[4], const bf16* tile, int n0, int k0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4_trans(b, tile + swizzled<COLS>(k0 + lane % 16, n0 + 8 * (lane / 16)));
}

// Accumulators of a 16 x N product: acc[n / 8][i] holds row g + 8 (i / 2), col n + 2t + i % 2.
// Two neighbouring 8-column blocks of it, rounded to bf16, are exactly an A fragment of a
// 16 x 16 operand, so P and dS feed the next mma without leaving registers.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16x2(lo[0], lo[1]);
    a[1] = pack_bf16x2(lo[2], lo[3]);
    a[2] = pack_bf16x2(hi[0], hi[1]);
    a[3] = pack_bf16x2(hi[2], hi[3]);
}

// Max / sum over the 4 lanes of a quad (they share a row of the accumulator layout).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ const bf16* head_ptr(const AttentionTensor& t, int b, int h) {
    return static_cast<const bf16*>(t.data) + b * t.stride_batch + h * t.stride_head;
}
__device__ __forceinline__ bf16* head_ptr_mut(const AttentionTensor& t, int b, int h) {
    return static_cast<bf16*>(t.data) + b * t.stride_batch + h * t.stride_head;
}

// ============================== forward ================================================
// Grid: (B * H, query tiles). Block: FWD_WARPS warps; each warp owns ROW_TILES x 16 query rows,
// so a block owns BLOCK_M = 16 * ROW_TILES * FWD_WARPS rows. Shared: the Q tile and 2 stages of
// (K, V) tiles of BLOCK_N rows. With ROW_TILES = 2 every K/V fragment read from shared memory
// feeds two mma instead of one, halving shared-memory traffic per flop (at the cost of registers).
template <int D, int FWD_WARPS, int ROW_TILES, int BLOCK_N, bool CAUSAL>
__global__ void __launch_bounds__(FWD_WARPS * 32)
attention_forward_kernel(const AttentionForwardParams p) {
    constexpr int RT = ROW_TILES, WARP_ROWS = 16 * RT, BLOCK_M = WARP_ROWS * FWD_WARPS, NT = FWD_WARPS * 32;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* q_tile = reinterpret_cast<bf16*>(smem);
    bf16* k_tiles = q_tile + BLOCK_M * D;       // [2][BLOCK_N * D]
    bf16* v_tiles = k_tiles + 2 * BLOCK_N * D;  // [2][BLOCK_N * D]

    const int T = p.shape.seq_len;
    const int bh = blockIdx.x, b = bh / p.shape.heads, h = bh % p.shape.heads;
    // Blocks start in order of blockIdx (x fastest). Causal tiles near the end of the sequence
    // have the most work, so they go first, for every head.
    const int m0 = (CAUSAL ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * BLOCK_M;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int warp_row0 = m0 + WARP_ROWS * warp;  // this warp's first query row

    const bf16* q = head_ptr(p.q, b, h);
    const bf16* k = head_ptr(p.k, b, h);
    const bf16* v = head_ptr(p.v, b, h);
    // Causal: tiles of K/V past the block's last row are never seen.
    const int kv_end = CAUSAL ? min(T, m0 + BLOCK_M) : T;
    const int n_tiles = (kv_end + BLOCK_N - 1) / BLOCK_N;

    load_tile_async<BLOCK_M, D, NT>(q_tile, q, p.q.stride_seq, m0, T);
    load_tile_async<BLOCK_N, D, NT>(k_tiles, k, p.k.stride_seq, 0, T);
    load_tile_async<BLOCK_N, D, NT>(v_tiles, v, p.v.stride_seq, 0, T);
    cp_async_commit();

    // Per row tile mt of this warp (rows warp_row0 + 16 mt ..): its Q as A fragments, its output
    // accumulator, and the softmax state of the two rows this lane holds (g and g + 8).
    const float c = p.shape.scale * LOG2E;       // scores -> log2 units
    uint32_t q_frag[RT][D / 16][4];
    float o[RT][D / 8][4] = {};
    float row_max[RT][2], row_sum[RT][2];        // raw-score maximum; this lane's part of l
    #pragma unroll
    for (int mt = 0; mt < RT; ++mt)
        #pragma unroll
        for (int r = 0; r < 2; ++r) row_max[mt][r] = -INFINITY, row_sum[mt][r] = 0.f;

    for (int j = 0; j < n_tiles; ++j) {
        const int n0 = j * BLOCK_N;
        // Prefetch the next K/V tile into the other stage, then wait for this one.
        if (j + 1 < n_tiles) {
            const int stage = (j + 1) % 2;
            load_tile_async<BLOCK_N, D, NT>(k_tiles + stage * BLOCK_N * D, k, p.k.stride_seq, n0 + BLOCK_N, T);
            load_tile_async<BLOCK_N, D, NT>(v_tiles + stage * BLOCK_N * D, v, p.v.stride_seq, n0 + BLOCK_N, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
            #pragma unroll
            for (int mt = 0; mt < RT; ++mt)
                #pragma unroll
                for (int kk = 0; kk < D / 16; ++kk)
                    load_a<D>(q_frag[mt][kk], q_tile, WARP_ROWS * warp + 16 * mt, 16 * kk);
        }
        const bf16* k_tile = k_tiles + (j % 2) * BLOCK_N * D;
        const bf16* v_tile = v_tiles + (j % 2) * BLOCK_N * D;

        // A warp whose rows all lie before this tile (causal) has nothing to add.
        if (!CAUSAL || n0 <= warp_row0 + WARP_ROWS - 1) {
            // S = Q K^T for this warp's rows x BLOCK_N keys.
            float s[RT][BLOCK_N / 8][4] = {};
            #pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                #pragma unroll
                for (int nb = 0; nb < BLOCK_N / 16; ++nb) {
                    uint32_t kb[4];
                    load_b_from_rows<D>(kb, k_tile, 16 * nb, 16 * kk);
                    #pragma unroll
                    for (int mt = 0; mt < RT; ++mt) {
                        mma_bf16_16816(s[mt][2 * nb], q_frag[mt][kk], kb[0], kb[1]);
                        mma_bf16_16816(s[mt][2 * nb + 1], q_frag[mt][kk], kb[2], kb[3]);
                    }
                }
            }
            #pragma unroll
            for (int mt = 0; mt < RT; ++mt) {
                const int tile_row0 = warp_row0 + 16 * mt;
                // Mask keys past T, and (causal) keys after the query.
                const bool needs_mask = n0 + BLOCK_N > T || (CAUSAL && n0 + BLOCK_N - 1 > tile_row0);
                if (needs_mask) {
                    #pragma unroll
                    for (int nb = 0; nb < BLOCK_N / 8; ++nb)
                        #pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            int row = tile_row0 + g + 8 * (i / 2), col = n0 + 8 * nb + 2 * t + i % 2;
                            if (col >= T || (CAUSAL && col > row)) s[mt][nb][i] = -INFINITY;
                        }
                }
                // Online softmax: new maxima, rescale what we have, exponentiate this tile.
                float scale_old[2], max_c[2];
                #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float mx = row_max[mt][r];
                    #pragma unroll
                    for (int nb = 0; nb < BLOCK_N / 8; ++nb)
                        mx = fmaxf(mx, fmaxf(s[mt][nb][2 * r], s[mt][nb][2 * r + 1]));
                    mx = quad_max(mx);
                    // A row that has seen only masked keys keeps max -inf; use 0 so that
                    // exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
                    const float safe = mx == -INFINITY ? 0.f : mx;
                    scale_old[r] = exp2_approx((row_max[mt][r] - safe) * c);  // 0 on the first tile
                    max_c[r] = safe * c;
                    row_max[mt][r] = mx;
                    row_sum[mt][r] *= scale_old[r];
                }
                #pragma unroll
                for (int nb = 0; nb < BLOCK_N / 8; ++nb)
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        s[mt][nb][i] = exp2_approx(s[mt][nb][i] * c - max_c[i / 2]);  // now P (unnormalized)
                        row_sum[mt][i / 2] += s[mt][nb][i];
                    }
                #pragma unroll
                for (int db = 0; db < D / 8; ++db)
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) o[mt][db][i] *= scale_old[i / 2];
            }
            // O += P V: P straight from registers, V fragments from shared memory.
            #pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                uint32_t pa[RT][4];
                #pragma unroll
                for (int mt = 0; mt < RT; ++mt) acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
                #pragma unroll
                for (int db = 0; db < D / 16; ++db) {
                    uint32_t vb[4];
                    load_b_from_cols<D>(vb, v_tile, 16 * db, 16 * kk);
                    #pragma unroll
                    for (int mt = 0; mt < RT; ++mt) {
                        mma_bf16_16816(o[mt][2 * db], pa[mt], vb[0], vb[1]);
                        mma_bf16_16816(o[mt][2 * db + 1], pa[mt], vb[2], vb[3]);
                    }
                }
            }
        }
        __syncthreads();  // everyone is done with this stage before it is refilled
    }

    // O / l, and LSE = m * scale + ln(l). Rows past T are not written.
    bf16* out = head_ptr_mut(p.o, b, h);
    float* lse = p.lse + (int64_t)bh * T;
    #pragma unroll
    for (int mt = 0; mt < RT; ++mt)
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = quad_sum(row_sum[mt][r]);
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int row = warp_row0 + 16 * mt + g + 8 * r;
            if (row < T) {
                #pragma unroll
                for (int db = 0; db < D / 8; ++db) {
                    uint32_t packed = pack_bf16x2(o[mt][db][2 * r] * inv, o[mt][db][2 * r + 1] * inv);
                    *reinterpret_cast<uint32_t*>(out + (int64_t)row * p.o.stride_seq + 8 * db + 2 * t) = packed;
                }
                if (t == 0) lse[row] = l > 0.f ? row_max[mt][r] * p.shape.scale + logf(l) : -INFINITY;
            }
        }
}

// ---- Forward variants 9 and 10: the diagonal tiles as their own code path (session 7, P2) ----
// Session 7's causal skips (git 1e193c6) put a warp-uniform `if (!live) continue` between the
// unrolled mma.sync of EVERY tile: the matrix products fell into basic blocks and the kernel lost
// 50%. Here a 64-key tile's kind is known before its code starts, and every kind has its own
// fully unrolled code, with no branch inside:
//   plain      every tile left of the diagonal (all but 2 per block): no mask at all;
//   diagonal   the 2 tiles that hold the block's diagonal (causal): the mask col > row, and the
//              16-key chunks that NO warp's rows can see are left out at compile time;
//   tail       (full attention) the last tile when T is not a multiple of 64: col >= T.
// The row tiles of the warps interleave as in FA2's forward (its tiled mma puts the 4 warps along
// M, repeated twice for 128 rows): warp w owns block rows 16w.. and 64 + 16w.., so every warp has
// the same work on a diagonal tile (variant 3's warps 0, 1 idle while 2, 3 finish the second),
// and a chunk that row tile mt cannot see is the same chunk for every warp: a compile-time fact
// (the second diagonal tile is dead for row tile 0 and skipped whole).
//   variant 10 = variant 3's shape (128 query rows, 4 warps, Q in registers, 64-key tiles, a
//                cp.async stage and a barrier per tile) with the code paths and interleaved rows.
//   variant 9  = the same with 128-key stages: each barrier and cp.async wait covers two 64-key
//                tiles (half of 10's barriers per key; the softmax still runs per 64 keys).
// Not built: FA2's own forward shape at head_dim 64 (128 x 128 tiles, 4 warps, Q re-read from
// shared memory): with one softmax per 128 keys ptxas spilled 116-428 bytes (sm_90a, 255
// registers) in every arrangement tried (kernels/NOTES.md, session 7, P2).
// D = 64 only (the accumulators of two row tiles at D = 128 do not fit in registers).
constexpr int SPLIT_WARPS = 4, SPLIT_ROW_TILES = 2, SPLIT_BLOCK_M = 16 * SPLIT_WARPS * SPLIT_ROW_TILES;
constexpr int SPLIT_TILE_N = 64;   // keys per tile of math (a stage holds 1 or 2)

// The 16-key chunks of a tile that row tile mt of SOME warp can see. DIAG < 0: not a diagonal
// tile, all of them; else the tile starts DIAG keys after the block's first row, and row tile mt
// spans block rows [16 W mt, 16 W (mt + 1)), so chunks from 16 W (mt + 1) - DIAG on are dead.
template <int DIAG>
__host__ __device__ constexpr int live_chunks(int mt) {
    constexpr int ALL = SPLIT_TILE_N / 16;
    if (DIAG < 0) return ALL;
    const int live = SPLIT_WARPS * (mt + 1) - DIAG / 16;
    return live < 0 ? 0 : live > ALL ? ALL : live;
}

// One 64-key tile for this warp's two row tiles: S = Q K^T, mask (DIAG >= 0: col > row; TAIL:
// col >= T), online softmax, O += P V. Every loop bound and `if` below is a compile-time constant
// once the loops are unrolled, so the mma.sync of a tile form one straight-line block. (Inside a
// loop over mt, the inner loops run to full length with an `if` on LIVE[mt] instead of stopping
// at LIVE[mt]: a bound that depends on the outer mt is not constant when the inner loop is
// unrolled first, and the partly unrolled loop then indexes s at run time, which puts s in local
// memory: 256 bytes of stack in a first version.)
template <int D, int DIAG, bool TAIL>
__device__ __forceinline__ void forward_split_tile(
    const uint32_t (&q_frag)[SPLIT_ROW_TILES][D / 16][4], const bf16* k_tile, const bf16* v_tile,
    float (&o)[SPLIT_ROW_TILES][D / 8][4], float (&row_max)[SPLIT_ROW_TILES][2],
    float (&row_sum)[SPLIT_ROW_TILES][2], int m0, int n0, int T, float c) {
    constexpr int RT = SPLIT_ROW_TILES, BLOCK_N = SPLIT_TILE_N;
    constexpr int LIVE[RT] = {live_chunks<DIAG>(0), live_chunks<DIAG>(1)};
    constexpr int ANY_LIVE = LIVE[0] > LIVE[1] ? LIVE[0] : LIVE[1];   // chunks some row tile needs
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    // S = Q K^T over the live chunks (a K fragment is loaded once for both row tiles).
    float s[RT][BLOCK_N / 8][4];
    #pragma unroll
    for (int mt = 0; mt < RT; ++mt)
        #pragma unroll
        for (int nb = 0; nb < BLOCK_N / 8; ++nb)
            #pragma unroll
            for (int i = 0; i < 4; ++i) s[mt][nb][i] = 0.f;
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        #pragma unroll
        for (int nb = 0; nb < ANY_LIVE; ++nb) {
            uint32_t kb[4];
            load_b_from_rows<D>(kb, k_tile, 16 * nb, 16 * kk);
            #pragma unroll
            for (int mt = 0; mt < RT; ++mt) {
                if (nb >= LIVE[mt]) continue;
                mma_bf16_16816(s[mt][2 * nb], q_frag[mt][kk], kb[0], kb[1]);
                mma_bf16_16816(s[mt][2 * nb + 1], q_frag[mt][kk], kb[2], kb[3]);
            }
        }

    #pragma unroll
    for (int mt = 0; mt < RT; ++mt) {
        if (LIVE[mt] == 0) continue;   // nothing seen: m, l and O stay as they are
        if constexpr (DIAG >= 0 || TAIL) {
            // Causal: col > row (for a row < T this also covers col >= T; rows >= T are not
            // stored). Full attention's tail: col >= T.
            const int tile_row0 = m0 + 16 * (warp + SPLIT_WARPS * mt);
            #pragma unroll
            for (int nb = 0; nb < BLOCK_N / 8; ++nb)
                #pragma unroll
                for (int i = 0; i < 4; ++i) {
                    if (nb >= 2 * LIVE[mt]) continue;
                    const int row = tile_row0 + g + 8 * (i / 2), col = n0 + 8 * nb + 2 * t + i % 2;
                    if ((DIAG >= 0 && col > row) || (TAIL && col >= T)) s[mt][nb][i] = -INFINITY;
                }
        }
        // Online softmax over the live chunks (as in attention_forward_kernel).
        float scale_old[2], max_c[2];
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[mt][r];
            #pragma unroll
            for (int nb = 0; nb < BLOCK_N / 8; ++nb)
                if (nb < 2 * LIVE[mt]) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * r], s[mt][nb][2 * r + 1]));
            mx = quad_max(mx);
            const float safe = mx == -INFINITY ? 0.f : mx;
            scale_old[r] = exp2_approx((row_max[mt][r] - safe) * c);
            max_c[r] = safe * c;
            row_max[mt][r] = mx;
            row_sum[mt][r] *= scale_old[r];
        }
        #pragma unroll
        for (int nb = 0; nb < BLOCK_N / 8; ++nb)
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (nb >= 2 * LIVE[mt]) continue;
                s[mt][nb][i] = exp2_approx(s[mt][nb][i] * c - max_c[i / 2]);
                row_sum[mt][i / 2] += s[mt][nb][i];
            }
        #pragma unroll
        for (int db = 0; db < D / 8; ++db)
            #pragma unroll
            for (int i = 0; i < 4; ++i) o[mt][db][i] *= scale_old[i / 2];
    }

    // O += P V over the live chunks (a V fragment is loaded once for both row tiles).
    #pragma unroll
    for (int kk = 0; kk < ANY_LIVE; ++kk) {
        uint32_t pa[RT][4];
        #pragma unroll
        for (int mt = 0; mt < RT; ++mt)
            if (kk < LIVE[mt]) acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
        #pragma unroll
        for (int db = 0; db < D / 16; ++db) {
            uint32_t vb[4];
            load_b_from_cols<D>(vb, v_tile, 16 * db, 16 * kk);
            #pragma unroll
            for (int mt = 0; mt < RT; ++mt) {
                if (kk >= LIVE[mt]) continue;
                mma_bf16_16816(o[mt][2 * db], pa[mt], vb[0], vb[1]);
                mma_bf16_16816(o[mt][2 * db + 1], pa[mt], vb[2], vb[3]);
            }
        }
    }
}

// load_tile_async with the trip count known at compile time (ROWS * COLS / 8 a multiple of
// NTHREADS): unrolled, each thread's rows are its first row + a constant, so the copies need no
// loop state (with load_tile_async's loop the split kernels spilled 20-44 bytes of addresses).
template <int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void load_tile_async_unrolled(bf16* tile, const bf16* src, int64_t row_stride,
                                                         int row0, int seq_len) {
    constexpr int CHUNKS = COLS / 8;  // 16-byte chunks per row
    static_assert(ROWS * CHUNKS % NTHREADS == 0 && NTHREADS % CHUNKS == 0, "whole rows per pass");
    const int r0 = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
    #pragma unroll
    for (int it = 0; it < ROWS * CHUNKS / NTHREADS; ++it) {
        const int r = r0 + it * (NTHREADS / CHUNKS);
        const bool valid = row0 + r < seq_len;
        const bf16* from = valid ? src + (int64_t)(row0 + r) * row_stride + c * 8 : src;
        cp_async_16(tile + swizzled<COLS>(r, c * 8), from, valid);
    }
}

// Grid: (B * H, query blocks of 128 rows). Block: 4 warps. Shared: Q (128 rows) and 2 stages of
// (K, V) of STAGE_KEYS rows (64 or 128), loaded with cp.async one stage ahead, as in
// attention_forward_kernel. The stage's rows keep their swizzle when a 64-key tile starts 64 rows
// in (the swizzle depends on row % 8), so a 128-row stage is two 64-row tiles back to back.
template <int D, int STAGE_KEYS, bool CAUSAL>
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
attention_forward_split_kernel(const AttentionForwardParams p) {
    constexpr int RT = SPLIT_ROW_TILES, BLOCK_M = SPLIT_BLOCK_M, NT = SPLIT_WARPS * 32, TN = SPLIT_TILE_N;
    constexpr int TILES = STAGE_KEYS / TN;   // 64-key tiles per stage
    static_assert(D == 64 && STAGE_KEYS % TN == 0 && BLOCK_M % STAGE_KEYS == 0,
                  "head_dim 64; a stage starting on the block's first row holds whole diagonal tiles");
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* q_tile = reinterpret_cast<bf16*>(smem);
    bf16* k_stages = q_tile + BLOCK_M * D;          // [2][STAGE_KEYS * D]
    bf16* v_stages = k_stages + 2 * STAGE_KEYS * D;  // [2][STAGE_KEYS * D]

    const int T = p.shape.seq_len;
    const int bh = blockIdx.x, b = bh / p.shape.heads, h = bh % p.shape.heads;
    const int m0 = (CAUSAL ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * BLOCK_M;   // longest first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const bf16* q = head_ptr(p.q, b, h);
    const bf16* k = head_ptr(p.k, b, h);
    const bf16* v = head_ptr(p.v, b, h);
    const int kv_end = CAUSAL ? min(T, m0 + BLOCK_M) : T;
    const int n_stages = (kv_end + STAGE_KEYS - 1) / STAGE_KEYS;
    // Stages [0, n_plain) hold only plain tiles: causal, they end at or before the block's first
    // row (which is < T); full attention, they end at or before T.
    const int n_plain = CAUSAL ? m0 / STAGE_KEYS : T / STAGE_KEYS;

    load_tile_async_unrolled<BLOCK_M, D, NT>(q_tile, q, p.q.stride_seq, m0, T);
    load_tile_async_unrolled<STAGE_KEYS, D, NT>(k_stages, k, p.k.stride_seq, 0, T);
    load_tile_async_unrolled<STAGE_KEYS, D, NT>(v_stages, v, p.v.stride_seq, 0, T);
    cp_async_commit();

    const float c = p.shape.scale * LOG2E;
    uint32_t q_frag[RT][D / 16][4];
    float o[RT][D / 8][4] = {};
    float row_max[RT][2], row_sum[RT][2];
    #pragma unroll
    for (int mt = 0; mt < RT; ++mt)
        #pragma unroll
        for (int r = 0; r < 2; ++r) row_max[mt][r] = -INFINITY, row_sum[mt][r] = 0.f;

    // Before stage j: prefetch stage j + 1 into the other buffer, wait for stage j, barrier.
    auto start_stage = [&](int j) {
        if (j + 1 < n_stages) {
            const int buf = (j + 1) % 2, next0 = (j + 1) * STAGE_KEYS;
            load_tile_async_unrolled<STAGE_KEYS, D, NT>(k_stages + buf * STAGE_KEYS * D, k, p.k.stride_seq, next0, T);
            load_tile_async_unrolled<STAGE_KEYS, D, NT>(v_stages + buf * STAGE_KEYS * D, v, p.v.stride_seq, next0, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {   // Q came with stage 0
            #pragma unroll
            for (int mt = 0; mt < RT; ++mt)
                #pragma unroll
                for (int kk = 0; kk < D / 16; ++kk)
                    load_a<D>(q_frag[mt][kk], q_tile, 16 * (warp + SPLIT_WARPS * mt), 16 * kk);
        }
    };
    // Tile u (0..TILES-1) of stage j, of a given kind (diag: std::integral_constant, -1 = not a
    // diagonal tile, else its DIAG; tail: std::bool_constant).
    auto tile = [&](int j, int u, auto diag, auto tail) {
        const int offset = ((j % 2) * STAGE_KEYS + u * TN) * D;
        forward_split_tile<D, decltype(diag)::value, decltype(tail)::value>(
            q_frag, k_stages + offset, v_stages + offset, o, row_max, row_sum, m0, j * STAGE_KEYS + u * TN, T, c);
    };
    using Plain = std::integral_constant<int, -1>;
    int j = 0;
    for (; j < n_plain; ++j) {   // the hot loop: plain tiles only
        start_stage(j);
        #pragma unroll 1   // unrolled, ptxas hoists the second tile's loads into the first: spills
        for (int u = 0; u < TILES; ++u) tile(j, u, Plain{}, std::false_type{});
        __syncthreads();   // everyone is done with this buffer before it is refilled
    }
    // The rest, straight-line code (no loop around the tile bodies: with one, ptxas spilled).
    using Diag0 = std::integral_constant<int, 0>;     // the tile that starts on the block's row 0
    using Diag64 = std::integral_constant<int, TN>;   // the one 64 rows in
    if constexpr (CAUSAL) {
        // Stage n_plain starts on the block's first row m0 (< T): its tile 0 is Diag0, and the
        // Diag64 tile follows in the same stage (128-key stages) or the next (64-key stages).
        start_stage(j);
        tile(j, 0, Diag0{}, std::false_type{});
        if constexpr (TILES == 2) {
            if (m0 + TN < kv_end) tile(j, 1, Diag64{}, std::false_type{});
        } else if (j + 1 < n_stages) {
            __syncthreads();
            start_stage(++j);
            tile(j, 0, Diag64{}, std::false_type{});
        }
    } else if (j < n_stages) {   // full attention: a last, partial stage, masked at T
        start_stage(j);
        #pragma unroll
        for (int u = 0; u < TILES; ++u)
            if (j * STAGE_KEYS + u * TN < T) tile(j, u, Plain{}, std::true_type{});
    }

    // O / l, and LSE = m * scale + ln(l). Rows past T are not written.
    bf16* out = head_ptr_mut(p.o, b, h);
    float* lse = p.lse + (int64_t)bh * T;
    #pragma unroll
    for (int mt = 0; mt < RT; ++mt)
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = quad_sum(row_sum[mt][r]);
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int row = m0 + 16 * (warp + SPLIT_WARPS * mt) + g + 8 * r;
            if (row < T) {
                #pragma unroll
                for (int db = 0; db < D / 8; ++db) {
                    uint32_t packed = pack_bf16x2(o[mt][db][2 * r] * inv, o[mt][db][2 * r + 1] * inv);
                    *reinterpret_cast<uint32_t*>(out + (int64_t)row * p.o.stride_seq + 8 * db + 2 * t) = packed;
                }
                if (t == 0) lse[row] = l > 0.f ? row_max[mt][r] * p.shape.scale + logf(l) : -INFINITY;
            }
        }
}

// ============================== backward ================================================
// Kernel 1: D = rowsum(dO o O) in fp32, one warp per row.
template <int D>
__global__ void __launch_bounds__(256)
attention_backward_rowsum_kernel(const AttentionBackwardParams p) {
    const int T = p.shape.seq_len;
    const int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;  // over B * H * T
    if (row >= (int64_t)p.shape.batch * p.shape.heads * T) return;
    const int lane = threadIdx.x % 32;
    const int bh = row / T, tt = row % T, b = bh / p.shape.heads, h = bh % p.shape.heads;
    const bf16* o = head_ptr(p.o, b, h) + (int64_t)tt * p.o.stride_seq;
    const bf16* d_o = head_ptr(p.d_o, b, h) + (int64_t)tt * p.d_o.stride_seq;
    float sum = 0.f;
    for (int col = 2 * lane; col < D; col += 64) {
        __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(o + col);
        __nv_bfloat162 y = *reinterpret_cast<const __nv_bfloat162*>(d_o + col);
        sum += __bfloat162float(x.x) * __bfloat162float(y.x) + __bfloat162float(x.y) * __bfloat162float(y.y);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) p.d_rowsum[row] = sum;
}

// Kernel 1 of variant 3 (the default since session 7): the same row sums, and dq_accum zeroed in
// the same pass, in place of a separate memset. D / 8 threads per row, 16-byte loads of O and dO,
// 16-byte stores of zeros; the row's partial sums meet by shuffles within those lanes. At the
// GPT-2 shape: 26 us, where the memset and the one-warp-per-row kernel took 12 + 41 us.
template <int D>
__global__ void __launch_bounds__(256)
attention_backward_prep_kernel(const AttentionBackwardParams p) {
    constexpr int LANES = D / 8;   // threads per row: 8 (D = 64) or 16 (D = 128), within one warp
    const int T = p.shape.seq_len;
    const int64_t row = ((int64_t)blockIdx.x * 256 + threadIdx.x) / LANES;   // over B * H * T
    const int piece = threadIdx.x % LANES, col = 8 * piece;
    const int64_t rows = (int64_t)p.shape.batch * p.shape.heads * T;
    float sum = 0.f;
    if (row < rows) {
        const int bh = row / T, tt = row % T, b = bh / p.shape.heads, h = bh % p.shape.heads;
        const uint4 x = *reinterpret_cast<const uint4*>(head_ptr(p.o, b, h) + (int64_t)tt * p.o.stride_seq + col);
        const uint4 y = *reinterpret_cast<const uint4*>(head_ptr(p.d_o, b, h) + (int64_t)tt * p.d_o.stride_seq + col);
        __nv_bfloat162 xs[4], ys[4];   // memcpy, not a pointer cast: a cast breaks aliasing rules
        memcpy(xs, &x, sizeof(x));
        memcpy(ys, &y, sizeof(y));
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 a = __bfloat1622float2(xs[i]), c = __bfloat1622float2(ys[i]);
            sum += a.x * c.x + a.y * c.y;
        }
        float4* zero_to = reinterpret_cast<float4*>(p.dq_accum + row * D + col);
        zero_to[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        zero_to[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    // Every lane of the warp takes part (rows past the end add 0), so the full mask is right.
    #pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (row < rows && piece == 0) p.d_rowsum[row] = sum;
}

// Kernel 2: dK, dV for the KEYS = 16 * BWD_WARPS rows of K/V of a block, and this block's
// share of dQ. Each warp owns 16 keys; the block walks over query tiles of TILE rows.
// Grid: (B * H, K/V tiles). Shared: K, V tiles; 2 x (Q, dO) tiles with their LSE and D; dS.
// KV_IN_REGS (variants 2, 3): the warp's K and V fragments (the A operands of S^T = K Q^T and
// dP^T = V dO^T) are read from shared memory once, not at every query tile (the same speed on the
// H200 in session 7: 444.6 vs 446.1 us at GPT-2; kept as variant 3's main kernel, which is what
// was measured and tested).
template <int D, int BWD_WARPS, bool CAUSAL, bool KV_IN_REGS = false>
__global__ void __launch_bounds__(BWD_WARPS * 32)
attention_backward_kernel(const AttentionBackwardParams p) {
    constexpr int KEYS = 16 * BWD_WARPS, NT = 32 * BWD_WARPS;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* k_tile = reinterpret_cast<bf16*>(smem);
    bf16* v_tile = k_tile + KEYS * D;
    bf16* q_tiles = v_tile + KEYS * D;          // [2][TILE * D]
    bf16* do_tiles = q_tiles + 2 * TILE * D;    // [2][TILE * D]
    bf16* ds_tile = do_tiles + 2 * TILE * D;    // [KEYS keys][TILE queries]
    float* lse_tiles = reinterpret_cast<float*>(ds_tile + KEYS * TILE);  // [2][TILE]
    float* rowsum_tiles = lse_tiles + 2 * TILE;                          // [2][TILE]

    const int T = p.shape.seq_len;
    const int bh = blockIdx.x, b = bh / p.shape.heads, h = bh % p.shape.heads;
    const int n0 = blockIdx.y * KEYS;  // this block's keys; causal: low n0 = most work, started first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int warp_key0 = n0 + 16 * warp;

    const bf16* q = head_ptr(p.q, b, h);
    const bf16* d_o = head_ptr(p.d_o, b, h);
    const float* lse = p.lse + (int64_t)bh * T;
    const float* rowsum = p.d_rowsum + (int64_t)bh * T;
    float* dq_accum = p.dq_accum + (int64_t)bh * T * D;

    // Causal: queries before n0 never see these keys (n0 is a multiple of TILE).
    const int m_first = CAUSAL ? n0 : 0;
    const int n_tiles = (T - m_first + TILE - 1) / TILE;

    auto load_query_tile = [&](int stage, int m0) {
        load_tile_async<TILE, D, NT>(q_tiles + stage * TILE * D, q, p.q.stride_seq, m0, T);
        load_tile_async<TILE, D, NT>(do_tiles + stage * TILE * D, d_o, p.d_o.stride_seq, m0, T);
        // LSE and D of these rows, through cp.async as well: plain loads here would stall the
        // whole block at the next barrier for a global-memory round trip every step.
        static_assert(NT >= 2 * TILE, "one thread per LSE and per D value");
        const int i = threadIdx.x % TILE, valid = m0 + i < T;
        if (threadIdx.x < TILE) cp_async_4(lse_tiles + stage * TILE + i, valid ? lse + m0 + i : lse, valid);
        else if (threadIdx.x < 2 * TILE) cp_async_4(rowsum_tiles + stage * TILE + i, valid ? rowsum + m0 + i : rowsum, valid);
    };
    load_tile_async<KEYS, D, NT>(k_tile, head_ptr(p.k, b, h), p.k.stride_seq, n0, T);
    load_tile_async<KEYS, D, NT>(v_tile, head_ptr(p.v, b, h), p.v.stride_seq, n0, T);
    load_query_tile(0, m_first);
    cp_async_commit();

    const float c = p.shape.scale * LOG2E;
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};  // this warp's 16 keys x D
    uint32_t k_frag[D / 16][4], v_frag[D / 16][4];   // KV_IN_REGS: read at the first step

    for (int j = 0; j < n_tiles; ++j) {
        const int m0 = m_first + j * TILE, stage = j % 2;
        // The other stage was last read before the mid-loop barrier of the previous step.
        if (j + 1 < n_tiles) {
            load_query_tile((j + 1) % 2, m0 + TILE);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* q_tile = q_tiles + stage * TILE * D;
        const bf16* do_tile = do_tiles + stage * TILE * D;
        const float* lse_c = lse_tiles + stage * TILE;
        const float* rowsum_c = rowsum_tiles + stage * TILE;

        // A warp whose keys are all past T, or (causal) all after this tile's last query, has
        // nothing to add: its rows of dS are zeros.
        const bool active = warp_key0 < T && (!CAUSAL || warp_key0 <= m0 + TILE - 1);
        if constexpr (KV_IN_REGS) {
            if (j == 0) {
                #pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    load_a<D>(k_frag[kk], k_tile, 16 * warp, 16 * kk);
                    load_a<D>(v_frag[kk], v_tile, 16 * warp, 16 * kk);
                }
            }
        }
        if (active) {
            // S^T = K Q^T and dP^T = V dO^T: 16 keys (this warp) x 64 queries.
            float s[TILE / 8][4] = {}, dp[TILE / 8][4] = {};
            for (int kk = 0; kk < D / 16; ++kk) {
                uint32_t ka[4], va[4];
                if constexpr (KV_IN_REGS) {
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) ka[i] = k_frag[kk][i], va[i] = v_frag[kk][i];
                } else {
                    load_a<D>(ka, k_tile, 16 * warp, 16 * kk);
                    load_a<D>(va, v_tile, 16 * warp, 16 * kk);
                }
                for (int nb = 0; nb < TILE / 16; ++nb) {
                    uint32_t qb[4], dob[4];
                    load_b_from_rows<D>(qb, q_tile, 16 * nb, 16 * kk);
                    load_b_from_rows<D>(dob, do_tile, 16 * nb, 16 * kk);
                    mma_bf16_16816(s[2 * nb], ka, qb[0], qb[1]);
                    mma_bf16_16816(s[2 * nb + 1], ka, qb[2], qb[3]);
                    mma_bf16_16816(dp[2 * nb], va, dob[0], dob[1]);
                    mma_bf16_16816(dp[2 * nb + 1], va, dob[2], dob[3]);
                }
            }
            // P^T = exp(scale s - LSE) (0 where masked), then dS^T = P^T o (dP^T - D).
            for (int nb = 0; nb < TILE / 8; ++nb)
                for (int i = 0; i < 4; ++i) {
                    const int key = warp_key0 + g + 8 * (i / 2), col = 8 * nb + 2 * t + i % 2, query = m0 + col;
                    const bool masked = query >= T || key >= T || (CAUSAL && key > query);
                    const float prob = masked ? 0.f : exp2_approx(s[nb][i] * c - lse_c[col] * LOG2E);
                    s[nb][i] = prob;
                    dp[nb][i] = prob * (dp[nb][i] - rowsum_c[col]);
                }
            // dV += P^T dO and dK += dS^T Q (scale applied at the end), A operands from registers.
            for (int kk = 0; kk < TILE / 16; ++kk) {
                uint32_t pa[4], dsa[4];
                acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
                acc_to_a(dsa, dp[2 * kk], dp[2 * kk + 1]);
                for (int db = 0; db < D / 16; ++db) {
                    uint32_t dob[4], qb[4];
                    load_b_from_cols<D>(dob, do_tile, 16 * db, 16 * kk);
                    load_b_from_cols<D>(qb, q_tile, 16 * db, 16 * kk);
                    mma_bf16_16816(dv[2 * db], pa, dob[0], dob[1]);
                    mma_bf16_16816(dv[2 * db + 1], pa, dob[2], dob[3]);
                    mma_bf16_16816(dk[2 * db], dsa, qb[0], qb[1]);
                    mma_bf16_16816(dk[2 * db + 1], dsa, qb[2], qb[3]);
                }
                // dS^T to shared memory (rows = keys, cols = queries) for the dQ product below.
                const int key_row = 16 * warp + g;
                for (int half = 0; half < 2; ++half) {
                    const int col = 16 * kk + 8 * half + 2 * t;
                    *reinterpret_cast<uint32_t*>(ds_tile + swizzled<TILE>(key_row, col)) = dsa[2 * half];
                    *reinterpret_cast<uint32_t*>(ds_tile + swizzled<TILE>(key_row + 8, col)) = dsa[2 * half + 1];
                }
            }
        } else {
            for (int i = lane; i < 16 * TILE / 2; i += 32)   // 16 rows x TILE bf16, 2 per store
                reinterpret_cast<uint32_t*>(ds_tile + 16 * warp * TILE)[i] = 0u;
        }
        __syncthreads();  // dS complete; also: every warp is done with this stage's Q, dO

        // dQ (TILE queries x D) += dS K over this block's KEYS keys. The warps split dQ into
        // DQ_ROW_GROUPS x DQ_COL_GROUPS pieces of DQ_ROWS x DQ_COLS.
        constexpr int DQ_COL_GROUPS = BWD_WARPS < D / 16 ? BWD_WARPS : D / 16;
        constexpr int DQ_ROW_GROUPS = BWD_WARPS / DQ_COL_GROUPS;
        constexpr int DQ_COLS = D / DQ_COL_GROUPS, DQ_ROWS = TILE / DQ_ROW_GROUPS;
        const int dq_col0 = (warp % DQ_COL_GROUPS) * DQ_COLS, dq_row0 = (warp / DQ_COL_GROUPS) * DQ_ROWS;
        float dq[DQ_ROWS / 16][DQ_COLS / 8][4] = {};
        for (int kk = 0; kk < KEYS / 16; ++kk) {
            uint32_t kb[DQ_COLS / 16][4];
            for (int db = 0; db < DQ_COLS / 16; ++db)
                load_b_from_cols<D>(kb[db], k_tile, dq_col0 + 16 * db, 16 * kk);
            for (int mt = 0; mt < DQ_ROWS / 16; ++mt) {
                uint32_t dsa[4];
                load_a_transposed<TILE>(dsa, ds_tile, dq_row0 + 16 * mt, 16 * kk);
                for (int db = 0; db < DQ_COLS / 16; ++db) {
                    mma_bf16_16816(dq[mt][2 * db], dsa, kb[db][0], kb[db][1]);
                    mma_bf16_16816(dq[mt][2 * db + 1], dsa, kb[db][2], kb[db][3]);
                }
            }
        }
        for (int mt = 0; mt < DQ_ROWS / 16; ++mt)
            for (int nb = 0; nb < DQ_COLS / 8; ++nb)
                for (int i = 0; i < 4; ++i) {
                    const int query = m0 + dq_row0 + 16 * mt + g + 8 * (i / 2);
                    const int col = dq_col0 + 8 * nb + 2 * t + i % 2;
                    if (query < T) atomicAdd(dq_accum + (int64_t)query * D + col, dq[mt][nb][i]);
                }
        // The next step's barrier (after its wait) orders these reads of dS before its rewrite.
    }

    // Write dK = scale * (dS^T Q) and dV for this warp's 16 keys.
    bf16* dk_out = head_ptr_mut(p.dk, b, h);
    bf16* dv_out = head_ptr_mut(p.dv, b, h);
    for (int r = 0; r < 2; ++r) {
        const int key = warp_key0 + g + 8 * r;
        if (key >= T) continue;
        for (int db = 0; db < D / 8; ++db) {
            const int col = 8 * db + 2 * t;
            *reinterpret_cast<uint32_t*>(dk_out + (int64_t)key * p.dk.stride_seq + col) =
                pack_bf16x2(dk[db][2 * r] * p.shape.scale, dk[db][2 * r + 1] * p.shape.scale);
            *reinterpret_cast<uint32_t*>(dv_out + (int64_t)key * p.dv.stride_seq + col) =
                pack_bf16x2(dv[db][2 * r], dv[db][2 * r + 1]);
        }
    }
}

// Kernel 3: dQ = scale * dq_accum, to bf16 in dQ's own strides. One thread per 2 elements.
template <int D>
__global__ void __launch_bounds__(256)
attention_backward_dq_kernel(const AttentionBackwardParams p) {
    const int T = p.shape.seq_len;
    const int64_t pair = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pair >= (int64_t)p.shape.batch * p.shape.heads * T * (D / 2)) return;
    const int64_t row = pair / (D / 2);
    const int col = 2 * (pair % (D / 2));
    const int bh = row / T, tt = row % T, b = bh / p.shape.heads, h = bh % p.shape.heads;
    const float* from = p.dq_accum + row * D + col;
    bf16* to = head_ptr_mut(p.dq, b, h) + (int64_t)tt * p.dq.stride_seq + col;
    *reinterpret_cast<uint32_t*>(to) = pack_bf16x2(from[0] * p.shape.scale, from[1] * p.shape.scale);
}

// Kernel 3 of variant 3: the same, one thread per 8 elements (two 16-byte loads, one 16-byte
// store). At the GPT-2 shape: 20 us, where the kernel above took 32 us.
template <int D>
__global__ void __launch_bounds__(256)
attention_backward_dq_wide_kernel(const AttentionBackwardParams p) {
    const int T = p.shape.seq_len;
    const int64_t piece = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (piece >= (int64_t)p.shape.batch * p.shape.heads * T * (D / 8)) return;
    const int64_t row = piece / (D / 8);
    const int col = 8 * (piece % (D / 8));
    const int bh = row / T, tt = row % T, b = bh / p.shape.heads, h = bh % p.shape.heads;
    const float4* from = reinterpret_cast<const float4*>(p.dq_accum + row * D + col);
    const float4 lo = from[0], hi = from[1];
    const float sc = p.shape.scale;
    const uint4 packed = make_uint4(pack_bf16x2(lo.x * sc, lo.y * sc), pack_bf16x2(lo.z * sc, lo.w * sc),
                                    pack_bf16x2(hi.x * sc, hi.y * sc), pack_bf16x2(hi.z * sc, hi.w * sc));
    *reinterpret_cast<uint4*>(head_ptr_mut(p.dq, b, h) + (int64_t)tt * p.dq.stride_seq + col) = packed;
}

// ============================== launchers ===============================================

template <int D, int FWD_WARPS, int ROW_TILES, int BLOCK_N, bool CAUSAL>
cudaError_t launch_forward(const AttentionForwardParams& p, cudaStream_t stream) {
    const auto kernel = attention_forward_kernel<D, FWD_WARPS, ROW_TILES, BLOCK_N, CAUSAL>;
    constexpr int BLOCK_M = 16 * ROW_TILES * FWD_WARPS;
    const int smem = (BLOCK_M + 4 * BLOCK_N) * D * 2;   // Q + 2 stages x (K, V)
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    dim3 grid(p.shape.batch * p.shape.heads, (p.shape.seq_len + BLOCK_M - 1) / BLOCK_M);
    kernel<<<grid, FWD_WARPS * 32, smem, stream>>>(p);
    return cudaGetLastError();
}

// Block shapes of the forward pass, (warps, row tiles per warp, BLOCK_N):
// 0 = (4, 1, 64), 1 = (8, 1, 64), 2 = (4, 1, 128), 3 = (4, 2, 64) (head_dim 64 only: with 128 the
// accumulators of two row tiles do not fit in registers). DEFAULT_FWD_VARIANT is the fastest
// measured on the H200 (kernels/NOTES.md); TK_ATTENTION_FWD_VARIANT overrides it (bench.py).
// D = 64 until session 8: variant 3 (two row tiles per warp): 0.137 ms at the GPT-2 shape against
// 0.163 for variant 0 and FA2's 0.136 (session 4, H3's first call).
// Tried in session 5 and removed: these blocks (and the backward's) taken in L2 groups of heads,
// as the Hopper kernels take theirs: 2-3% SLOWER on the H200 at the GPT-2 shape (forward 0.1390
// ms = 0.97x FA2 in the same run, where this order ran 0.1354 = 0.99x FA2 in session 4; fwd+bwd
// 0.6659 vs 0.6538; kernels/NOTES.md, session 5, A; the code is in git at ed08ab4).
// Tried in session 7 and taken out (code at 1e193c6; kernels/NOTES.md, session 7, P): variant 3
// with the causal skips of dead 16-key chunks on the diagonal tiles (0.2047 ms at GPT-2 against
// 0.1366: the warp-uniform branches between the unrolled mma.sync of every tile cost far more
// than the ~4% of work skipped), + O through shared memory (0.2059), 128-key tiles with Q from
// shared memory + skips (0.1992 / 0.2013 without the O staging).
// Session 8 (first H200 run of 9 and 10, kernels/NOTES.md, "Session 8 (lead)"): D = 64 takes
// variant 9: GPT-2 forward 0.1109 ms against 0.1366 for variant 3 and FA2's 0.1362 (1.23x FA2),
// fwd+bwd 0.6012 vs 0.6255 (FA2 0.6527); shakespeare-char forward 0.0328 vs 0.0358 (10: 0.0312).
template <int D>
constexpr int DEFAULT_FWD_VARIANT = D == 64 ? 9 : 0;

// Variants 9 and 10 (attention_forward_split_kernel: the diagonal tiles as their own code path,
// interleaved row tiles, Q in registers, 64-key tiles of math): 9 = 128-key cp.async stages (one
// barrier per 128 keys, D = 64's default), 10 = 64-key stages (opt-in; session 7, P2, built them;
// kernels/NOTES.md). D = 128 runs variant 0.
template <int D, int STAGE_KEYS, bool CAUSAL>
cudaError_t launch_forward_split(const AttentionForwardParams& p, cudaStream_t stream) {
    const auto kernel = attention_forward_split_kernel<D, STAGE_KEYS, CAUSAL>;
    const int smem = (SPLIT_BLOCK_M + 4 * STAGE_KEYS) * D * 2;   // Q + 2 stages x (K, V)
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    dim3 grid(p.shape.batch * p.shape.heads, (p.shape.seq_len + SPLIT_BLOCK_M - 1) / SPLIT_BLOCK_M);
    kernel<<<grid, SPLIT_WARPS * 32, smem, stream>>>(p);
    return cudaGetLastError();
}

template <int D, bool CAUSAL>
cudaError_t launch_forward(const AttentionForwardParams& p, cudaStream_t stream) {
    const char* env = getenv("TK_ATTENTION_FWD_VARIANT");
    const int variant = env ? atoi(env) : DEFAULT_FWD_VARIANT<D>;
    if (variant == 1) return launch_forward<D, 8, 1, 64, CAUSAL>(p, stream);
    if (variant == 2) return launch_forward<D, 4, 1, 128, CAUSAL>(p, stream);
    if constexpr (D == 64) {
        if (variant == 3) return launch_forward<D, 4, 2, 64, CAUSAL>(p, stream);
        if (variant == 9) return launch_forward_split<D, 128, CAUSAL>(p, stream);
        if (variant == 10) return launch_forward_split<D, 64, CAUSAL>(p, stream);
    }
    return launch_forward<D, 4, 1, 64, CAUSAL>(p, stream);
}

template <int D, int BWD_WARPS, bool CAUSAL, bool KV_IN_REGS = false>
cudaError_t launch_backward_main(const AttentionBackwardParams& p, cudaStream_t stream) {
    const auto kernel = attention_backward_kernel<D, BWD_WARPS, CAUSAL, KV_IN_REGS>;
    constexpr int KEYS = 16 * BWD_WARPS;
    // K, V + 2 stages x (Q, dO) + dS, in bf16; 2 stages x (LSE, D) in fp32.
    const int smem = (2 * KEYS * D + 4 * TILE * D + KEYS * TILE) * 2 + 4 * TILE * 4;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    dim3 grid(p.shape.batch * p.shape.heads, (p.shape.seq_len + KEYS - 1) / KEYS);
    kernel<<<grid, BWD_WARPS * 32, smem, stream>>>(p);
    return cudaGetLastError();
}

// Variants of the backward: 0 = 4 warps (64 keys per block), 1 = 8 warps (128 keys: each Q/dO tile
// and each dQ atomic serves twice the keys; faster than 0 at all three benchmarked shapes), both
// with a memset of dq_accum, the one-warp-per-row kernel 1 and the two-element kernel 3;
// 2 = 1 with KV_IN_REGS (D = 64; D = 128 runs 1's main kernel); 3 = 2 with the wide kernels 1
// (prep: memset fused in) and 3. DEFAULT_BWD_VARIANT is the fastest measured on the H200
// (kernels/NOTES.md); TK_ATTENTION_BWD_VARIANT overrides it (bench.py).
// Session 7 (kernels/NOTES.md, session 7, P; one interleaved run, CUDA graphs, 7 rounds): variant 3
// against 1, fwd+bwd with forward 3: GPT-2 0.6234 vs 0.6562 ms (FA2 0.6509: 1.044x, was 0.992x),
// shakespeare-char 0.1557 vs 0.1731, t4096-d128 5.121 vs 5.168. All of it from kernels 1 and 3:
// 46 us where the memset, the row sums and the conversion took 84 us at GPT-2.
// Tried in session 7 and taken out (code at 1e193c6): the causal skips of dead 16-query chunks on
// the diagonal tiles (+29% main kernel: the per-chunk branches inside the unrolled mma loops cost
// far more than the 4% of work they skip) and one barrier per query tile with two dS buffers (+2%
// more on top of the skips).
constexpr int DEFAULT_BWD_VARIANT = 3;

template <int D, bool CAUSAL>
cudaError_t launch_backward_main_variant(int variant, const AttentionBackwardParams& p, cudaStream_t stream) {
    if (variant == 0) return launch_backward_main<D, 4, CAUSAL>(p, stream);
    if constexpr (D == 64) {
        if (variant == 2 || variant == 3) return launch_backward_main<D, 8, CAUSAL, true>(p, stream);
    }
    return launch_backward_main<D, 8, CAUSAL>(p, stream);   // 1, and 2, 3 at D = 128
}

template <int D, bool CAUSAL>
cudaError_t launch_backward(const AttentionBackwardParams& p, cudaStream_t stream) {
    const char* env = getenv("TK_ATTENTION_BWD_VARIANT");
    const int variant = env ? atoi(env) : DEFAULT_BWD_VARIANT;
    const bool wide = variant == 3;

    const int64_t rows = (int64_t)p.shape.batch * p.shape.heads * p.shape.seq_len;
    cudaError_t err;
    if (wide) {
        attention_backward_prep_kernel<D><<<(rows * (D / 8) + 255) / 256, 256, 0, stream>>>(p);
    } else {
        err = cudaMemsetAsync(p.dq_accum, 0, rows * D * sizeof(float), stream);
        if (err != cudaSuccess) return err;
        attention_backward_rowsum_kernel<D><<<(rows + 7) / 8, 256, 0, stream>>>(p);
    }
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    err = launch_backward_main_variant<D, CAUSAL>(variant, p, stream);
    if (err != cudaSuccess) return err;

    if (wide) {
        const int64_t pieces = rows * (D / 8);
        attention_backward_dq_wide_kernel<D><<<(pieces + 255) / 256, 256, 0, stream>>>(p);
    } else {
        const int64_t pairs = rows * (D / 2);
        attention_backward_dq_kernel<D><<<(pairs + 255) / 256, 256, 0, stream>>>(p);
    }
    return cudaGetLastError();
}

}  // namespace

int attention_portable_forward(const AttentionForwardParams& p, void* stream_ptr) {
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    const int d = p.shape.head_dim;
    if (d == 64) return p.shape.causal ? launch_forward<64, true>(p, stream) : launch_forward<64, false>(p, stream);
    if (d == 128) return p.shape.causal ? launch_forward<128, true>(p, stream) : launch_forward<128, false>(p, stream);
    return cudaErrorInvalidValue;
}

int attention_portable_backward(const AttentionBackwardParams& p, void* stream_ptr) {
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    const int d = p.shape.head_dim;
    if (d == 64) return p.shape.causal ? launch_backward<64, true>(p, stream) : launch_backward<64, false>(p, stream);
    if (d == 128) return p.shape.causal ? launch_backward<128, true>(p, stream) : launch_backward<128, false>(p, stream);
    return cudaErrorInvalidValue;
}

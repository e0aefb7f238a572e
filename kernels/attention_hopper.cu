// kernels/attention_hopper.cu — causal flash attention, forward pass, for Hopper (sm_90a only):
// TMA loads of Q, K and V into shared memory guarded by mbarriers, one producer warpgroup and
// two consumer warpgroups (setmaxnreg moves registers from the first to the others), wgmma for
// S = Q·Kᵀ (both operands in shared memory) and O += P·V (P in registers).
// Two kernels share that pipeline: forward_kernel (one CTA per query block; variants 2, 4, 5) and
// persistent_kernel (one CTA per SM walks over many query blocks; variants 8, 11-13, 21, 26, 30, 33,
// 37), which runs by default: variant 37 for head_dim 64 and 128 (DEFAULT_VARIANT_D64 / _D128).
// Read kernels/attention_portable.cu first: same algorithm, plainer machinery.
// Read in order: the algorithm and the pipeline picture (this comment), config, item_at,
// softmax_tile, forward_kernel (producer branch, consumer branch, epilogue: the pipeline for one
// query block), then persistent_kernel (the same with an outer loop over query blocks; the
// comment above it on DOUBLE_P, LEAN_SOFTMAX and STALE_MAX, then mask_tile and
// softmax_tile_stale_max, which the default's loop calls for every tile after the first), and the
// launchers with attention_hopper_forward_variant at the bottom.
//
// ---- The algorithm (online softmax) ---------------------------------------------------------
// For each query row i:  O_i = Σ_j softmax_j(scale · q_i·k_j) v_j  over keys j ≤ i (causal).
// The T×T score matrix never exists: the queries are cut into blocks of 128 rows (BLOCK_M; 64
// with one consumer; a CTA works on one block at a time), and for its block a CTA walks over the
// keys in tiles of 128 (BLOCK_N), keeping per row a running max m, a running sum l of exp(s - m)
// and an unnormalised output O. When a tile raises the max from m to m', everything accumulated so
// far is multiplied by exp(m - m') before the tile's contribution is added; at the end O /= l.
// Exponentials are exp2 with the log2(e) folded into the scale (one FFMA + one MUFU.EX2 per
// score). The forward also returns LSE_i = scale·m_i + ln l_i (natural log, as the portable
// kernel does): the backward pass recomputes P = exp(scale·S - LSE) from it in one step, without
// a second pass over the keys to rebuild the softmax denominators.
// Causal: key tiles entirely right of the block's last query row are never loaded; only tiles that
// cross the diagonal are masked element by element. Sequence tails: TMA boxes that run past T
// read zeros (tk/ops/group/tma_4d.cuh), padded keys are masked like the causal ones, padded query
// rows compute harmless finite garbage that the epilogue does not store.
// Two savings of the default: the half tile (consumer 0's diagonal tile has all of its last 64
// keys masked, so its softmax and P·V take the first 64 only) and a max that may be stale (m moves
// only when a row's max grows by more than 8 in log2 units of the scaled scores; otherwise the
// exponentials stay <= 2^8 and O is not multiplied). Since session 8 (variant 37, STALE_MAX) the
// exponentials of a tile after the first do not even wait for the tile's max; before it, head_dim
// 128 alone had the threshold, applied after the max (LAZY).
//
// ---- The pipeline (the default, persistent_kernel; forward_kernel is one pass of its loop) ----
// Warpgroup 0 = producer (one elected thread issues all TMA copies; 24 registers/thread).
// Warpgroups 1, 2 = consumers, each owns 64 of a block's 128 query rows (240 registers/thread).
// Shared memory: two Q slots (128 x D each; forward_kernel has one), then STAGES slots of K
// (128 x D) and STAGES slots of V (STAGES = 3 for D = 64, 2 for D = 128).
// Barriers: per Q slot q_full (TMA -> consumers) and q_empty (consumers -> producer); per K/V slot
// k_full[s], v_full[s] (TMA -> consumers, 1 arrival + bytes) and k_empty[s], v_empty[s]
// (consumers -> producer, one arrival per consumer warp). item_of[slot] tells the consumers which
// query block the Q in that slot belongs to (written before q_full completes; -1: no more); every
// consumer thread reads it, so q_empty takes one arrival per consumer thread (see release_all).
//
//   producer (one thread)                     consumer warpgroup c (c = 0, 1)
//   ---------------------                     -------------------------------
//   item = blockIdx.x                         for j = 0, 1, ... (slot j % 2):
//   for j = 0, 1, ... (slot j % 2):             wait q_full; item = item_of[slot]; -1: stop
//     wait q_empty(slot)                        [turn] wait k_full; issue S = Q·K0ᵀ [/turn]
//     no item left: item_of = -1,               wait S; release k_empty; (the previous item's O
//       arrive q_full(slot); stop                 store has read its slot: release q_empty(j-1))
//                                               softmax(S) -> P, m, l
//                                               for tiles n = 1 .. N-1:
//     item_of[slot] = item                        [turn] wait k_full; issue S = Q·Knᵀ  (async)
//     next = gridDim.x + atomicAdd(counter)         wait v_full; issue O += P·V(n-1)  (async)
//     load Q of the item   -> q_full(slot)        [/turn]
//     load K0              -> k_full              wgmma wait<1>: S done -> release k_empty
//     for tiles n = 1 .. N-1:                     softmax(S): new max, exp2, row sums <- overlaps P·V
//       wait k_empty; load Kn     -> k_full       wgmma wait<0>: P·V done -> release v_empty
//       wait v_empty; load V(n-1) -> v_full       O *= exp2(m_old - m_new); P = bf16(S)
//     load V(N-1)                               [turn] wait v_full; issue O += P·V(N-1) [/turn]
//     item = next                               wait; release v_empty
//                                               O /= l into this warpgroup's rows of the Q slot,
//                                               one TMA store of them, LSE (fp32), while the
//                                               producer already loads the next item's Q and K
// (That epilogue is LEAN_EPILOGUE's: variant 21 and those built on it, the default 37 among them;
// variants 8, 11-13 store O from registers and release q_empty(slot) right after the last P·V.)
// The default's loop turn differs from this picture in two places (persistent_kernel's DOUBLE_P and
// STALE_MAX): P is converted to bf16 before the wait for P·V(n-1), into the other of two register
// arrays, and its exponentials are taken against the running max, so O is multiplied only when a
// row's max grew by more than 2^8.
//
// N is the item's number of key tiles (causal: up to its diagonal). The producer runs ahead as
// far as free slots let it, into the next item; the first gridDim.x items go by blockIdx.x, every
// later one to whichever CTA asks next (a counter of the launch's own: see "Dynamic scheduling"
// below). K runs one tile ahead of V, so the producer can refill a K slot as soon as its S is
// done. [turn] ... [/turn] is the warpgroup "ping-pong" (FA3's scheduler barrier, optional
// template flag): the two consumers take turns issuing their matrix products through two named
// barriers, so that while one warpgroup's wgmmas run on the tensor cores, the other one does
// its softmax on the FMA/MUFU units. Consumer 1 starts by arriving on consumer 0's barrier; the
// turns carry on from item to item.
//
// Barrier phases: the g-th K/V tile of a CTA's life (counted over all its items) lives in slot
// g % STAGES and its wait parity is (g / STAGES) & 1 for the consumers (Q: the j-th item, slot
// j % 2, parity (j / 2) & 1); the producer waits on "empty" with the opposite parity, so that its
// first pass over the ring does not block (a fresh mbarrier reports parity 1 as complete).
//
// ---- Variants (attention_hopper_forward_variant at the bottom; figures in kernels/NOTES.md) ----
// The numbers are the ones kernels/NOTES.md's figures use; the gaps are variants that lost on the
// H200 and were taken out (below). What remains:
//   2 forward_kernel: two consumers, ping-pong, one CTA per query block, all heads' last block
//     first (sessions 2-3; D=128's default then)
//   4 forward_kernel with ONE consumer per CTA and two CTAs per SM (D=64; 128 runs 2). Instead of
//     ping-pong between two warpgroups of one CTA, two CTAs interleave, and one CTA's start (Q and
//     the first K in flight) and end (O stores) hide under the other's matrix products.
//   5 4 / 2 with the query blocks in L2 groups of heads (item_at): K and V come from DRAM about
//     once instead of once per query block (session 4, kernels/NOTES.md "Session 4: H3 attention")
//   8 persistent_kernel with one consumer and two CTAs per SM, items at a fixed stride (D=64;
//     128 runs 11)
//   11-13 persistent_kernel with dynamic scheduling (a counter hands out the items) and the half
//     tile (consumer 0's diagonal tile has its second 64 keys all masked): 11 = with lazy
//     rescaling (softmax_tile's LAZY: O is multiplied only when a row's max grew by more than
//     2^8; default D=128), 12 = without (default D=64), 13 = 11 with one consumer and two CTAs
//     per SM (D=64; 128 runs 11).
//   21 12 (D=64) / 11 (D=128) with a lean per-item epilogue (persistent_kernel's LEAN_EPILOGUE:
//     items decoded by the producer, approximate 1/l and log2 l, O through shared memory and one
//     TMA store per warpgroup instead of 16-32 scattered 4-byte stores per thread); the default
//     for both head dims in session 6 (GPT-2 shape 0.0795 ms against 12's 0.0914).
//   26 21 launched as a programmatic dependent (PDL: its start overlaps the end of the kernel before
//     it; session 7: the noise, 0.0792 against 21's 0.0794)
//   30 21 whose work counter sets itself back to 0 (persistent_kernel's SELF_RESET), so a call needs
//     no zeroing kernel before it: the default for both head dims in session 7 (GPT-2 shape
//     0.0782 ms against 21's 0.0794 and cuDNN's 0.0864)
//   33 30 with a leaner softmax (LEAN_SOFTMAX): the mask decision once per item, consumer 1's
//     diagonal tile masked on its second half only, the rescale factor by ex2.approx (session 8)
//   37 30 + LEAN_SOFTMAX + P in two register arrays that alternate by tile (DOUBLE_P) + the
//     exponentials against the running max before the tile's max is known (STALE_MAX: the max
//     moves only when a row grew by more than 2^8; the row sums as four running sums, so that
//     D=128 fits it too): the default for both head dims since session 8 (call 3, in turns: GPT-2
//     shape 0.0738 ms against 30's 0.0780, 35's 0.0735 and cuDNN's 0.0864; shakespeare-char
//     0.0277 / 0.0282 / 0.0282 / 0.0285; t4096-d128 0.4469 / 0.4886 / 0.4798 / 0.5647)
// Tried in session 8 and taken out (code in git at 90b58dd, 35 at a92db3d; kernels/NOTES.md,
//   "Session 8: A"): 32 = 30 + DOUBLE_P (GPT-2 0.0780 against 30's 0.0762: the loop unrolled by
//   two for the two P arrays costs instruction-cache misses), 34 = 32 + LEAN_SOFTMAX (0.0785),
//   35 = 37 with the row sums as a tree (D=64; D=128, where that spilled, ran 34: call 2, GPT-2
//   0.0721 against 30's 0.0762; call 3 against 37: 0.0735 / 0.0738, shakespeare-char 0.0282 /
//   0.0277, t4096-d128 0.4798 / 0.4469), 36 = 35 with every 8th exponential by a cubic on the
//   FMA pipe (0.0732 against 35's 0.0721).
// Taken out after session 5 (the code is in git at 65e8c26; figures in kernels/NOTES.md,
//   "Session 4: H3 attention" and sessions 2-3's "H200 runs"): 1 = 2 with exp2f and sequential
//   row max / sum (GPT-2 shape 221 against 2's 225 TFLOP/s), 3 = 2 without ping-pong (203: -10%),
//   6 = persistent, two consumers, items at a fixed stride (GPT-2 0.1033 ms against 7's 0.1000:
//   the stride gives some CTAs mostly heavy items; t4096-d128 0.5638 against 5's 0.5220), 7 = 6
//   without L2 groups (0.1000), 9 = 6 with the half tile (0.0988 against 12's 0.0903; t4096-d128
//   0.5757 against 11's 0.4599), 10 = 9 with lazy rescaling (never timed alone: 11 is it with
//   dynamic scheduling), 14 = 11 without ping-pong (0.0914 against 12's 0.0903; 0.4808 against
//   11's 0.4599). 1 and 3: sessions 2-3; 6 and 7: session 4's call 2; 9 and 14: its call 3.
//   Variant 8 at D=128 ran 6's kernel (NOTES' "v8" figures at t4096-d128, 0.5848 and 0.6117 ms);
//   it runs 11 now.
// Session 5 tried, and took out again (kernels/NOTES.md, "Session 5: A"; the code is in git at
//   f67542b): 15 = 12 / 11 with the items overlapped (an item's last P·V and the next item's
//   first S in one turn, the epilogue under that S), 16 = 13 overlapped, 17 = 15 with every 4th
//   exponential by a cubic on the FMA pipe instead of the MUFU, 18 = three consumer warpgroups
//   (192-row items, D=64), 19 = 18 overlapped: on the H200 none beat 12 by more than the noise
//   (-1.1%, +1.7%, +1.3%, -0.7%, +2.3% at the GPT-2 shape, call 3). A variant 20 (the O
//   epilogue's row addresses computed once, items decoded by the producer) hung on the H200 with
//   more work items than SMs and was taken out too (24c13ae).
// The backward pass is attention_hopper_bwd.cu.
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <string>
#include <type_traits>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "tk/ops/group/sync.cuh"
#include "tk/ops/group/wgmma.cuh"
#include "tk/ops/group/tma_4d.cuh"
#include "tk/ops/group/tma.cuh"         // the bulk async-group waits of the TMA store (LEAN_EPILOGUE)
#include "attention_params.h"
#include "attention_l2_groups.cuh"      // item_at's order and the host's group size

namespace attention_hopper {

// ---- Configuration ---------------------------------------------------------------------------
// CONSUMERS = 2 (the default shape): a CTA of 3 warpgroups owns 128 query rows, one CTA per SM.
// CONSUMERS = 1 (a variant kept for measurement, D = 64): 2 warpgroups own 64 query rows and two
// CTAs share an SM, so one CTA's start (Q, first K) and end (stores) hide under the other's work.
template <int D, int CONSUMERS = 2>
struct config {
    static_assert(D == 64 || D == 128, "head_dim 64 or 128");
    static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
    static constexpr int head_dim = D;
    static constexpr int consumers = CONSUMERS;         // consumer warpgroups
    static constexpr int block_m = 64 * consumers;      // query rows per CTA (64 per consumer)
    static constexpr int block_n = 128;                 // keys per tile
    static constexpr int stages = D == 64 ? 3 : 2;      // K and V slots each; smem 113 / 161 KB
                                                        // (two consumers), 105 KB (one, D = 64)
    static constexpr int threads = 128 * (consumers + 1);
    static constexpr int ctas_per_sm = CONSUMERS == 1 ? 2 : 1;
    static constexpr int col_blocks = D / 64;           // 128-byte (64-element) column blocks
    static constexpr int q_bytes = block_m * D * 2;
    static constexpr int kv_bytes = block_n * D * 2;    // one K or one V tile
    static constexpr int smem_bytes = q_bytes + 2 * stages * kv_bytes + 1024;  // + alignment slack
    // Registers: the CTA's share of the 65536 is threads x (65536 / (threads x ctas_per_sm));
    // the producer hands back all but 24, the consumers take them: 128·(24 + 2·240) = 64512
    // for two consumers, 128·(24 + 232) = 32768 for one.
    static constexpr int producer_regs = 24, consumer_regs = CONSUMERS == 2 ? 240 : 232;
    static_assert(128 * (producer_regs + consumers * consumer_regs) <= 65536 / ctas_per_sm, "register budget");
};

// Which variant runs by default (see attention_hopper_forward_variant at the bottom): the fastest
// that passed its tests on the H200, timed beside the others in one run (kernels/NOTES.md,
// "Session 8: A", call 3, in turns with cuDNN): variant 37 for both head dims (30 = persistent,
// dynamic scheduling with a self-resetting counter, half diagonal tile, the lean epilogue; plus
// DOUBLE_P, LEAN_SOFTMAX, STALE_MAX): GPT-2 shape 0.0738 ms, shakespeare-char
// 0.0277, (4, 16, 4096, 128) 0.4469, against 0.0780 / 0.0282 / 0.4886 for session 7's default 30
// and cuDNN's 0.0864 / 0.0285 / 0.5647.
constexpr int DEFAULT_VARIANT_D64 = 37, DEFAULT_VARIANT_D128 = 37;

struct kernel_params {
    CUtensorMap q_map, k_map, v_map;                    // 4-D maps {dim, seq, heads, batch}
    __nv_bfloat16* o;
    int64_t o_stride_batch, o_stride_head, o_stride_seq;
    float* lse;                                         // (B, H, T) contiguous
    int heads, seq_len;
    float scale_log2;                                   // softmax scale · log2(e)
    int causal;
    int batch_heads, m_blocks;                          // work items: batch_heads x m_blocks query blocks
    int heads_per_group;                                // see item_at
    unsigned int* work_counter;                         // dynamic scheduling: zeroed, this launch's own
    CUtensorMap o_map;                                  // LEAN_EPILOGUE only: O in boxes of 64 rows (last,
                                                        // so the other kernels' fields keep their offsets)
};

// ---- Work items: which (batch, head, query block) the i-th CTA (or persistent step) takes ------
// Every query block of a head reads the same K and V, so they should run close together in time
// and find K and V in L2 rather than in DRAM. Heads are taken in groups of heads_per_group (the
// launcher sizes a group so its K and V fit in a third of the L2); inside a group the heaviest
// (latest, most keys) query blocks go first, every head of the group for one query block before
// the next one. heads_per_group = batch·heads is the order of the first kernels (all heads' last
// block, then all heads' second-last, ...): at the GPT-2 shape its working set is the whole
// 50 MB of K and V, the size of the L2.
struct work_item { int b, h, m_block; };
__device__ inline work_item item_at(int i, const kernel_params& p) {
    const attention_l2::slot s = attention_l2::slot_at(i, p.heads_per_group, p.m_blocks, p.batch_heads);
    return work_item{s.bh / p.heads, s.bh % p.heads, p.m_blocks - 1 - s.rank};   // the latest block is rank 0
}

// ---- One tile of online softmax, on the 64 x 128 score accumulator of one consumer -----------
// Thread (w, g, t) of the warpgroup holds rows r0 = 16w + g and r1 = r0 + 8, columns
// 8j + 2t + {0,1} for j = 0..15 (wgmma accumulator layout, hopper-facts §4.2): element i of
// the accumulator is in row r0 + 8·((i>>1)&1), column 8·(i>>2) + 2t + (i&1).
// On return s holds exp2(s·scale_log2 - m_new·scale_log2) and rescale[r] = exp2((m_old - m_new)·…).
// ex2.approx.ftz (plain exp2f also handles denormal results, a few more instructions per score)
// and tree reductions for the row max and sum (a chain of 32 dependent fmax / fadd would stall:
// each consumer warp shares its scheduler with one other). Variant 1 (removed, see the opening
// comment) had exp2f and sequential reductions: within the noise of this version on the H200.
__device__ inline float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// t[0] = max (or sum) of t[0 .. 2W): halve the live range W times. Templates, not a loop with
// w /= 2, so every index is a compile-time constant and t stays in registers.
template <int W, int LEN>
__device__ inline void tree_max(float (&t)[LEN]) {
#pragma unroll
    for (int j = 0; j < W; ++j) t[j] = fmaxf(t[j], t[j + W]);
    if constexpr (W > 1) tree_max<W / 2>(t);
}
template <int W, int LEN>
__device__ inline void tree_sum(float (&t)[LEN]) {
#pragma unroll
    for (int j = 0; j < W; ++j) t[j] += t[j + W];
    if constexpr (W > 1) tree_sum<W / 2>(t);
}
// Index of the j-th of this thread's N/4 accumulator elements in row half r (0: row0, 1: row0+8).
__device__ constexpr int row_element(int r, int j) { return 4 * (j >> 1) + 2 * r + (j & 1); }

// LAZY (variants 11 and 13; FA4's trick): keep the old max while the new one is at most 8 above
// it in log2 units of the scaled scores. The exponentials then stay <= 2^8, rescale is exactly 1 and
// O need not be multiplied (the caller skips it when no row of the warp moved); O / l and the LSE
// stay exact because O and l always share one max.
template <int N, bool LAZY = false, bool FAST_RESCALE = false>
__device__ inline void softmax_tile(float (&s)[N / 2], float (&m)[2], float (&l)[2], float (&rescale)[2],
                                    bool mask, bool causal, int row0, int col0, int seq_len,
                                    float scale_log2) {
    const int t = threadIdx.x % 4;
    if (mask) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
            int row = row0 + 8 * ((i >> 1) & 1);
            int col = col0 + 8 * (i >> 2) + 2 * t + (i & 1);
            bool masked = causal ? col > row : col >= seq_len;
            if (masked) s[i] = -INFINITY;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = m[r];
        {
            float t[N / 4];
#pragma unroll
            for (int j = 0; j < N / 4; ++j) t[j] = s[row_element(r, j)];
            tree_max<N / 8>(t);
            mx = fmaxf(mx, t[0]);
        }
        // the 4 threads of a quad (same g) hold the rest of the row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        // A row with nothing unmasked yet keeps max -inf; subtract 0 then, so exp2(-inf) = 0
        // instead of exp2(-inf - -inf) = NaN (hopper-facts §11.1).
        if constexpr (LAZY)
            if (m[r] != -INFINITY && (mx - m[r]) * scale_log2 <= 8.f) mx = m[r];
        float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
        // m_old = -inf -> 0. FAST_RESCALE (LEAN_SOFTMAX): ex2.approx.ftz, one MUFU instead of exp2f's
        // denormal-safe sequence (a rescale factor below 2^-126 flushes to 0: O's old part was that
        // small against the new max anyway).
        if constexpr (FAST_RESCALE) rescale[r] = exp2_ftz(m[r] * scale_log2 - m_scaled);
        else rescale[r] = exp2f(m[r] * scale_log2 - m_scaled);
        m[r] = mx;
        float sum = 0.f;
        {
            float t[N / 4];
#pragma unroll
            for (int j = 0; j < N / 4; ++j) {
                float e = exp2_ftz(fmaf(s[row_element(r, j)], scale_log2, -m_scaled));
                s[row_element(r, j)] = e;
                t[j] = e;
            }
            tree_sum<N / 8>(t);
            sum = t[0];
        }
        l[r] = l[r] * rescale[r] + sum;   // per-thread partial sum; the quad adds up at the end
    }
}

// The persistent kernel's mask (softmax_tile's own is kept for variants 2, 4, 5 as they were
// measured): -inf where the key is right of the query (causal) or past the sequence. Thread
// (g, t) holds columns col0 + 2t + (8·(i>>2) + (i&1)), a compile-time offset per element, in
// rows row0 and row0 + 8; so one limit per row, then one compare with an immediate and one
// select per score (softmax_tile's general test costs about three times that: 420 against ~130
// instructions per warp on a diagonal tile, D = 64, from the SASS).
// SKIP_FIRST_HALF (LEAN_SOFTMAX): the caller knows that no key of the tile's first N/2 columns is
// right of any of its rows (consumer 1's diagonal tile: keys 0-63 of it against rows 64-127), so only
// the second half's N/4 elements per thread are compared (elements i < N/4 are columns < N/2).
template <int N, bool SKIP_FIRST_HALF = false>
__device__ inline void mask_tile(float (&s)[N / 2], bool causal, int row0, int col0, int seq_len) {
    const int base = col0 + 2 * (threadIdx.x % 4);
    int limit[2];                                        // the last allowed column offset per row
#pragma unroll
    for (int r = 0; r < 2; ++r) limit[r] = (causal ? min(row0 + 8 * r, seq_len - 1) : seq_len - 1) - base;
#pragma unroll
    for (int i = SKIP_FIRST_HALF ? N / 4 : 0; i < N / 2; ++i)
        if (8 * (i >> 2) + (i & 1) > limit[(i >> 1) & 1]) s[i] = -INFINITY;
}

// The f32 score accumulator of one wgmma becomes the bf16 A operand of the next one without any
// shuffle (hopper-facts §4.3): k-chunk j (16 keys) = registers (8j, 8j+1), (8j+2, 8j+3), ...
__device__ inline uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // lo -> low 16 bits
    return *reinterpret_cast<uint32_t*>(&v);
}
// The registers of an in-flight wgmma's A operand must not be reused before the wait; this
// empty asm keeps P's registers live (and unmoved) up to the point where it is called.
template <int N>
__device__ inline void keep_alive(uint32_t (&p)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(p[j][q]) :: "memory");
}
template <int N>
__device__ inline void scores_to_a_operand(uint32_t (&p)[N / 16][4], const float (&s)[N / 2]) {
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) p[j][q] = pack_bf16(s[8 * j + 2 * q], s[8 * j + 2 * q + 1]);
}

// STALE_MAX (variant 37; FA4's "conditional rescaling", here with the exponentials first): one tile
// of online softmax whose exponentials do not wait for the tile's row max. They are taken against
// the running max m as it is (finite: every row has an unmasked key in its first tile, which the
// caller runs through softmax_tile), converted to P (bf16, into pf: pairs of adjacent columns of a
// row, the A-operand layout of scores_to_a_operand) and summed, while the row max is worked out
// beside them on the ALU pipe. Then the check: if no row of the warp has a score more than 2^8
// above exp2 of its m (in log2 units of the scaled scores), P (values <= 2^8), l and O stay
// against the old m: no rescale of O, nothing waits for the max's shuffles. Else (rare after a
// row's first tiles; warp-uniform) the slow path: the exact new max, the exponentials again from
// the raw scores (s is not overwritten), l rescaled; returns true and rescale[] for O. O / l and
// the LSE stay exact because O and l always share one m (as LAZY). P up to 2^8 instead of 1 keeps
// bf16's relative precision; l, O in fp32 have room for it.
// The row sums: each pair of exponentials is packed and added to one of four running sums at once,
// not kept for a tree over all N/4 values of the row: no 32 temporaries (with the tree, session 8's
// variant 35, D = 128 spilled 24 bytes).
template <int N>
__device__ inline bool softmax_tile_stale_max(const float (&s)[N / 2], float (&m)[2], float (&l)[2],
                                              float (&rescale)[2], uint32_t (&pf)[N / 16][4], float scale_log2) {
    float mx[2], sum[2];
    auto exponentials = [&](const float (&m_scaled)[2]) {   // P into pf, row sums into sum[]
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < N / 4; j += 2) {        // elements i, i + 1: adjacent columns of row r
                const int i = row_element(r, j);
                const float e0 = exp2_ftz(fmaf(s[i], scale_log2, -m_scaled[r]));
                const float e1 = exp2_ftz(fmaf(s[i + 1], scale_log2, -m_scaled[r]));
                pf[i >> 3][(i & 7) >> 1] = pack_bf16(e0, e1);
                acc[(j >> 1) & 3] += e0 + e1;
            }
            sum[r] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        }
    };
    const float m_old[2] = {m[0] * scale_log2, m[1] * scale_log2};
    exponentials(m_old);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float t[N / 4];
#pragma unroll
        for (int j = 0; j < N / 4; ++j) t[j] = s[row_element(r, j)];
        tree_max<N / 8>(t);
        mx[r] = fmaxf(t[0], __shfl_xor_sync(0xffffffff, t[0], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
    }
    const bool grew = (mx[0] - m[0]) * scale_log2 > 8.f || (mx[1] - m[1]) * scale_log2 > 8.f;
    if (!__any_sync(0xffffffff, grew)) {
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] += sum[r];
        return false;
    }
    float m_new[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float mn = fmaxf(m[r], mx[r]);
        m_new[r] = mn * scale_log2;
        rescale[r] = exp2_ftz(m_old[r] - m_new[r]);
        m[r] = mn;
    }
    exponentials(m_new);
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * rescale[r] + sum[r];
    return true;
}

// ---- The kernel --------------------------------------------------------------------------------
// Two consumers take turns (ping-pong); one consumer (two CTAs per SM) has no one to turn with.
template <int D, int CONSUMERS>
__global__ void __launch_bounds__(config<D, CONSUMERS>::threads, config<D, CONSUMERS>::ctas_per_sm)
forward_kernel(const __grid_constant__ kernel_params p) {
    using C = config<D, CONSUMERS>;
    constexpr bool PINGPONG = CONSUMERS == 2;
    using namespace tk;
    constexpr int BM = C::block_m, BN = C::block_n, S = C::stages;

    extern __shared__ uint8_t smem_raw[];
    __shared__ mbarrier q_full, k_full[S], k_empty[S], v_full[S], v_empty[S];
    // 128B-swizzled tiles must start on 1024-byte boundaries (descriptor base offset 0).
    const uint32_t smem = (smem_addr(smem_raw) + 1023) & ~1023u;
    const uint32_t q_tile = smem;
    auto k_tile = [&](int s) { return smem + C::q_bytes + s * C::kv_bytes; };
    auto v_tile = [&](int s) { return smem + C::q_bytes + (S + s) * C::kv_bytes; };

    const work_item item = item_at(blockIdx.x, p);     // one CTA per query block
    const int b = item.b, h = item.h, m_block = item.m_block;
    const int m0 = m_block * BM;
    const int kv_end = p.causal ? min(p.seq_len, m0 + BM) : p.seq_len;
    const int n_tiles = (kv_end + BN - 1) / BN;
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        mbar::init(q_full, 1);
        for (int s = 0; s < S; ++s) {
            mbar::init(k_full[s], 1);
            mbar::init(v_full[s], 1);
            mbar::init(k_empty[s], C::consumers * 4);   // lane 0 of every consumer warp
            mbar::init(v_empty[s], C::consumers * 4);
        }
        mbar::fence_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        // ================= producer: one thread issues every copy =================
        warpgroup_decrease_registers<C::producer_regs>();
        if (threadIdx.x / 32 == 0 && elect_one()) {
            auto load = [&](uint32_t dst, const CUtensorMap* map, int row, mbarrier& bar) {
#pragma unroll
                for (int cb = 0; cb < C::col_blocks; ++cb)
                    tma::load_box_4d(dst + cb * (C::kv_bytes / C::col_blocks), map, cb * 64, row, h, b, bar);
            };
            auto load_k = [&](int n) {
                int s = n % S;
                mbar::wait(k_empty[s], ((n / S) & 1) ^ 1);
                mbar::arrive_expect_bytes(k_full[s], C::kv_bytes);
                load(k_tile(s), &p.k_map, n * BN, k_full[s]);
            };
            auto load_v = [&](int n) {
                int s = n % S;
                mbar::wait(v_empty[s], ((n / S) & 1) ^ 1);
                mbar::arrive_expect_bytes(v_full[s], C::kv_bytes);
                load(v_tile(s), &p.v_map, n * BN, v_full[s]);
            };
            mbar::arrive_expect_bytes(q_full, C::q_bytes);
#pragma unroll
            for (int cb = 0; cb < C::col_blocks; ++cb)   // Q column block = BM rows x 128 B
                tma::load_box_4d(q_tile + cb * (C::q_bytes / C::col_blocks), &p.q_map, cb * 64, m0, h, b, q_full);
            load_k(0);
            for (int n = 1; n < n_tiles; ++n) { load_k(n); load_v(n - 1); }
            load_v(n_tiles - 1);
        }
        return;
    }

    // ================= consumers =================
    warpgroup_increase_registers<C::consumer_regs>();
    const int c = warpgroup - 1;                        // which 64 query rows of the block
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int row0 = m0 + 64 * c + 16 * warp + lane / 4; // this thread's rows: row0, row0 + 8
    const int first_row = m0 + 64 * c;                   // this warpgroup's first query row

    wgmma::accumulator<BN> s_acc;                        // 64 x 128 scores (64 f32 / thread)
    wgmma::accumulator<D> o_acc;                         // 64 x D output (D/2 f32 / thread)
    uint32_t p_frag[BN / 16][4];                         // P as the bf16 A operand of P·V
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, rescale[2];

    // Ping-pong turns between the two consumers: named barriers 1 (consumer 0's turn) and 2.
    auto turn_begin = [&] { if constexpr (PINGPONG) named_sync<256>(1 + c); };
    auto turn_end = [&] { if constexpr (PINGPONG) named_arrive<256>(1 + (1 - c)); };
    auto release = [&](mbarrier& bar) { if (lane == 0) mbar::arrive(bar); };

    auto issue_qk = [&](int n) {                         // S = Q · Kₙᵀ
        int s = n % S;
        mbar::wait(k_full[s], (n / S) & 1);
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < D / 16; ++k)
            wgmma::mma_ss<wgmma::major::K, wgmma::major::K>(
                s_acc, wgmma::desc<wgmma::major::K, BM, 128>(q_tile, 64 * c, k),
                wgmma::desc<wgmma::major::K, BN, 128>(k_tile(s), 0, k), k > 0);
        wgmma::commit_group();
    };
    auto issue_pv = [&](int n, bool accumulate) {        // O (+)= P · Vₙ
        int s = n % S;
        mbar::wait(v_full[s], (n / S) & 1);
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < BN / 16; ++k)
            wgmma::mma_rs<wgmma::major::MN>(o_acc, p_frag[k],
                                            wgmma::desc<wgmma::major::MN, BN, 128>(v_tile(s), 0, k),
                                            accumulate || k > 0);
        wgmma::commit_group();
    };
    // Does tile n need element masks for this warpgroup? (crosses the diagonal, or the tail)
    auto needs_mask = [&](int n) {
        return p.causal ? (n * BN + BN - 1 > first_row) : (n * BN + BN > p.seq_len);
    };

    if (PINGPONG && c == 1) named_arrive<256>(1);        // consumer 0 goes first
    mbar::wait(q_full, 0);

    turn_begin();
    issue_qk(0);
    turn_end();
    wgmma::wait_group<0>();
    wgmma::fence_operand(s_acc);
    release(k_empty[0]);
    softmax_tile<BN>(s_acc.d, m, l, rescale, needs_mask(0), p.causal, row0, 0, p.seq_len, p.scale_log2);
    scores_to_a_operand<BN>(p_frag, s_acc.d);

    for (int n = 1; n < n_tiles; ++n) {
        turn_begin();
        issue_qk(n);
        issue_pv(n - 1, n > 1);
        turn_end();
        wgmma::wait_group<1>();                          // S = Q·Kₙᵀ is done (P·V may still run)
        wgmma::fence_operand(s_acc);
        release(k_empty[n % S]);
        softmax_tile<BN>(s_acc.d, m, l, rescale, needs_mask(n), p.causal, row0, n * BN, p.seq_len,
                         p.scale_log2);
        wgmma::wait_group<0>();                          // O += P·Vₙ₋₁ is done
        wgmma::fence_operand(o_acc);
        keep_alive(p_frag);                              // P stays put until P·V has read it
        release(v_empty[(n - 1) % S]);
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o_acc.d[i] *= rescale[(i >> 1) & 1];
        scores_to_a_operand<BN>(p_frag, s_acc.d);
    }
    turn_begin();
    issue_pv(n_tiles - 1, n_tiles > 1);
    turn_end();
    wgmma::wait_group<0>();
    wgmma::fence_operand(o_acc);
    release(v_empty[(n_tiles - 1) % S]);
    if (PINGPONG && c == 0) named_sync<256>(1);          // consume consumer 1's last turn_end

    // ---- epilogue: O /= l, store O (bf16) and LSE ----
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    }
    float inv_l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) inv_l[r] = (l[r] > 0.f) ? 1.f / l[r] : 0.f;
    const int t = lane % 4;
    __nv_bfloat16* o_head = p.o + b * p.o_stride_batch + h * p.o_stride_head;
#pragma unroll
    for (int i = 0; i < D / 2; i += 2) {
        int r = (i >> 1) & 1;
        int row = row0 + 8 * r;
        int col = 8 * (i >> 2) + 2 * t;
        if (row < p.seq_len)
            *reinterpret_cast<uint32_t*>(o_head + row * p.o_stride_seq + col) =
                pack_bf16(o_acc.d[i] * inv_l[r], o_acc.d[i + 1] * inv_l[r]);
    }
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            int row = row0 + 8 * r;
            if (row < p.seq_len)
                p.lse[(int64_t(b) * p.heads + h) * p.seq_len + row] =
                    l[r] > 0.f ? (m[r] * p.scale_log2 + log2f(l[r])) * 0.69314718055994531f : -INFINITY;
        }
    }
}

// ---- The persistent kernel (variants 8, 11-13): one CTA per SM walks over many query blocks ----
// The same producer / two ping-pong consumers / intra-warpgroup overlap as forward_kernel, but the
// grid is one CTA per SM and each CTA takes work items blockIdx.x, + gridDim.x, ... (item_at's
// order). At the GPT-2 shape a CTA of forward_kernel owns 4.5 key tiles on average, and its start
// (barrier init, Q and the first K arriving from memory, the first S with nothing to overlap) and
// its end (the last P·V, the stores) are paid again for every query block. Here they are paid
// once per CTA: the producer runs ahead into the next item as soon as ring slots free up (Q has
// two slots, q_full / q_empty, so the next item's Q lands while this one's is still read), and the
// consumers' epilogue (O from registers to global memory) overlaps the next item's first loads.
// The K/V ring's slot and parity count tiles over the CTA's whole life (`tile`, not n), Q's count
// items (`j`); the ping-pong turns simply continue from item to item (both consumers take
// n_tiles + 1 turns per item).
// Where the consumer is in the K/V ring: slot and the parity to wait for; counting up by one tile
// at a time instead of slot = g % STAGES, parity = (g / STAGES) & 1 (a division by 3 per tile).
template <int STAGES>
struct ring_pos {
    int slot = 0, phase = 0;
    __device__ void next() { if (++slot == STAGES) { slot = 0; phase ^= 1; } }
};

// A wgmma descriptor moved `bytes` further into shared memory: the start address is the low 14
// bits in 16-byte units and shared addresses stay below 2^18, so the sum never leaves the field.
// One add per wgmma instead of rebuilding the descriptor (about 5 instructions each, SASS).
__device__ inline uint64_t desc_plus(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
// The byte offset of k-step k (16 columns) in a K-major tile of `rows` rows stored as 64-column
// blocks of rows x 128 B (tk::wgmma::desc's rule).
template <int rows>
__device__ constexpr uint32_t k_step_bytes(int k) { return (k / 4) * rows * 128 + (k % 4) * 32; }
// The first half of a score accumulator: the accumulator of an m64n(N/2) wgmma has exactly the
// layout of the first N/4 registers of an m64nN one (columns 0 .. N/2 - 1, hopper-facts §4.2).
template <int LEN>
__device__ inline float (&first_half(float (&d)[LEN]))[LEN / 2] { return *reinterpret_cast<float(*)[LEN / 2]>(&d); }

// LEAN_EPILOGUE (see persistent_kernel): 1/l by the MUFU's approximate reciprocal (rel. error
// ~2^-23), instead of the IEEE division's refinement and slow-path branch.
__device__ inline float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// LEAN_EPILOGUE: one box of shared memory (written in the map's 128B-swizzled layout) to the 4-D
// tensor at element coordinates (d, t, h, b), in this thread's current bulk async-group; rows past
// the end of the sequence are clipped by the TMA unit. The store twin of tk::tma::load_box_4d
// (tk/ops/group/tma_4d.cuh, where it belongs once another kernel needs it).
__device__ inline void store_box_4d(const CUtensorMap* map, uint32_t src, int d, int t, int h, int b) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
                 :: "l"(map), "r"(src), "r"(d), "r"(t), "r"(h), "r"(b) : "memory");
}

// PDL: wait until the kernel before this one in the stream has completed and its writes are visible
// (returns at once when this kernel was launched without the programmatic attribute).
__device__ inline void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// CONSUMERS = 1 (variant 8, D = 64): the same with one consumer, two CTAs per SM (grid 2 x SMs)
// and no ping-pong, as variant 4; its K/V ring has 2 slots, so that two CTAs fit in shared memory.
template <int D, int CONSUMERS>
struct persistent_config : config<D, CONSUMERS> {
    using C = config<D, CONSUMERS>;
    static constexpr int q_slots = 2;
    static constexpr int stages = CONSUMERS == 2 ? C::stages : 2;
    static constexpr int smem_bytes = q_slots * C::q_bytes + 2 * stages * C::kv_bytes + 1024;   // 129 / 193 / 81 KB
};

// Dynamic scheduling (DYNAMIC, variants 11-13): the next item is whatever a counter hands out
// (atomicAdd), so a CTA that drew short items takes more of them; the static order (item +
// gridDim.x) left up to a quarter of the SMs' time idle at the end with L2 groups (ncu: 155k of
// 181k cycles active; the items of a group are sorted by cost, so a fixed stride gives some CTAs
// mostly heavy ones). The counter is the launch's own (kernel_params::work_counter, one zeroed
// uint32 the caller allocates per launch, as FA3's tile schedulers take their
// tile_count_semaphore), so launches in flight at once on several streams cannot take each
// other's items. (Until session 5 it was one global counter per GPU that reset itself at the end
// of each launch: two launches on two streams shared it and skipped work.)

// LEAN_EPILOGUE (session 6; variant 21, the default since then; false: sessions 4-5's epilogue,
// variants 8, 11-13): what an item costs besides its tiles. Session 5's ncu of the old default
// (call 3, SASS stall samples) put ~2000 cycles per item per consumer warp in the epilogue (~13%
// of the consumers' samples): its 16 (D = 64) or 32 scattered 4-byte global stores of O per thread
// queue up behind each other (one wait alone, on a register an in-flight store still had to read,
// took 4.5% of all samples), the 64-bit address of each store is rebuilt, 1/l and log2(l) take
// IEEE-exact paths with branches, and item_at's divisions land there too; and ~880 cycles at the
// item's start, half of them item_at's integer divisions. The lean epilogue:
//   - the producer decodes each item once (item_of holds {item, b, h, m_block});
//   - 1/l and log2(l) by the approximate MUFU instructions (rcp.approx, lg2.approx: ~1 ulp; the
//     LSE tolerance is 1e-3);
//   - O goes out through shared memory and ONE TMA store per warpgroup and 64 columns: each
//     consumer writes its 64 x D block of O into its own 64 rows of the item's Q slot (its last
//     S = Q·Kᵀ is done, and the other consumer never reads those rows), in Q's 128B-swizzled
//     layout, so the store's tensor map is Q's with boxes of 64 rows; the TMA store clips rows
//     past the sequence. The warps move on at once. The slot goes back to the producer (q_empty)
//     only once the store has read it: the storing thread waits for that
//     (cp.async.bulk.wait_group.read) after the next item's first S = Q·K₀ᵀ, when its warpgroup
//     waits for that product anyway, and all its warpgroup's threads arrive there. The producer
//     needs the slot back only for the item after next, so the later arrival costs it nothing.
// H200, session 6's call 2, GPT-2 shape, timed in turns: 0.0795 ms against the old default's
// 0.0914 and cuDNN's 0.0865 (kernels/NOTES.md, "Session 6: A"). Tried beside it and taken out
// (code in git at d87342f): 22 = the same without the TMA store (O's row addresses once) 0.0828;
// 23 = 21 with the loop's turn around S's issue only 0.0796; 24 = 13 with this epilogue 0.0812.
// And in call 3 (code in git at 32f66a3): 25 = 21 with the items overlapped (an item's last P·V
// and the next item's S0 in one turn, the epilogue under that S0; session 5's variant 15): GPT-2
// 0.0800 against 21's 0.0797, shakespeare-char 0.0278 against 0.0269 (t4096-d128 0.4785 against
// 0.4887, inside that shape's spread).
//
// SELF_RESET (session 7; variant 30, the default since then): the work counter need not be zeroed
// for each call. Each CTA takes exactly one ticket (atomicAdd) per item it runs, so a launch hands
// out exactly n_items tickets, and the one that takes the last (n_items - 1) sets the counter back
// to 0: no other ticket of this launch can follow it. The caller gives a counter that is zero and
// that no other launch uses meanwhile (the bindings: one per CUDA stream, one of its own for each
// launch captured into a CUDA graph). H200, session 7's call 2, timed in turns: GPT-2 shape
// 0.0782 ms against 21's 0.0794 (cuDNN 0.0864), shakespeare-char 0.0250 against 0.0265: the
// zeroing kernel before every launch (at::zeros, a FillFunctor<int> node) and its dependency
// cost ~1.2 us a call (zeroing by a memset node instead, variant 31 in call 3: 0.0794, no gain).
// PDL (variant 26): launched as a programmatic dependent of the kernel before it in the stream
// (cudaLaunchAttributeProgrammaticStreamSerialization, see launch_persistent), the CTAs may start
// while that kernel still finishes: the barrier setup and the tensor-map fetches overlap its end,
// and every thread waits (griddepcontrol.wait) for it to complete and flush before anything
// touches global memory (q, k, v may be what it wrote; o's memory may be what it still reads; the
// work counter is what a zeroing kernel just before writes). Call 2: 0.0792 against 21's 0.0794
// with the counter's zeroing kernel before it (the noise).
// Tried beside them in calls 2 and 3 and taken out (code in git at 0178bd2): 27 = 26 + the first item's
// Q, K and V asked of L2 (cp.async.bulk.prefetch.tensor) before the wait: 0.0804 (slower; the
// prefetches only doubled the first requests); 28 / 29 = 27 + every 8th / 4th exponential by a
// cubic on the FMA pipe (Cody-Waite, FA4's trick): 0.0817 / 0.0833, the more the slower, as
// session 5's variant 17: the consumer warps are issue- and latency-bound, not MUFU-bound.
//
// DOUBLE_P, LEAN_SOFTMAX, STALE_MAX (session 8; variants 33 and 37, the default): a consumer warp's loop turn is its own
// dependent instruction stream (session 6's ncu: ~2,080 cycles per turn for ~1,024 of tensor work,
// stalls mostly fixed-latency waits, nothing saturated), so both shorten that stream. DOUBLE_P: P
// alternates between two register arrays, so tile n's P is converted right after its exponentials
// (ptxas puts the conversions between the MUFUs, which it spaces 8 cycles apart) while P·Vₙ₋₁ still
// reads the other array; after the wait only O's rescale is left. LEAN_SOFTMAX: the mask decision
// as one compare per tile (mask_from, once per item), consumer 1's diagonal tile masked on its last
// 64 keys only, the rescale factor by ex2.approx. STALE_MAX (on top of both): the exponentials of
// tiles after the first are taken against the running max as it is, and the tile's row max (FMNMX
// tree, shuffles) is worked out beside them; only when a row grew by more than 2^8 does the warp
// redo the tile against the new max (softmax_tile_stale_max). H200, session 8's call 2, GPT-2 shape
// in turns: 30 0.0762 ms, + DOUBLE_P 0.0780, + LEAN_SOFTMAX 0.0760, + both 0.0785, + all three (35,
// the tree-sum form of 37) 0.0721 (cuDNN 0.0841). DOUBLE_P alone loses: its loop is unrolled by two (register arrays cannot
// be indexed at run time) and the bigger loop misses in the instruction cache (ncu of 35: "no
// instruction" stalls 5% of the samples, against 2% for 21); with STALE_MAX the turn is short
// enough that it pays anyway, so DOUBLE_P comes only with STALE_MAX now. kernels/NOTES.md, "Session 8: A".
template <int D, int CONSUMERS, bool HALF_TILE, bool LAZY = false, bool DYNAMIC = false, bool LEAN_EPILOGUE = false,
          bool PDL = false, bool SELF_RESET = false, bool DOUBLE_P = false, bool LEAN_SOFTMAX = false,
          bool STALE_MAX = false>
__global__ void __launch_bounds__(config<D, CONSUMERS>::threads, config<D, CONSUMERS>::ctas_per_sm)
persistent_kernel(const __grid_constant__ kernel_params p) {
    using C = persistent_config<D, CONSUMERS>;
    using namespace tk;
    static_assert(!STALE_MAX || (DOUBLE_P && LEAN_SOFTMAX), "STALE_MAX is written on top of DOUBLE_P and LEAN_SOFTMAX");
    static_assert(DOUBLE_P == STALE_MAX, "DOUBLE_P alone (32) and with LEAN_SOFTMAX (34, 35 at D = 128) lost and were removed");
    constexpr bool PINGPONG = CONSUMERS == 2;          // as forward_kernel
    constexpr int BM = C::block_m, BN = C::block_n, S = C::stages, QS = C::q_slots;

    extern __shared__ uint8_t smem_raw[];
    __shared__ mbarrier q_full[QS], q_empty[QS], k_full[S], k_empty[S], v_full[S], v_empty[S];
    // The item whose Q is in each slot; -1: no more. LEAN_EPILOGUE: {item, b, h, m_block}.
    __shared__ std::conditional_t<LEAN_EPILOGUE, int4, int> item_of[QS];
    const uint32_t smem = (smem_addr(smem_raw) + 1023) & ~1023u;
    auto q_tile = [&](int s) { return smem + s * C::q_bytes; };
    auto k_tile = [&](int s) { return smem + QS * C::q_bytes + s * C::kv_bytes; };
    auto v_tile = [&](int s) { return smem + QS * C::q_bytes + (S + s) * C::kv_bytes; };
    const int n_items = p.batch_heads * p.m_blocks;
    auto tiles_of = [&](int m_block) {
        const int kv_end = p.causal ? min(p.seq_len, (m_block + 1) * BM) : p.seq_len;
        return (kv_end + BN - 1) / BN;
    };
    const int warpgroup = threadIdx.x / 128;

    if (PDL && threadIdx.x == 0) {                      // before the wait: nothing here reads memory
        tma::prefetch(&p.q_map);                        // that the kernel before this one writes
        tma::prefetch(&p.k_map);
        tma::prefetch(&p.v_map);
        if constexpr (LEAN_EPILOGUE) tma::prefetch(&p.o_map);
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < QS; ++s) {
            mbar::init(q_full[s], 1);
            mbar::init(q_empty[s], C::consumers * 128); // every consumer thread (release_all)
        }
        for (int s = 0; s < S; ++s) {
            mbar::init(k_full[s], 1);
            mbar::init(v_full[s], 1);
            mbar::init(k_empty[s], C::consumers * 4);
            mbar::init(v_empty[s], C::consumers * 4);
        }
        mbar::fence_init();
    }
    __syncthreads();
    if constexpr (PDL) wait_for_previous_grid();

    if (warpgroup == 0) {
        // ================= producer: one thread issues every copy, item after item =================
        warpgroup_decrease_registers<C::producer_regs>();
        if (threadIdx.x / 32 == 0 && elect_one()) {
            int tile = 0;                                // K/V tiles loaded so far (this CTA)
            for (int item = blockIdx.x, j = 0;; ++j) {
                const int qs = j % QS;
                mbar::wait(q_empty[qs], ((j / QS) & 1) ^ 1);
                if (item >= n_items) {                   // tell the consumers there is no more
                    if constexpr (LEAN_EPILOGUE) item_of[qs] = make_int4(-1, 0, 0, 0);
                    else item_of[qs] = -1;
                    mbar::arrive(q_full[qs]);
                    break;
                }
                if constexpr (!LEAN_EPILOGUE) item_of[qs] = item;   // published by q_full's phase (release)
                // The next item, asked for now so the atomic's latency hides under this item's copies.
                const int next = DYNAMIC ? int(gridDim.x + atomicAdd(p.work_counter, 1u)) : item + gridDim.x;
                if constexpr (SELF_RESET)                // the launch's last ticket: no atomicAdd follows it
                    if (next - int(gridDim.x) == n_items - 1) atomicExch(p.work_counter, 0u);
                const work_item w = item_at(item, p);
                if constexpr (LEAN_EPILOGUE) item_of[qs] = make_int4(item, w.b, w.h, w.m_block);
                const int n_tiles = tiles_of(w.m_block);
                auto load = [&](uint32_t dst, const CUtensorMap* map, int row, int bytes, mbarrier& bar) {
#pragma unroll
                    for (int cb = 0; cb < C::col_blocks; ++cb)
                        tma::load_box_4d(dst + cb * (bytes / C::col_blocks), map, cb * 64, row, w.h, w.b, bar);
                };
                auto load_kv = [&](int n, mbarrier* empty, mbarrier* full, bool is_k) {
                    const int g = tile + n, s = g % S;
                    mbar::wait(empty[s], ((g / S) & 1) ^ 1);
                    mbar::arrive_expect_bytes(full[s], C::kv_bytes);
                    load(is_k ? k_tile(s) : v_tile(s), is_k ? &p.k_map : &p.v_map, n * BN, C::kv_bytes, full[s]);
                };
                mbar::arrive_expect_bytes(q_full[qs], C::q_bytes);
                load(q_tile(qs), &p.q_map, w.m_block * BM, C::q_bytes, q_full[qs]);
                load_kv(0, k_empty, k_full, true);
                for (int n = 1; n < n_tiles; ++n) {
                    load_kv(n, k_empty, k_full, true);
                    load_kv(n - 1, v_empty, v_full, false);
                }
                load_kv(n_tiles - 1, v_empty, v_full, false);
                tile += n_tiles;
                item = next;
            }
        }
        return;
    }

    // ================= consumers =================
    warpgroup_increase_registers<C::consumer_regs>();
    // Which 64 query rows of each block. Broadcast from lane 0 (CUTLASS does the same): ptxas then
    // knows c is the same in the whole warp, and the half-tile branches around wgmmas below are not
    // "divergent paths" (C7520, which serialises every wgmma of the kernel).
    const int c = __shfl_sync(0xffffffff, warpgroup, 0) - 1;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t = lane % 4;

    wgmma::accumulator<BN> s_acc;
    wgmma::accumulator<D> o_acc;
    uint32_t p_frag[BN / 16][4];
    uint32_t p_frag2[BN / 16][4];                       // DOUBLE_P: tiles alternate between the two
    float m[2], l[2], rescale[2];

    auto turn_begin = [&] { if constexpr (PINGPONG) named_sync<256>(1 + c); };
    auto turn_end = [&] { if constexpr (PINGPONG) named_arrive<256>(1 + (1 - c)); };
    // A K or V slot is read only by wgmma, whose reads are complete in every thread once its
    // wait_group returns: one arrival per warp frees it. Q's slot also holds item_of, which
    // every thread reads with a plain load, and an arrive (release) orders only the arriving
    // thread's own reads before the producer's next write: so every thread arrives there
    // (with lane 0 alone, lanes 1-31 could still be reading item_of when the producer rewrites
    // it two items later; the backward had this race on its lse/Di slots, compute-sanitizer
    // racecheck, session 5).
    auto release = [&](mbarrier& bar) { if (lane == 0) mbar::arrive(bar); };
    auto release_all = [&](mbarrier& bar) { mbar::arrive(bar); };

    // Descriptors of slot 0 and k-step 0; the others are these plus a byte offset (desc_plus).
    const uint64_t q_desc0 = wgmma::desc<wgmma::major::K, BM, 128>(q_tile(0), 64 * c, 0);
    const uint64_t k_desc0 = wgmma::desc<wgmma::major::K, BN, 128>(k_tile(0), 0, 0);
    const uint64_t v_desc0 = wgmma::desc<wgmma::major::MN, BN, 128>(v_tile(0), 0, 0);
    ring_pos<S> k_pos, v_pos;                           // the next K and V tile in the ring

    // The item whose Q is in slot j % QS (waits for it). The same in every thread; the shfl tells
    // ptxas so (see c above). Every lane reads item_of with a plain load, so every thread arrives
    // on q_empty (see release_all).
    // LEAN_EPILOGUE: {item, b, h, m_block}; else {item, -, -, -}.
    auto item_in_slot = [&](int j) {
        mbar::wait(q_full[j % QS], (j / QS) & 1);
        if constexpr (LEAN_EPILOGUE) {
            const int4 v = item_of[j % QS];
            return make_int4(__shfl_sync(0xffffffff, v.x, 0), __shfl_sync(0xffffffff, v.y, 0),
                             __shfl_sync(0xffffffff, v.z, 0), __shfl_sync(0xffffffff, v.w, 0));
        } else {
            return make_int4(__shfl_sync(0xffffffff, item_of[j % QS], 0), 0, 0, 0);
        }
    };
    // Both return the ring slot they read, for the release once the product is done.
    auto issue_qk = [&](int q_slot) {                   // S = Q · Kₙᵀ, n = the next K in the ring
        const int s = k_pos.slot;
        mbar::wait(k_full[s], k_pos.phase);
        k_pos.next();
        const uint64_t q_desc = desc_plus(q_desc0, q_slot * C::q_bytes), k_desc = desc_plus(k_desc0, s * C::kv_bytes);
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < D / 16; ++k)
            wgmma::mma_ss<wgmma::major::K, wgmma::major::K>(s_acc, desc_plus(q_desc, k_step_bytes<BM>(k)),
                                                            desc_plus(k_desc, k_step_bytes<BN>(k)), k > 0);
        wgmma::commit_group();
        return s;
    };
    // O (+)= P · Vₙ, n = the next V in the ring, P from pf (p_frag; DOUBLE_P: p_frag or p_frag2)
    auto issue_pv = [&](uint32_t (&pf)[BN / 16][4], bool accumulate, bool half) {
        const int s = v_pos.slot;
        mbar::wait(v_full[s], v_pos.phase);
        v_pos.next();
        const uint64_t v_desc = desc_plus(v_desc0, s * C::kv_bytes);
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < BN / 16; ++k)               // k-step k: the next 16 keys = 16 rows of 128 B
            if (!half || k < BN / 32)
                wgmma::mma_rs<wgmma::major::MN>(o_acc, pf[k], desc_plus(v_desc, k * 16 * 128), accumulate || k > 0);
        wgmma::commit_group();
        return s;
    };

    if (PINGPONG && c == 1) named_arrive<256>(1);       // consumer 0 goes first
    for (int j = 0;; ++j) {
        const int qs = j % QS;
        const int4 item = item_in_slot(j);
        if (item.x < 0) {
            if constexpr (LEAN_EPILOGUE) tma::store_wait<0>();   // the last O store is out before the CTA ends
            break;
        }
        const work_item w = LEAN_EPILOGUE ? work_item{item.y, item.z, item.w} : item_at(item.x, p);
        const int n_tiles = tiles_of(w.m_block);
        const int first_row = w.m_block * BM + 64 * c;   // this warpgroup's first query row
        const int row0 = first_row + 16 * warp + lane / 4;

        // HALF_TILE: is the last tile's second half (keys n·BN + BN/2 ..) masked for every row of this
        // warpgroup? (Causal: consumer 0's diagonal tile, always; else a short sequence tail.) Then
        // that tile's softmax and P·V take its first half only: half the exponentials and P·V k-steps.
        // (S = Q·Kᵀ stays whole: as an m64n64 wgmma into half the accumulator, ptxas serialised the
        // kernel's wgmmas, C7511.)
        const int last_row = p.causal ? min(first_row + 63, p.seq_len - 1) : p.seq_len - 1;
        const bool last_half = HALF_TILE && (n_tiles - 1) * BN + BN / 2 > last_row;
        auto is_half = [&](int n) { return HALF_TILE && last_half && n == n_tiles - 1; };

        auto needs_mask = [&](int n) {
            return p.causal ? (n * BN + BN - 1 > first_row) : (n * BN + BN > p.seq_len);
        };
        // LEAN_SOFTMAX: the same test as one compare per tile: the first tile that needs masks, once per
        // item ((n + 1)·BN > first_row + 1, causal; (n + 1)·BN > seq_len, else), instead of re-reading
        // p.causal and rebuilding both sides per tile (~50 issue cycles per tile in the SASS).
        const int mask_from = p.causal ? (first_row + 1) / BN : p.seq_len / BN;
        auto scores_to_probabilities = [&](int n, bool half) {   // mask, online softmax (P stays in s_acc)
            if constexpr (LEAN_SOFTMAX) {
                if (half) {
                    if (n >= mask_from) mask_tile<BN / 2>(first_half(s_acc.d), p.causal, row0, n * BN, p.seq_len);
                    softmax_tile<BN / 2, LAZY, true>(first_half(s_acc.d), m, l, rescale, false, p.causal, row0,
                                                     n * BN, p.seq_len, p.scale_log2);
                } else {
                    // Causal, and the tile's first BN/2 keys all at or left of this warpgroup's first
                    // row (consumer 1's diagonal tile): only the second half can hold masked keys.
                    if (n >= mask_from) {
                        if (p.causal && n * BN + BN / 2 - 1 <= first_row)
                            mask_tile<BN, true>(s_acc.d, true, row0, n * BN, p.seq_len);
                        else
                            mask_tile<BN>(s_acc.d, p.causal, row0, n * BN, p.seq_len);
                    }
                    softmax_tile<BN, LAZY, true>(s_acc.d, m, l, rescale, false, p.causal, row0, n * BN,
                                                 p.seq_len, p.scale_log2);
                }
                return;
            }
            if (half) {
                if (needs_mask(n)) mask_tile<BN / 2>(first_half(s_acc.d), p.causal, row0, n * BN, p.seq_len);
                softmax_tile<BN / 2, LAZY>(first_half(s_acc.d), m, l, rescale, false, p.causal, row0,
                                                 n * BN, p.seq_len, p.scale_log2);
            } else {
                if (needs_mask(n)) mask_tile<BN>(s_acc.d, p.causal, row0, n * BN, p.seq_len);
                softmax_tile<BN, LAZY>(s_acc.d, m, l, rescale, false, p.causal, row0, n * BN,
                                             p.seq_len, p.scale_log2);
            }
        };
        // P (bf16) into pf (p_frag; DOUBLE_P: p_frag or p_frag2) as P·V's A operand; half: 4 k-steps
        auto to_a_operand = [&](uint32_t (&pf)[BN / 16][4], bool half) {
#pragma unroll
            for (int j = 0; j < BN / 16; ++j)
                if (!half || j < BN / 32)
#pragma unroll
                    for (int q = 0; q < 4; ++q) pf[j][q] = pack_bf16(s_acc.d[8 * j + 2 * q], s_acc.d[8 * j + 2 * q + 1]);
        };
        // DOUBLE_P: the softmax and P's conversion in one basic block for each case (half or whole
        // tile), so that ptxas can schedule the conversions between the exponentials (a conversion
        // after the branches' merge point waits for all of them).
        auto probabilities_into = [&](int n, bool half, uint32_t (&pf)[BN / 16][4]) {
            if (half) {
                scores_to_probabilities(n, true);
                to_a_operand(pf, true);
            } else {
                scores_to_probabilities(n, false);
                to_a_operand(pf, false);
            }
        };
        // STALE_MAX (tiles n >= 1): the masks as LEAN_SOFTMAX, then softmax_tile_stale_max. Returns
        // whether the warp moved its max (then O needs rescale[] once P·Vₙ₋₁ is done).
        auto probabilities_stale_max = [&](int n, bool half, uint32_t (&pf)[BN / 16][4]) {
            if (half) {
                if (n >= mask_from) mask_tile<BN / 2>(first_half(s_acc.d), p.causal, row0, n * BN, p.seq_len);
                return softmax_tile_stale_max<BN / 2>(first_half(s_acc.d), m, l, rescale,
                                                      *reinterpret_cast<uint32_t(*)[BN / 32][4]>(&pf), p.scale_log2);
            }
            if (n >= mask_from) {
                if (p.causal && n * BN + BN / 2 - 1 <= first_row)
                    mask_tile<BN, true>(s_acc.d, true, row0, n * BN, p.seq_len);
                else
                    mask_tile<BN>(s_acc.d, p.causal, row0, n * BN, p.seq_len);
            }
            return softmax_tile_stale_max<BN>(s_acc.d, m, l, rescale, pf, p.scale_log2);
        };

#pragma unroll
        for (int r = 0; r < 2; ++r) { m[r] = -INFINITY; l[r] = 0.f; }

        turn_begin();
        int k_slot = issue_qk(qs);
        turn_end();
        wgmma::wait_group<0>();
        wgmma::fence_operand(s_acc);
        release(k_empty[k_slot]);
        if constexpr (LEAN_EPILOGUE) {
            // The previous item's O store has read its Q slot: hand the slot back (see LEAN_EPILOGUE).
            // Only the storing thread has a bulk group to wait for; the others pass at once.
            if (j > 0) {
                tma::store_wait_read<0>();
                release_all(q_empty[(j - 1) % QS]);
            }
        }
        if constexpr (DOUBLE_P) {
            probabilities_into(0, is_half(0), p_frag);
        } else {
            scores_to_probabilities(0, is_half(0));
            to_a_operand(p_frag, is_half(0));
        }

        for (int n = 1; n < (DOUBLE_P ? 1 : n_tiles); ++n) {   // DOUBLE_P: its own loop, below
            turn_begin();
            k_slot = issue_qk(qs);
            const int v_slot = issue_pv(p_frag, n > 1, false);   // V of tile n - 1 (only the last tile is ever half)
            turn_end();
            wgmma::wait_group<1>();                      // S = Q·Kₙᵀ is done (P·V may still run)
            wgmma::fence_operand(s_acc);
            release(k_empty[k_slot]);
            scores_to_probabilities(n, is_half(n));
            wgmma::wait_group<0>();                      // O += P·Vₙ₋₁ is done
            wgmma::fence_operand(o_acc);
            keep_alive(p_frag);
            release(v_empty[v_slot]);
            if (!LAZY || __any_sync(0xffffffff, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
                for (int i = 0; i < D / 2; ++i) o_acc.d[i] *= rescale[(i >> 1) & 1];
            }
            to_a_operand(p_frag, is_half(n));
        }
        // ---- epilogue: O /= l, store O (bf16) and LSE; the producer is already loading the next item ----
        auto epilogue = [&] {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
                l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
            }
            float inv_l[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) inv_l[r] = (l[r] > 0.f) ? (LEAN_EPILOGUE ? rcp_approx(l[r]) : 1.f / l[r]) : 0.f;
            if constexpr (LEAN_EPILOGUE) {
                // O into this warpgroup's 64 rows of the Q slot (row-major 64-column blocks of 128-byte
                // rows, 128B swizzle: the 16-byte chunk k of row r sits at chunk k ^ (r % 8), and
                // r % 8 = lane / 4 here), then one TMA store per 64-column block.
                const uint32_t o_rows = q_tile(qs) + 64 * c * 128;
#pragma unroll
                for (int i = 0; i < D / 2; i += 2) {
                    const int r = (i >> 1) & 1, row = 16 * warp + lane / 4 + 8 * r, chunk = (i >> 2) % 8;
                    const uint32_t at = o_rows + (i >> 5) * (BM * 128) + row * 128 + ((chunk ^ (lane / 4)) << 4) + 4 * t;
                    asm volatile("st.shared.b32 [%0], %1;" :: "r"(at), "r"(pack_bf16(o_acc.d[i] * inv_l[r], o_acc.d[i + 1] * inv_l[r]))
                                 : "memory");
                }
                fence_proxy_async();                         // generic writes -> the TMA store's reads
                named_sync<128>(3 + c);                      // this warpgroup's rows are all written
                if (tid == 0 && first_row < p.seq_len) {
#pragma unroll
                    for (int cb = 0; cb < C::col_blocks; ++cb)
                        store_box_4d(&p.o_map, o_rows + cb * (BM * 128), cb * 64, first_row, w.h, w.b);
                    tma::store_commit_group();
                }
            } else {
                __nv_bfloat16* o_head = p.o + w.b * p.o_stride_batch + w.h * p.o_stride_head;
#pragma unroll
                for (int i = 0; i < D / 2; i += 2) {
                    const int r = (i >> 1) & 1, row = row0 + 8 * r, col = 8 * (i >> 2) + 2 * t;
                    if (row < p.seq_len)
                        *reinterpret_cast<uint32_t*>(o_head + row * p.o_stride_seq + col) =
                            pack_bf16(o_acc.d[i] * inv_l[r], o_acc.d[i + 1] * inv_l[r]);
                }
            }
            if (t == 0) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = row0 + 8 * r;
                    if (row < p.seq_len)
                        p.lse[(int64_t(w.b) * p.heads + w.h) * p.seq_len + row] =
                            l[r] > 0.f ? (m[r] * p.scale_log2 + (LEAN_EPILOGUE ? __log2f(l[r]) : log2f(l[r]))) * 0.69314718055994531f
                                       : -INFINITY;
                }
            }
        };

        if constexpr (DOUBLE_P) {
            // DOUBLE_P: P alternates between p_frag (even tiles) and p_frag2 (odd tiles), so tile n's
            // P is packed to bf16 right after its exponentials, while P·Vₙ₋₁ still reads the other
            // buffer, instead of after the wait for P·Vₙ₋₁. The 32 conversions (F2FP, 2 issue cycles
            // each) fill the gaps between the MUFU.EX2s (ptxas spaces those 8 cycles apart) instead of
            // sitting between the wait and the next turn. Register arrays cannot be indexed at run
            // time, so the loop takes two tiles per pass, and the last turn is written for either
            // buffer. Registers per thread (ptxas, session 8): 163 -> 183 at D = 64 and 194 -> 215 at
            // D = 128 for DOUBLE_P alone (variant 32), of the 240.
            auto tile_step = [&](int n, uint32_t (&p_read)[BN / 16][4], uint32_t (&p_write)[BN / 16][4]) {
                turn_begin();
                k_slot = issue_qk(qs);
                const int v_slot = issue_pv(p_read, n > 1, false);
                turn_end();
                wgmma::wait_group<1>();                  // S = Q·Kₙᵀ is done (P·Vₙ₋₁ may still run)
                wgmma::fence_operand(s_acc);
                release(k_empty[k_slot]);
                // Did the warp's rows take a new max? (P·Vₙ₋₁ reads p_read, not p_write.)
                const bool moved = probabilities_stale_max(n, is_half(n), p_write);
                wgmma::wait_group<0>();                  // O += P·Vₙ₋₁ is done
                wgmma::fence_operand(o_acc);
                keep_alive(p_read);
                release(v_empty[v_slot]);
                if (moved) {
#pragma unroll
                    for (int i = 0; i < D / 2; ++i) o_acc.d[i] *= rescale[(i >> 1) & 1];
                }
            };
            auto last_turn = [&](uint32_t (&p_last)[BN / 16][4]) {
                turn_begin();
                const int v_slot = issue_pv(p_last, n_tiles > 1, last_half);
                turn_end();
                wgmma::wait_group<0>();
                wgmma::fence_operand(o_acc);
                keep_alive(p_last);
                release(v_empty[v_slot]);
            };
            for (int n = 1;; n += 2) {
                if (n >= n_tiles) { last_turn(p_frag); break; }
                tile_step(n, p_frag, p_frag2);
                if (n + 1 >= n_tiles) { last_turn(p_frag2); break; }
                tile_step(n + 1, p_frag2, p_frag);
            }
        } else {
            turn_begin();
            const int v_slot = issue_pv(p_frag, n_tiles > 1, last_half);
            turn_end();
            wgmma::wait_group<0>();
            wgmma::fence_operand(o_acc);
            release(v_empty[v_slot]);
        }
        // Every S of this item is done: Q's slot is free (LEAN_EPILOGUE: once O, written there, is out).
        if constexpr (!LEAN_EPILOGUE) release_all(q_empty[qs]);
        epilogue();
    }
    if (PINGPONG && c == 0) named_sync<256>(1);         // consume consumer 1's last turn_end
}

// ---- Host side -----------------------------------------------------------------------------------
// The kernels' parameters: tensor maps (Q in boxes of block_m rows, K and V of block_n), O, LSE,
// and the work-item order: l2_groups = false is the first kernels' order (one group of all heads).
template <int D, int BLOCK_M, int BLOCK_N>
cudaError_t make_params(const AttentionForwardParams& a, bool l2_groups, kernel_params& kp) {
    const AttentionShape& sh = a.shape;
    kp = kernel_params{};
    const AttentionTensor* in[3] = {&a.q, &a.k, &a.v};
    CUtensorMap* maps[3] = {&kp.q_map, &kp.k_map, &kp.v_map};
    for (int i = 0; i < 3; ++i) {
        std::string why = tk::tma::make_bhtd_tensor_map(
            maps[i], in[i]->data, sh.batch, sh.heads, sh.seq_len, D, in[i]->stride_batch,
            in[i]->stride_head, in[i]->stride_seq, i == 0 ? BLOCK_M : BLOCK_N);
        if (!why.empty()) return cudaErrorInvalidValue;
    }
    kp.o = static_cast<__nv_bfloat16*>(a.o.data);
    kp.o_stride_batch = a.o.stride_batch;
    kp.o_stride_head = a.o.stride_head;
    kp.o_stride_seq = a.o.stride_seq;
    kp.lse = a.lse;
    kp.heads = sh.heads;
    kp.seq_len = sh.seq_len;
    kp.scale_log2 = sh.scale * 1.4426950408889634f;
    kp.causal = sh.causal ? 1 : 0;
    kp.batch_heads = sh.batch * sh.heads;
    kp.m_blocks = (sh.seq_len + BLOCK_M - 1) / BLOCK_M;
    const int64_t kv_bytes_per_head = int64_t(sh.seq_len) * D * 2 * 2;   // K and V, bf16
    kp.heads_per_group = attention_l2::heads_per_group(l2_groups, kv_bytes_per_head, kp.batch_heads);
    return cudaSuccess;
}

// Once per kernel (and per process; the attribute is per device, we use the current one): more
// than 48 KB of dynamic shared memory, and all of the SM's 228 KB as shared memory.
template <typename Kernel>
cudaError_t allow_shared_memory(Kernel kernel, int bytes) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared));
    return e;
}

// One CTA per query block (forward_kernel).
template <int D, int CONSUMERS>
cudaError_t launch(const AttentionForwardParams& a, cudaStream_t stream, bool l2_groups) {
    using C = config<D, CONSUMERS>;
    kernel_params kp;
    if (cudaError_t e = make_params<D, C::block_m, C::block_n>(a, l2_groups, kp)) return e;
    auto kernel = forward_kernel<D, CONSUMERS>;
    static const cudaError_t configured = allow_shared_memory(kernel, C::smem_bytes);
    if (configured != cudaSuccess) return configured;
    kernel<<<kp.batch_heads * kp.m_blocks, C::threads, C::smem_bytes, stream>>>(kp);
    return cudaGetLastError();
}

// One CTA (two with one consumer) per SM, each walking over query blocks (persistent_kernel), in
// L2 groups of heads.
// PDL etc.: see persistent_kernel; with PDL the launch carries the programmatic-serialization attribute.
template <int D, int CONSUMERS, bool HALF_TILE, bool LAZY, bool DYNAMIC, bool LEAN_EPILOGUE = false,
          bool PDL = false, bool SELF_RESET = false, bool DOUBLE_P = false, bool LEAN_SOFTMAX = false,
          bool STALE_MAX = false>
cudaError_t launch_persistent(const AttentionForwardParams& a, cudaStream_t stream, unsigned int* work_counter) {
    using C = persistent_config<D, CONSUMERS>;
    if (DYNAMIC && work_counter == nullptr) return cudaErrorInvalidValue;   // see work_counter
    kernel_params kp;
    if (cudaError_t e = make_params<D, C::block_m, C::block_n>(a, true, kp)) return e;
    kp.work_counter = work_counter;
    if constexpr (LEAN_EPILOGUE) {   // O's map: boxes of one consumer's 64 rows
        const AttentionShape& sh = a.shape;
        std::string why = tk::tma::make_bhtd_tensor_map(&kp.o_map, a.o.data, sh.batch, sh.heads, sh.seq_len, D,
                                                        a.o.stride_batch, a.o.stride_head, a.o.stride_seq, 64);
        if (!why.empty()) return cudaErrorInvalidValue;
    }
    auto kernel = persistent_kernel<D, CONSUMERS, HALF_TILE, LAZY, DYNAMIC, LEAN_EPILOGUE, PDL, SELF_RESET, DOUBLE_P, LEAN_SOFTMAX,
                                    STALE_MAX>;
    static const cudaError_t configured = allow_shared_memory(kernel, C::smem_bytes);
    if (configured != cudaSuccess) return configured;
    int device = 0, sms = 0;
    if (cudaError_t e = cudaGetDevice(&device)) return e;
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) return e;
    const int items = kp.batch_heads * kp.m_blocks;
    const int grid = std::min(items, sms * C::ctas_per_sm);
    if constexpr (PDL) {
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(grid);
        config.blockDim = dim3(C::threads);
        config.dynamicSmemBytes = C::smem_bytes;
        config.stream = stream;
        config.attrs = attribute;
        config.numAttrs = 1;
        return cudaLaunchKernelEx(&config, kernel, kp);
    }
    kernel<<<grid, C::threads, C::smem_bytes, stream>>>(kp);
    return cudaGetLastError();
}

}  // namespace attention_hopper

// Why these inputs cannot run here (nullptr: they can). The bindings turn this into a Python error.
const char* attention_hopper_why_not(const AttentionForwardParams& a) {
    const AttentionShape& s = a.shape;
    if (s.head_dim != 64 && s.head_dim != 128) return "head_dim must be 64 or 128";
    if (s.seq_len < 1 || s.batch < 1 || s.heads < 1) return "batch, heads and seq_len must be >= 1";
    if (int64_t(s.batch) * s.heads > 0x7fffffff) return "batch * heads must be < 2^31";
    if ((s.seq_len + 63) / 64 > 65535) return "seq_len must be < 65535 * 64";
    if (int64_t(s.batch) * s.heads * ((s.seq_len + 63) / 64) > 0x7fffffff)
        return "batch * heads * ceil(seq_len / 64) must be < 2^31 (one work item per 64 query rows)";
    if (!(s.scale > 0.f) || !std::isfinite(s.scale)) return "scale must be a positive finite number";
    const AttentionTensor* ts[4] = {&a.q, &a.k, &a.v, &a.o};
    for (const AttentionTensor* t : ts) {
        if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return "q, k, v and o must be 16-byte aligned";
        int64_t st[3] = {t->stride_batch, t->stride_head, t->stride_seq};
        int64_t sz[3] = {s.batch, s.heads, s.seq_len};
        for (int i = 0; i < 3; ++i)
            if (sz[i] > 1 && (st[i] <= 0 || st[i] % 8 != 0))
                return "the batch, head and seq strides of q, k, v and o must be positive multiples of 8 elements";
    }
    return nullptr;
}

// The variants, numbered as in kernels/NOTES.md (attention / Hopper forward), where each one's
// H200 figures are; the numbers missing here were removed (see the opening comment). 0 = the
// default, the fastest one measured for the head dim.
//   2: one CTA per query block (forward_kernel), two consumers, ping-pong
//   4: one consumer, two CTAs per SM                    (head_dim 64; 128 runs variant 2)
//   5: the default of session 3 (4 for D = 64, 2 for D = 128) with L2 groups of heads (item_at)
//   8: persistent (one CTA per SM walks over query blocks, persistent_kernel) with one consumer
//      and two CTAs per SM (as 4), L2 groups (D = 64; 128 runs 11)
//  11: persistent, two consumers, ping-pong, L2 groups, the half tile (consumer 0's diagonal tile,
//      and a tail tile whose second half is all past the sequence, runs its softmax and P·V over
//      the first 64 keys only), lazy rescaling, dynamic scheduling (an atomic counter hands out
//      the items)
//  12: 11 without lazy rescaling
//  13: one consumer, two CTAs per SM (as 8) with the half tile, lazy rescaling and dynamic
//      scheduling (D = 64; 128 runs 11)
//  21: 12 (D = 64) / 11 (D = 128) with LEAN_EPILOGUE: O through shared memory and a TMA store,
//      items decoded by the producer, 1/l and log2(l) approximate (the default in session 6)
//  26: 21 with PDL (launched as a programmatic dependent of the kernel before it; see persistent_kernel)
//  30: 21 with SELF_RESET (the counter sets itself back to 0 after the launch's last ticket; the
//      bindings give it a counter that is zero and that no other launch uses meanwhile: see
//      attention_hopper_counter_resets). The default in session 7
//  33: 30 with LEAN_SOFTMAX (see persistent_kernel)
//  37: 30 with DOUBLE_P, LEAN_SOFTMAX and STALE_MAX (softmax_tile_stale_max; D = 128: 237 of the
//      240 registers, no spills). The default since session 8
// 2 and 4 take the query blocks in the first kernels' order (item_at with one group of all heads).
// work_counter: one uint32 in device memory, zero, used by this launch alone (the bindings zero one
// per call, or, where attention_hopper_counter_resets says the kernel sets it back to 0 itself,
// hand out one they own); the dynamically scheduled variants (11-13, 21, 26, 30, 33, 37 = the default)
// refuse nullptr.
int attention_hopper_forward_variant(const AttentionForwardParams& p, void* cuda_stream, int variant,
                                     unsigned int* work_counter) {
    using namespace attention_hopper;
    if (attention_hopper_why_not(p)) return cudaErrorInvalidValue;
    auto stream = static_cast<cudaStream_t>(cuda_stream);
    const bool d64 = p.shape.head_dim == 64;
    if (variant == 0) variant = d64 ? DEFAULT_VARIANT_D64 : DEFAULT_VARIANT_D128;
    switch (variant) {
    case 2: return d64 ? launch<64, 2>(p, stream, false) : launch<128, 2>(p, stream, false);
    case 4: return d64 ? launch<64, 1>(p, stream, false) : launch<128, 2>(p, stream, false);
    case 5: return d64 ? launch<64, 1>(p, stream, true) : launch<128, 2>(p, stream, true);
    case 8: return d64 ? launch_persistent<64, 1, false, false, false>(p, stream, work_counter)
                       : launch_persistent<128, 2, true, true, true>(p, stream, work_counter);
    case 11: return d64 ? launch_persistent<64, 2, true, true, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, true, true>(p, stream, work_counter);
    case 12: return d64 ? launch_persistent<64, 2, true, false, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, false, true>(p, stream, work_counter);
    case 13: return d64 ? launch_persistent<64, 1, true, true, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, true, true>(p, stream, work_counter);
    case 21: return d64 ? launch_persistent<64, 2, true, false, true, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, true, true, true>(p, stream, work_counter);
    case 26: return d64 ? launch_persistent<64, 2, true, false, true, true, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, true, true, true, true>(p, stream, work_counter);
    case 30: return d64 ? launch_persistent<64, 2, true, false, true, true, false, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, true, true, true, false, true>(p, stream, work_counter);
    case 33: return d64 ? launch_persistent<64, 2, true, false, true, true, false, true, false, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, true, true, true, false, true, false, true>(p, stream, work_counter);
    case 37: return d64 ? launch_persistent<64, 2, true, false, true, true, false, true, true, true, true>(p, stream, work_counter)
                        : launch_persistent<128, 2, true, true, true, true, false, true, true, true, true>(p, stream, work_counter);
    default: return cudaErrorInvalidValue;   // removed numbers (1, 3, 6, 7, 9, 10, 14-20, 22-25, 27-29, 31, 32, 34-36) too
    }
}

// Does `variant` (0: the default for p's head_dim) leave its work counter at 0 when it ends
// (SELF_RESET)? Then the caller may reuse one counter for launches that never run at the same time.
bool attention_hopper_counter_resets(const AttentionForwardParams& p, int variant) {
    if (variant == 0) variant = p.shape.head_dim == 64 ? attention_hopper::DEFAULT_VARIANT_D64
                                                       : attention_hopper::DEFAULT_VARIANT_D128;
    return variant == 30 || variant == 33 || variant == 37;
}

// The launcher E1's dispatch calls on sm_90 (see kernels/NOTES.md, attention / Hopper forward).
// Returns the CUDA error of the launch (cudaErrorInvalidValue for inputs attention_hopper_why_not
// refuses, or that the tensor-map encoder refuses).
int attention_hopper_forward(const AttentionForwardParams& p, void* cuda_stream, unsigned int* work_counter) {
    return attention_hopper_forward_variant(p, cuda_stream, 0, work_counter);
}

// Plain C entry points (for a ctypes harness that does not need torch headers).
extern "C" int tk_attention_hopper_forward(const AttentionForwardParams* p, void* stream, int variant,
                                           unsigned int* work_counter) {
    return attention_hopper_forward_variant(*p, stream, variant, work_counter);
}
extern "C" const char* tk_attention_hopper_why_not(const AttentionForwardParams* p) {
    return attention_hopper_why_not(*p);
}

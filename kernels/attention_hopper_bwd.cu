// kernels/attention_hopper_bwd.cu — causal flash attention, BACKWARD pass, for Hopper (sm_90a):
// dQ, dK, dV from q, k, v, o, dO and the forward's LSE. TMA loads into shared memory guarded by
// mbarriers, one producer warpgroup and two consumer warpgroups, wgmma for all five products.
// Read kernels/attention_portable.cu (the same arithmetic on mma.sync) and
// kernels/attention_hopper.cu (the forward: the same machinery) first.
// Read in order: the algorithm and the picture (this comment), config, block_at (the CTAs'
// order), the kernels (rowsum, or prep_kernel = zeroing + rowsum; main; dQ conversion) and the
// launcher at the bottom.
//
// ---- The algorithm ----------------------------------------------------------------------------
// Forward: S = Q·Kᵀ, P = softmax(scale·S) (causal), O = P·V, and LSE_i = ln Σ_j exp(scale·S_ij).
// Backward, given dO:
//   Di   = Σ_d dO_id·O_id                       (kernel 1, one fp32 per query row)
//   P    = exp(scale·S − LSE)                   (recomputed exactly from the saved LSE)
//   dV   = Pᵀ·dO        dP = dO·Vᵀ        dS = P∘(dP − Di)
//   dK   = scale·dSᵀ·Q  dQ = scale·dS·K
// Kernel 2 gives each CTA one block of 128 keys, a work item (K and V stay in shared memory for
// the whole item), and walks over the blocks of 64 queries that can see those keys (causal: from
// the diagonal down). (D = 64's default, 19, runs one CTA per SM that takes items one after
// another: PERSISTENT, config.) Each of the two consumer warpgroups owns 64 of the keys and works on
// TRANSPOSED tiles, Sᵀ = K·Qᵀ (rows = its keys, columns = the 64 queries), so that Pᵀ and dSᵀ
// sit in its registers exactly as the A operand of dV += Pᵀ·dO and dK += dSᵀ·Q wants them
// (the accumulator -> A-fragment identity, hopper-facts §4.3): dK and dV accumulate in
// registers over all query blocks and are written once at the end.
// dQ is the awkward one: every key block contributes to every query row. Each warpgroup stores
// its dS tile (bf16) to shared memory, transposed on the way by stmatrix.trans, and computes its
// partial dQ = dS·K (64 queries x D, fp32) with one more wgmma. The partial goes to shared memory
// and ONE thread adds it into an fp32 buffer in global memory with a bulk reduce-add
// (cp.reduce.async.bulk .add.f32: the addition happens in L2, no atomic instructions on the SM,
// and the copy runs while the warpgroup goes on to the next query block). Kernel 3 converts the
// buffer (times scale) to bf16 dQ in dQ's own strides (three slices of one packed gradient).
// The buffer's layout is ours to choose: each (head, query block) chunk is contiguous and ordered
// as the accumulator registers are ([register/4][thread][4] floats), so the shared-memory writes
// are conflict-free float4 stores and the bulk copy is one contiguous range. Kernel 3 undoes that
// order. Atomics from registers instead (DQ_ATOMIC, in D = 64's default since session 8; see
// DEFAULT_VARIANT_D64's race note): in that
// order each thread's 32 floats are 8 red.global.add.v4.f32 of 16 bytes, a warp's 32 of one
// register group 512 contiguous bytes, so the L2 sees whole lines; and the warpgroup skips the
// 16 KB shared-memory round trip, its fence and bar.sync, and the wait for the bulk copy's read:
// -23 us (-4.3%) of the GPT-2 backward (session 7). Session 3 had expected the opposite
// (4096 separate 4-byte atomics per partial against one bulk operation) without measuring.
//
// Masks and tails: Q and dO boxes past T read zeros (TMA), and those queries get LSE = +inf in
// shared memory, so their P is exp2(-inf) = 0 and they contribute nothing. Keys past T (zero
// rows of K) would give P = exp(-LSE) != 0: they are masked with the causal mask (key > query)
// by the same test; their dK, dV rows are not stored. Only query blocks that cross this
// warpgroup's diagonal (or the last key block, non-causal) test element by element.
//
// ---- The pipeline -------------------------------------------------------------------------------
// As pictured: variant 1. The defaults are its refinements: 19 (D = 64) = variant 2 (3 slots)
// with the dQ atomics, prep_kernel, DS_SYNC's bar.sync, a persistent grid and the mask's tests
// only in the blocks that need them (SPLIT_MASK), and 5 (D = 128) =
// variant 3 (dQ split by columns), both with the CTAs (items) in L2 groups of heads (block_at);
// the variants list below says what each changes.
// Warpgroup 0 = producer (24 registers/thread): warp 0's elected thread issues the TMA copies,
// warp 1's 32 lanes copy LSE·log2(e) and Di of the query block into shared memory.
// Warpgroups 1, 2 = consumers (240 registers/thread), warpgroup c owns keys 64c .. 64c+63.
// Shared memory: K, V (128 x D each, loaded once), STAGES slots of (Q, dO, lse, Di) for query
// blocks, per consumer one dS tile (64 x 64 bf16) and one dQ partial (64 x D fp32).
// mbarriers: kv_full (TMA, once; PERSISTENT: once an item, see below), full[s] (TMA bytes + 1 + 32 arrivals: TMA thread and warp 1),
// empty[s] (one arrival per consumer THREAD: 256, see release). Named barrier 1 + c: the 128
// threads of consumer c.
//
//   producer warp 0 (1 thread)      producer warp 1        consumer c, query block i (slot s)
//   --------------------------      ---------------        ----------------------------------
//   load K, V        -> kv_full                            wait kv_full (once)
//   for each block i:               for each block i:      wait full[s]
//     wait empty[s]                   wait empty[s]        issue Sᵀ = K_c·Qᵀ, dPᵀ = V_c·dOᵀ (2 groups)
//     load Q, dO     -> full[s]       lse, Di -> full[s]   wait<1>: Sᵀ done. P = exp2(S·c - lse), masks
//                                                          issue dV += Pᵀ·dO           (RS)
//                                                          wait<1>: dPᵀ done. dS = P∘(dP - Di)
//                                                          stmatrix.trans dS -> smem dS_c
//                                                          issue dK += dSᵀ·Q           (RS)
//                                                          bar.sync 1+c (dS_c complete)
//                                                          issue dQ_c = dS·K_c         (SS)
//                                                          wait<0>: all done -> arrive empty[s]
//                                                          thread 0: bulk reads of dQ_c done?
//                                                          bar.sync 1+c; dQ_c regs -> smem
//                                                          bar.sync 1+c; thread 0: reduce-add
//                                                             dQ_c smem -> dq_accum (async)
//                                                        end: dK·scale, dV -> global (bf16)
// The two consumers do not wait on each other; while one does its exponentials the other's
// wgmmas keep the tensor cores busy (no explicit ping-pong). Phases: query block i uses slot
// i % STAGES with parity (i / STAGES) & 1; the producer waits on empty with the opposite parity.
// PERSISTENT (16 and 19, the D = 64 default) runs the picture once per item in one CTA: two K/V sets
// (kv_full[set], and kv_empty[set] for the consumers and warp 1 to hand a set back), item k in set
// k % 2, the next item's index fetched and its K, V loaded while the current one runs, and the slot
// counter running on across items (block i of an item is the CTA's block g0 + i).
//
// ---- Variants (attention_hopper_backward_variant at the bottom; figures in kernels/NOTES.md) ----
//   1  as pictured: 2 slots, one dQ buffer per consumer (thread 0 waits until the previous
//      reduce-add has read it, then two bar.syncs around the write). D = 128 runs it with dQ
//      issued only after dV and dK finished (register budget: see ds_dk_dq).
//   2  (D = 64) 3 slots, two dQ buffers per consumer (one bar.sync, and the wait is
//      for the copy before last), and consumer 1 skips the first query block, which lies
//      entirely left of its keys (causal).
// Tried and dropped, because ptxas then serializes every wgmma: issuing block i+1's Sᵀ, dPᵀ
// before waiting for block i's products (wgmmas in flight across the loop's back edge, C7514),
// and writing block i-1's dQ registers while block i's Sᵀ, dPᵀ run (C7517/C7518). Also
// dropped: three consumers (192 keys per CTA, 512 threads, 160 registers each): the live
// accumulators did not fit, ptxas spilled and serialized (C7512).
//   3  (D = 128 only; D = 64 runs its default) variant 1 with dQ split by columns instead of
//      by keys: both consumers' dS tiles (64 queries x 128 keys, double-buffered) are read by
//      both, and consumer c computes dQ[:, 64c .. 64c+63] over all 128 keys (8 k-steps). Half
//      the bulk reduce-add traffic (each column half is added once per key block, not twice),
//      32 dQ accumulators instead of 64 (so dQ need not wait for dV and dK), at the price of a
//      bar.sync of both consumers per query block (id 3) instead of one per consumer.
//   4  (D = 64, the default until session 8) 2 (D = 128: 1) with the CTAs in L2 groups of heads
//   5  (D = 128, default) 3 with the CTAs in L2 groups of heads (D = 64 runs 4)
//   Session 7, opt-in, D = 64 (figures in kernels/NOTES.md, session 7, B). Pieces (OPT bits):
//   DQ_ATOMIC   the dQ partials added from registers by red.global.add.v4.f32 (no dQ tile in
//               shared memory, no bar.sync, no bulk copy; the chunk order in dq_accum is kept)
//   ONE_CONSUMER  one consumer (64 keys) per CTA, 256 threads, two CTAs per SM: one CTA's start
//               and end run under the other's work (each CTA loads its own Q and dO)
//   PREP        kernel 1' (prep_kernel) zeroes dq_accum and computes Di in one pass, one block
//               per (head, query block), in place of the memset and kernel 1
//   Variants: 8 = 4 + DQ_ATOMIC; 9 = ONE_CONSUMER + DQ_ATOMIC; 10 = ONE_CONSUMER; 11-14 = 4, 8, 9,
//   10 + PREP; 12 was D = 64's default for part of session 7 (taken back: the race note at
//   DEFAULT_VARIANT_D64); 15 = 12 + DS_SYNC (D = 64's default in session 8); 16 = 15 +
//   PERSISTENT (D = 64's default in session 9: one CTA per SM takes items from a counter, the
//   next item's K/V loaded under the current one; config's comment on the bit; 4.2% faster than 15
//   in its one run); 17 removed (LATE_DQ, lost); 19 = 16 + SPLIT_MASK (session 9; D = 64's default
//   since session 10: P's mask tests only in the diagonal and tail blocks); 18 (15 + SPLIT_MASK)
//   removed in session 10 (521.7 us against 16's 507.6 and 19's 501.4).
//   D = 128 runs 5 for 8-10 and 5 + PREP for 11-16, 19 (no registers to spare).
//   Tried in session 7 and removed (code at commit b31b295; figures in kernels/NOTES.md):
//   6/7  Di computed inside the main kernel by producer warps 2-3 (cp.async of O and dO; 32
//        producer registers, consumers 232): GPT-2 backward 843 us against 548, the Di warps
//        could not keep ahead of the consumers.
//   15-18 (numbers reused since) no kernel 3: each CTA counted itself in its head's counter
//        after a fence, and the head's last CTA converted the head's dq_accum from L2 (+33 us on 12 at GPT-2: the
//        conversions and the per-CTA fence sit in CTA tails with one CTA per SM).
//   19-23  no zeroing pass: the head's first CTA (a ticket) zeroed its chunks in L2 from producer
//        warp 2 and raised a flag the consumers waited for before their first dQ addition
//        (+24 us on 12 at GPT-2, -1.7 us at shakespeare).
//   Tried in session 10 and removed (code at commit c2487fe; kernels/NOTES.md, session 10, B):
//   20-24  no kernel 3 again, finer: a counter per quarter of a dq_accum chunk (the 16 rows one
//        warp's atomics add), each warp counting itself (atom.release.gpu) a block or an item after
//        its atomics and the last one converting the quarter from L2; 22-24 also left the
//        accumulator zero for the next call (no zeroing in prep_kernel). GPT-2 B = 32: 624-795 us
//        against 19's 492: every GPU-scope fence in a consumer's chain waited ~1 us (a block's
//        worth) for the warp's queued red.global.add ops.
#include <algorithm>
#include <type_traits>   // std::true_type: SPLIT_MASK's two copies of one loop
#include <cstdint>
#include <cmath>
#include <string>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "tk/ops/group/sync.cuh"
#include "tk/ops/group/wgmma.cuh"
#include "tk/ops/group/tma_4d.cuh"
#include "tk/ops/group/tma.cuh"            // bulk async-group commit and waits
#include "tk/sm80_instructions.cuh"        // exp2_approx, pack_bf16x2
#include "attention_params.h"
#include "attention_l2_groups.cuh"      // block_at's order and the host's group size

namespace attention_hopper_bwd {

// ---- Configuration ---------------------------------------------------------------------------
// OPT (session 7): bits that select the pieces below; the variants list at the bottom combines
// them. Bit DQ_ATOMIC adds the dQ partials from registers with vector atomics
// (red.global.add.v4.f32) instead of shared memory + one bulk reduce-add.
// Bit ONE_CONSUMER (variants 9, 10): one consumer warpgroup of 64 keys per CTA (256 threads, 232
// registers each) and two CTAs per SM, so that one CTA's start (K, V, the first Q, dO) and end
// (dK, dV stores, the last dQ adds) run while the other computes: 2x the CTAs, each loading its
// own Q and dO (2x those L2 -> SM bytes).
// Bit PREP (variants 11-14): kernel 1' (prep_kernel) zeroes dq_accum AND computes Di in one pass,
// one block per (head, query block) chunk, instead of the memset and kernel 1.
// Bit DS_SYNC (variant 15, lead, after session 7's last GPU call; D = 64's default since session 8): with
// DQ_ATOMIC, a bar.sync of the consumer warpgroup after its dQ atomics, so that no warp stores the
// next block's dS into the consumer's one dS tile while another warp's dQ wgmma may still read it
// (the race noted at DEFAULT_VARIANT_D64). Variant 4 gets the same order from its bulk path's
// bar.syncs.
// Bit PERSISTENT (variant 16, session 9; D = 64's default since session 9): one CTA per SM walks over the work items (key
// blocks) instead of one CTA per item, with two K/V buffers: while the consumers finish item k, the
// producer has already fetched item k+1 (one atomicAdd on a counter that prep_kernel zeroed) and
// loaded its K and V and first (Q, dO) slots, so an item's start (K/V from DRAM, the first slot, the
// CTA's launch, barrier set-up, setmaxnreg) and its end (the last products, the dK/dV stores) no
// longer leave the SM idle. The slots' phases run on across items. Needs PREP (the zeroing).
// Session 9, H200: 16 = 15 + PERSISTENT measured 507.6 us against 15's 529.6 (GPT-2 B = 32, the
// backward alone; cuDNN 534.3) and 86.9 against 90.9 at shakespeare (kernels/NOTES.md, session 9, B).
// (Bit 64 was LATE_DQ, session 9's variant 17: a block's dQ atomics and DS_SYNC's bar.sync issued
// after the next block's Sᵀ, dPᵀ: 535.0 us, +27 on 16; the reds, issued between the dPᵀ wgmmas,
// stalled their issue (MIO throttle). Removed; code at commit 882ef32.)
// Bit SPLIT_MASK (variant 19, session 9; D = 64's default since session 10): P's causal/tail mask as
// its own copy of the exponentials' loop behind a branch taken by the diagonal (and tail) blocks
// only; 15's one loop tests the mask flag per element, and ptxas predicates those tests into every
// block (91 ISETP, 32 FSEL of the 237 instructions between the Sᵀ wait and the dV issue).
// Session 10 (s10call1, H200, the whole backward in graph replays, GPT-2 B = 32, 11 interleaved
// rounds): 19 501.4 us, 16 507.6, 15 528.4, 18 (= 15 + SPLIT_MASK, since removed) 521.7, cuDNN 532.1;
// shakespeare 19 85.1, 16 85.9, cuDNN 91.4. s10call2 (9 rounds): 19 491.6, 16 500.2, cuDNN 522.4;
// shakespeare 19 84.6, 16 85.7, cuDNN 91.5.
constexpr int DQ_ATOMIC = 2, ONE_CONSUMER = 4, PREP = 8, DS_SYNC = 16, PERSISTENT = 32, SPLIT_MASK = 128;

template <int D, bool PIPELINED = false, bool SPLIT_DQ = false, int OPT = 0>
struct config {
    static_assert(D == 64 || D == 128, "head_dim 64 or 128");
    static constexpr bool dq_atomic = (OPT & DQ_ATOMIC) != 0;
    static constexpr bool ds_sync = (OPT & DS_SYNC) != 0;
    static constexpr bool split_mask = (OPT & SPLIT_MASK) != 0;
    static_assert(!ds_sync || dq_atomic, "DS_SYNC orders the dS reuse of the atomics path only");
    static_assert(!SPLIT_DQ || (D == 128 && !PIPELINED), "variant 3 is D = 128's (its halves are whole 64-column blocks)");
    static constexpr bool one_consumer = (OPT & ONE_CONSUMER) != 0;
    static constexpr int consumers = one_consumer ? 1 : 2;
    static constexpr int ctas_per_sm = one_consumer ? 2 : 1;
    static constexpr int block_n = 64 * consumers;      // keys per CTA (64 per consumer)
    static constexpr int block_m = 64;                  // queries per step
    static constexpr int threads = 128 * (consumers + 1);
    static constexpr int stages = PIPELINED ? 3 : 2;    // slots of (Q, dO, lse, Di)
    static constexpr int col_blocks = D / 64;           // 128-byte (64-element) column blocks
    static constexpr int kv_bytes = block_n * D * 2;    // one K or V tile
    static constexpr int q_bytes = block_m * D * 2;     // one Q or dO tile
    static constexpr int ds_bytes = block_m * 64 * 2;   // one consumer's dS (64 queries x 64 keys)
    static constexpr int dq_bytes = block_m * (SPLIT_DQ ? D / 2 : D) * 4;   // one consumer's fp32 dQ partial
    static constexpr int dq_buffers = PIPELINED ? 2 : 1;
    static constexpr bool persistent = (OPT & PERSISTENT) != 0;
    static constexpr int kv_sets = persistent ? 2 : 1;   // K/V buffers (persistent: item k+1's beside item k's)
    // offsets from the 1024-aligned base; every tile 1024-aligned (128B swizzle); K/V set j at j·2·kv_bytes
    static constexpr int k_off = 0, v_off = kv_bytes, q_off = kv_sets * 2 * kv_bytes;
    static constexpr int do_off = q_off + stages * q_bytes;
    static constexpr int ds_off = do_off + stages * q_bytes;
    static constexpr int dq_off = ds_off + (SPLIT_DQ ? 2 : 1) * consumers * ds_bytes;
    static constexpr int vec_off = dq_off + (dq_atomic ? 0 : consumers * dq_buffers * dq_bytes);   // lse2[stages][64], di[stages][64]
    static constexpr int smem_bytes = vec_off + 2 * stages * block_m * 4 + 1024;   // + alignment slack
    // setmaxnreg moves registers to the consumers: 128·(24 + 2·240) = 64512 (ptxas reports the
    // entry cap of __launch_bounds__(384, 1), 168, as the kernel's count).
    // ONE_CONSUMER: 2 CTAs x 256 threads, entry cap 128; 128·(24 + 232) = 32768 = half the SM.
    static constexpr int producer_regs = 24, consumer_regs = one_consumer ? 232 : 240;
    static constexpr bool prep = (OPT & PREP) != 0;
    static_assert(!persistent || (prep && dq_atomic && PIPELINED && !one_consumer),
                  "PERSISTENT: variant 15's kernel (prep_kernel zeroes its counter; no bulk dQ copies to wait for)");
    // D = 128 (variant 1): dQ is issued only after dV and dK finished (frees P's and dS's A
    // operands; with all of them live ptxas ran out of registers and serialized: C7512).
    static constexpr bool dq_after_dk = D == 128 && !SPLIT_DQ;
    // Variant 3: each consumer computes half of dQ's columns over both consumers' keys.
    static constexpr int dq_cols = SPLIT_DQ ? D / 2 : D;
    static constexpr int ds_buffers = SPLIT_DQ ? 2 : 1;
    static_assert(!PIPELINED || D == 64, "the pipelined variant keeps two more accumulators live: D = 64 only");
    static_assert(128 * (producer_regs + consumers * consumer_regs) <= 65536 / ctas_per_sm, "register budget");
    static_assert(smem_bytes <= (one_consumer ? 113 : 227) * 1024, "shared memory");
};

struct kernel_params {
    CUtensorMap q_map, k_map, v_map, do_map;            // 4-D maps {dim, seq, heads, batch}
    __nv_bfloat16 *dk, *dv;
    int64_t dk_stride_batch, dk_stride_head, dk_stride_seq;
    int64_t dv_stride_batch, dv_stride_head, dv_stride_seq;
    const float* lse;                                   // (B, H, T), natural log
    const float* d_rowsum;                              // (B, H, T), Di
    float* dq_accum;                                    // (B·H, query blocks, 64·D) fp32, zeroed
    int heads, seq_len, q_blocks;
    float scale, scale_log2;
    int causal;
    int batch_heads, n_blocks, heads_per_group;         // the CTA order: see block_at
    int* work_counter;                                  // PERSISTENT: items handed out past the grid (zeroed by prep_kernel)
    int total_items;                                    // batch_heads · n_blocks
};

// Which (batch, head, key block) CTA i takes. Every key block of a head reads that head's Q, dO,
// lse, Di and adds into its dQ accumulator, so they should run close together in time and find
// those in L2: heads go in groups of heads_per_group (the launcher sizes a group to a third of
// the L2), and inside a group the heaviest key blocks (the first: causal, they see every query
// block) first, every head of the group for one key block before the next. heads_per_group =
// batch·heads is the order of session 3 (every head's first block, then every head's second, ...).
struct block_item { int b, h, n_block; };
__device__ inline block_item block_at(int i, const kernel_params& p) {
    const attention_l2::slot s = attention_l2::slot_at(i, p.heads_per_group, p.n_blocks, p.batch_heads);
    return block_item{s.bh / p.heads, s.bh % p.heads, s.rank};   // the first key block is rank 0
}

constexpr float LOG2E = 1.4426950408889634f;
// The defaults (attention_hopper_backward_variant at the bottom). Session 4 (kernels/NOTES.md, H3)
// chose 4 (D = 64) / 5 (D = 128): GPT-2 fwd+bwd 0.402 ms (0.458 with 2) and (4, 16, 4096, 128)
// 2.061 ms (2.661 with 1); cuDNN 0.509 / 2.311. Session 7 (B), the backward alone in graph replays
// interleaved with the old default and cuDNN's, GPT-2 at the training step's B = 32: D = 64 takes
// 12 (4 + dQ by vector atomics + prep_kernel): 520.8 us vs 547.5 (cuDNN 523.8), shakespeare 89.5
// vs 91.5 (cuDNN 91.4) in call 3; 522.7 vs 547.8 and 89.8 vs 91.6 in call 2. D = 128 keeps 5: with
// prep_kernel it measured 1.0% faster in call 2 and 2.0% slower in call 3 (noise of +-10%).
// BUT (review, after session 7's last GPU call): with DQ_ATOMIC a warp can overwrite its key
// columns of the one dS tile for block i+1 while another warp's dQ wgmma of block i may still read
// them (the bar.sync that ordered this in 4 went with the shared-memory dQ path; wait_group covers
// only the executing warp's wgmmas): a write-after-read race the PTX model allows, never seen in the
// tests. So D = 64's default is 4 again, the kernel of sessions 4-6, until a fixed 12 (two dS tiles
// alternating by block, or a bar.sync after red_dq: variant 15) has been timed and tested on the H200.
// Session 8 (first H200 run of 15: tests, memcheck and racecheck clean): D = 64 takes 15, the race
// closed at no measurable cost: GPT-2 B = 32 522.8 us vs 547.1 for 4 and 522.0 for 12 (cuDNN
// 528.0); shakespeare 90.2 vs 92.5 (cuDNN 92.0); interleaved graph replays, one run.
// Session 9 (B): D = 64 takes 16 (15 on a persistent grid): the whole backward (prep, main kernel, dQ
// conversion) 507.6 us vs 529.6 for 15 at GPT-2 B = 32 (cuDNN 534.3), 86.9 vs 90.9 at shakespeare
// (cuDNN 92.8); racecheck and memcheck clean with more items than SMs; its tests (float64
// reference, dK/dV bitwise equal to 15's, graph replays) passed.
// Session 10 (B): D = 64 takes 19 (16 + SPLIT_MASK): 501.4 us vs 16's 507.6 at GPT-2 B = 32 (cuDNN
// 532.1) and 85.1 vs 85.9 at shakespeare (cuDNN 91.4) in s10call1; 491.6 vs 500.2 (cuDNN 522.4) and
// 84.6 vs 85.7 (cuDNN 91.5) in s10call2, where the whole test_attention_hopper_bwd.py passed with 19
// as the default (46 tests), the persistent tests too, racecheck and memcheck clean.
constexpr int DEFAULT_VARIANT_D64 = 19;
constexpr int DEFAULT_VARIANT_D128 = 5;

using tk::sm80::exp2_approx;   // ex2.approx.ftz
using tk::sm80::pack_bf16x2;   // lo -> low 16 bits (lower address)

// The f32 accumulator of a 64 x 64 wgmma as four bf16 A operands (k-chunks of 16 columns),
// without any shuffle (hopper-facts §4.3).
__device__ inline void to_a_operand(uint32_t (&a)[4][4], const float (&d)[32]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) a[j][q] = pack_bf16x2(d[8 * j + 2 * q], d[8 * j + 2 * q + 1]);
}
// Keep registers that an in-flight wgmma reads (A fragments) live and in place.
// A mask switch that is either a run-time bool or a compile-time std::bool_constant (softmax_and_dv's
// exponentials: the latter lets the compiler drop the tests from blocks that need none).
__device__ inline bool is_on(bool b) { return b; }
template <bool B>
__device__ constexpr bool is_on(std::bool_constant<B>) { return B; }

__device__ inline void keep_alive(uint32_t (&a)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(a[j][q]) :: "memory");
}

// stmatrix.trans: four 8x8 bf16 matrices from registers, each stored transposed. Lane l gives
// the address of stored row l % 8 of matrix l / 8 (16 bytes). (tk/ops/warp/memory_shared.cuh's
// copy is declared for the device pass only, so a __global__ template cannot name it.)
__device__ inline void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#ifdef TK_HOPPER
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
#endif
}

// Bulk reduce-add of `bytes` (multiple of 16) fp32 from shared to global memory, as one
// bulk async-group of this thread (tk/ops/group/tma.cuh has the tensor-map form, not this 1-D
// one; its store_wait_read / store_wait wait for these groups).
__device__ inline void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
#ifdef TK_HOPPER
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
#endif
    tk::tma::store_commit_group();
}

// One vector atomic add of four floats in L2 (sm_90: red.global.add.v4.f32; no return value).
__device__ inline void red_add_v4(float4* dst, float a, float b, float c, float d) {
#ifdef TK_HOPPER
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
#endif
}

// ---- Kernel 1: Di = rowsum(dO ∘ O), fp32, D/8 threads per row (16-byte loads) -------------------
template <int D>
__global__ void __launch_bounds__(256) rowsum_kernel(const AttentionBackwardParams p) {
    constexpr int LANES = D / 8;                        // threads per row: 8 or 16
    const int T = p.shape.seq_len, H = p.shape.heads;
    const int64_t row = int64_t(blockIdx.x) * (256 / LANES) + threadIdx.x / LANES;   // (b·H + h)·T + t
    const int part = threadIdx.x % LANES;
    float sum = 0.f;
    if (row < int64_t(p.shape.batch) * H * T) {
        const int t = int(row % T);
        const int64_t bh = row / T;
        const int b = int(bh / H), h = int(bh % H);
        const auto* o = static_cast<const __nv_bfloat16*>(p.o.data) + b * p.o.stride_batch + h * p.o.stride_head +
                        t * p.o.stride_seq + part * 8;
        const auto* g = static_cast<const __nv_bfloat16*>(p.d_o.data) + b * p.d_o.stride_batch +
                        h * p.d_o.stride_head + t * p.d_o.stride_seq + part * 8;
        uint4 ov = *reinterpret_cast<const uint4*>(o), gv = *reinterpret_cast<const uint4*>(g);
        const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
        const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float2 a = __bfloat1622float2(o2[i]), c = __bfloat1622float2(g2[i]);
            sum = fmaf(a.x, c.x, fmaf(a.y, c.y, sum));
        }
    }
#pragma unroll
    for (int w = LANES / 2; w > 0; w /= 2) sum += __shfl_xor_sync(0xffffffff, sum, w);
    if (part == 0 && row < int64_t(p.shape.batch) * H * T) p.d_rowsum[row] = sum;
}

// ---- Kernel 1' (PREP): zero one dq_accum chunk and compute the Di of its 64 query rows ----------
// One block per (head, query block): blockIdx.x is the chunk's index in dq_accum, so no 64-bit
// divisions per thread (kernel 1 divides its row index by T and H in every thread). Each thread
// zeroes its float4s of the chunk and loads all its 16-byte pieces of O and dO (PASSES rows of
// the block) before summing, so the loads are in flight together.
// ZERO_COUNTER (PERSISTENT): block 0 also zeroes the work counter, the int just past the chunks.
template <int D, bool ZERO_COUNTER = false>
__global__ void __launch_bounds__(256) prep_kernel(const AttentionBackwardParams p, int q_blocks) {
    constexpr int LANES = D / 8, ROWS = 256 / LANES, PASSES = 64 / ROWS;   // D = 64: 8, 32, 2
    const int T = p.shape.seq_len, H = p.shape.heads;
    const int bh = int(blockIdx.x / q_blocks), m = int(blockIdx.x % q_blocks), b = bh / H, h = bh % H;
    float4* chunk = reinterpret_cast<float4*>(p.dq_accum) + int64_t(blockIdx.x) * (64 * D / 4);
#pragma unroll
    for (int f = threadIdx.x; f < 64 * D / 4; f += 256) chunk[f] = make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (ZERO_COUNTER)
        if (blockIdx.x == 0 && threadIdx.x == 0) *reinterpret_cast<int*>(p.dq_accum + int64_t(gridDim.x) * (64 * D)) = 0;
    const int part = threadIdx.x % LANES, r0 = threadIdx.x / LANES;
    const auto* o = static_cast<const __nv_bfloat16*>(p.o.data) + b * p.o.stride_batch + h * p.o.stride_head + part * 8;
    const auto* g = static_cast<const __nv_bfloat16*>(p.d_o.data) + b * p.d_o.stride_batch + h * p.d_o.stride_head +
                    part * 8;
    uint4 ov[PASSES], gv[PASSES];
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
        const int t = m * 64 + k * ROWS + r0;
        ov[k] = gv[k] = make_uint4(0, 0, 0, 0);
        if (t < T) {
            ov[k] = *reinterpret_cast<const uint4*>(o + int64_t(t) * p.o.stride_seq);
            gv[k] = *reinterpret_cast<const uint4*>(g + int64_t(t) * p.d_o.stride_seq);
        }
    }
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
        const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov[k]);
        const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 a = __bfloat1622float2(o2[i]), c = __bfloat1622float2(g2[i]);
            sum = fmaf(a.x, c.x, fmaf(a.y, c.y, sum));
        }
#pragma unroll
        for (int w = LANES / 2; w > 0; w /= 2) sum += __shfl_xor_sync(0xffffffff, sum, w);
        const int t = m * 64 + k * ROWS + r0;
        if (part == 0 && t < T) p.d_rowsum[int64_t(bh) * T + t] = sum;
    }
}

// ---- Kernel 2: dK, dV and the dQ partials -------------------------------------------------------
template <int D, bool PIPELINED, bool SPLIT_DQ, int OPT>
__global__ void __launch_bounds__(config<D, PIPELINED, SPLIT_DQ, OPT>::threads, config<D, PIPELINED, SPLIT_DQ, OPT>::ctas_per_sm)
backward_kernel(const __grid_constant__ kernel_params p) {
    using C = config<D, PIPELINED, SPLIT_DQ, OPT>;
    using namespace tk;
    constexpr int BN = C::block_n, BM = C::block_m, S = C::stages;

    extern __shared__ uint8_t smem_raw[];
    __shared__ mbarrier kv_full[C::kv_sets], full[S], empty[S];
    __shared__ mbarrier kv_empty[C::kv_sets];           // PERSISTENT: K/V set j free again
    __shared__ int item_s[C::kv_sets];                  // PERSISTENT: the item in K/V set j (-1: no more)
    const uint32_t smem = (smem_addr(smem_raw) + 1023) & ~1023u;
    uint8_t* smem_ptr = smem_raw + (smem - smem_addr(smem_raw));   // the same, as a pointer
    uint32_t k_tile = smem + C::k_off, v_tile = smem + C::v_off;   // PERSISTENT: set k % 2 of item k
    auto q_tile = [&](int s) { return smem + C::q_off + s * C::q_bytes; };
    auto do_tile = [&](int s) { return smem + C::do_off + s * C::q_bytes; };
    float* lse2_s = reinterpret_cast<float*>(smem_ptr + C::vec_off);   // [S][BM]: lse·log2(e)
    float* di_s = lse2_s + S * BM;                                       // [S][BM]

    // The work item (b, h, key block) and the query blocks it walks: the CTA's own (blockIdx.x), or
    // with PERSISTENT each item the CTA takes in turn.
    int b, h, bh, kv0, m_begin, n_iter;
    auto set_item = [&](int index) {
        const block_item item = block_at(index, p);     // heaviest (earliest keys) first
        b = item.b, h = item.h, bh = b * p.heads + h;
        kv0 = item.n_block * BN;
        m_begin = p.causal ? kv0 / BM : 0;              // first query block that sees these keys
        n_iter = p.q_blocks - m_begin;
    };
    set_item(blockIdx.x);
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int j = 0; j < C::kv_sets; ++j) {
            mbar::init(kv_full[j], 1);
            if (C::persistent) mbar::init(kv_empty[j], C::consumers * 128 + 32);   // consumers + warp 1
        }
        for (int s = 0; s < S; ++s) {
            mbar::init(full[s], 1 + 32);                // TMA thread + the 32 lanes of warp 1
            mbar::init(empty[s], C::consumers * 128);   // every consumer thread (see release)
        }
        mbar::fence_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        // ================= producer =================
        warpgroup_decrease_registers<C::producer_regs>();
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        if (warp == 0 && elect_one()) {
            auto load = [&](uint32_t dst, const CUtensorMap* map, int rows, int row, mbarrier& bar) {
#pragma unroll
                for (int cb = 0; cb < C::col_blocks; ++cb)
                    tma::load_box_4d(dst + cb * rows * 128, map, cb * 64, row, h, b, bar);
            };
            // slot s = (running query block count) % S and its phase bit, kept as counters (24
            // registers here: no divisions); they run on across a persistent CTA's items
            int s = 0, phase = 0;
            auto load_item = [&](mbarrier& kv_bar, uint32_t kt) {   // K, V into set kt; Q, dO into slots
                mbar::arrive_expect_bytes(kv_bar, 2 * C::kv_bytes);
                load(kt, &p.k_map, BN, kv0, kv_bar);
                load(kt + C::kv_bytes, &p.v_map, BN, kv0, kv_bar);
                // PERSISTENT: not unrolled (unrolled, 24 registers spilled 40 bytes); 4 is what
                // ptxas chose for the others
#pragma unroll (C::persistent ? 1 : 4)
                for (int i = 0; i < n_iter; ++i) {
                    const int m0 = (m_begin + i) * BM;
                    mbar::wait(empty[s], phase ^ 1);
                    mbar::arrive_expect_bytes(full[s], 2 * C::q_bytes);
                    load(q_tile(s), &p.q_map, BM, m0, full[s]);
                    load(do_tile(s), &p.do_map, BM, m0, full[s]);
                    if (++s == S) { s = 0; phase ^= 1; }
                }
            };
            if constexpr (!C::persistent) {
                load_item(kv_full[0], k_tile);
            } else {
                // Item k goes to K/V set k % 2 once the consumers freed it (item k - 2 done). Its
                // index is fetched here, as soon as item k-1's last Q/dO load is issued: the first
                // is blockIdx.x, the next ones gridDim.x + a counter (zeroed by prep_kernel). The
                // index goes to item_s[set] before kv_full's arrival (release), which every other
                // role waits on (acquire) before reading it; -1 tells them to stop. kv_empty[set]
                // completes when every consumer thread is done with the item and warp 1 has read
                // item_s[set].
                for (int k = 0, index = int(blockIdx.x); ; ++k) {
                    const int kb = k & 1;
                    mbar::wait(kv_empty[kb], ((k >> 1) & 1) ^ 1);
                    if (k > 0) index = int(gridDim.x) + atomicAdd(p.work_counter, 1);
                    if (index >= p.total_items) {
                        item_s[kb] = -1;
                        mbar::arrive(kv_full[kb]);
                        break;
                    }
                    item_s[kb] = index;
                    set_item(index);
                    load_item(kv_full[kb], smem + kb * 2 * C::kv_bytes);
                }
            }
        } else if (warp == 1) {
            int s = 0, phase = 0;
            auto fill_item = [&]() {
                const float* lse = p.lse + int64_t(bh) * p.seq_len;
                const float* di = p.d_rowsum + int64_t(bh) * p.seq_len;
                auto fill_block = [&](int i) {
                    const int m0 = (m_begin + i) * BM;
                    mbar::wait(empty[s], phase ^ 1);
#pragma unroll
                    for (int r = lane; r < BM; r += 32) {
                        const int q = m0 + r;
                        // a query past T: lse = +inf makes its P exactly 0
                        lse2_s[s * BM + r] = q < p.seq_len ? lse[q] * LOG2E : INFINITY;
                        di_s[s * BM + r] = q < p.seq_len ? di[q] : 0.f;
                    }
                    mbar::arrive(full[s]);                  // release: the writes above are visible
                    if (++s == S) { s = 0; phase ^= 1; }
                };
                if constexpr (C::persistent && C::split_mask) {
                    // 19: not unrolled (unrolled as ptxas chose, this warp spilled 4 bytes)
#pragma unroll 1
                    for (int i = 0; i < n_iter; ++i) fill_block(i);
                } else {
                    for (int i = 0; i < n_iter; ++i) fill_block(i);
                }
            };
            if constexpr (!C::persistent) {
                fill_item();
            } else {
                for (int k = 0; ; ++k) {                 // the items in the producer's order
                    const int kb = k & 1;
                    mbar::wait(kv_full[kb], (k >> 1) & 1);
                    const int index = item_s[kb];
                    if (index < 0) break;
                    mbar::arrive(kv_empty[kb]);          // item_s[kb] read: the producer may reuse it
                    set_item(index);
                    fill_item();
                }
            }
        }
        return;
    }

    // ================= consumers =================
    warpgroup_increase_registers<C::consumer_regs>();
    const int c = warpgroup - 1;                         // keys kv0 + 64c .. + 63
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t = lane % 4;
    int key0, first_key, last_key;                       // this thread's keys: key0, key0 + 8
    auto set_keys = [&]() {
        first_key = kv0 + 64 * c, last_key = first_key + 63;
        key0 = first_key + 16 * warp + lane / 4;
    };
    set_keys();
    // Query block i of the item uses slot (g0 + i) % S with phase ((g0 + i) / S) & 1; g0 counts the
    // query blocks of a persistent CTA's earlier items (0 otherwise).
    int g0 = 0;
    auto slot_of = [&](int i) { return (g0 + i) % S; };
    auto phase_of = [&](int i) { return ((g0 + i) / S) & 1; };
    // dS tiles: [buffer][consumer], 64 x 64 each; the two of one buffer side by side form one
    // 64 x 128 K-major tile (two 128-byte column blocks), which variant 3's dQ reads whole.
    auto ds_pair = [&](int i) { return smem + C::ds_off + (SPLIT_DQ ? i % 2 : 0) * C::consumers * C::ds_bytes; };
    const uint32_t dq_tile = smem + C::dq_off + c * C::dq_buffers * C::dq_bytes;
    float4* dq_smem = reinterpret_cast<float4*>(smem_ptr + C::dq_off + c * C::dq_buffers * C::dq_bytes);

    wgmma::accumulator<64> s_acc, dp_acc;                // Sᵀ -> P, dPᵀ -> dS (64 keys x 64 queries)
    wgmma::accumulator<D> dv_acc, dk_acc;                // 64 keys x D
    wgmma::accumulator<C::dq_cols> dq_acc;               // 64 queries x D (variant 3: D/2 columns)
    uint32_t p_frag[4][4], ds_frag[4][4];                // bf16 A operands of dV and dK

    // ---- the steps of one query block i (slot s = i % S); both variants below call them ----
    auto issue_s_dp = [&](int i) {                       // Sᵀ = K_c·Qᵀ, dPᵀ = V_c·dOᵀ: two groups
        const int s = slot_of(i);
        mbar::wait(full[s], phase_of(i));
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < D / 16; ++k)
            wgmma::mma_ss<wgmma::major::K, wgmma::major::K>(
                s_acc, wgmma::desc<wgmma::major::K, BN, 128>(k_tile, 64 * c, k),
                wgmma::desc<wgmma::major::K, BM, 128>(q_tile(s), 0, k), k > 0);
        wgmma::commit_group();
#pragma unroll
        for (int k = 0; k < D / 16; ++k)
            wgmma::mma_ss<wgmma::major::K, wgmma::major::K>(
                dp_acc, wgmma::desc<wgmma::major::K, BN, 128>(v_tile, 64 * c, k),
                wgmma::desc<wgmma::major::K, BM, 128>(do_tile(s), 0, k), k > 0);
        wgmma::commit_group();
    };
    // After Sᵀ is done: P = exp2(S·scale·log2e − lse·log2e), masked; issue dV += Pᵀ·dO.
    // Thread holds keys key0 (+8) x queries m0 + 8j + 2t (+1).
    auto softmax_and_dv = [&](int i, bool accumulate) {
        const int s = slot_of(i), m0 = (m_begin + i) * BM;
        wgmma::fence_operand(s_acc);
        const float* lse2 = lse2_s + s * BM;
        const bool mask = p.causal ? (last_key > m0) : (last_key >= p.seq_len);
        // The exponentials, with the mask's tests where `masked` says: a run-time bool (15, 16: ptxas
        // predicates the tests into every block) or, with SPLIT_MASK (19), a compile-time
        // true/false behind one branch (~130 of 15's ~545 instructions a block are the mask's
        // ISETP/FSEL/VIADD, on blocks that need none).
        auto exps = [&](auto masked) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float2 l2 = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * t);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i_acc = 4 * j + e;
                    float x = exp2_approx(fmaf(s_acc.d[i_acc], p.scale_log2, -((e & 1) ? l2.y : l2.x)));
                    if (is_on(masked)) {
                        const int key = key0 + 8 * (e >> 1), query = m0 + 8 * j + 2 * t + (e & 1);
                        if ((p.causal && key > query) || key >= p.seq_len) x = 0.f;
                    }
                    s_acc.d[i_acc] = x;
                }
            }
        };
        if constexpr (!C::split_mask) exps(mask);
        else if (mask) exps(std::true_type{});
        else exps(std::false_type{});
        to_a_operand(p_frag, s_acc.d);
        // dV += Pᵀ·dO: A = Pᵀ from registers, B = dO (queries x D, D contiguous: MN-major)
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < BM / 16; ++k)
            wgmma::mma_rs<wgmma::major::MN>(dv_acc, p_frag[k], wgmma::desc<wgmma::major::MN, BM, 128>(do_tile(s), 0, k),
                                            accumulate || k > 0);
        wgmma::commit_group();
    };
    // After dPᵀ is done: dS = P ∘ (dP − Di); dS to shared memory; issue dK += dSᵀ·Q, then (after
    // the warpgroup's bar.sync) dQ_c = dS·K_c.
    auto ds_dk_dq = [&](int i, bool accumulate) {
        const int s = slot_of(i);
        wgmma::fence_operand(dp_acc);
        const float* di = di_s + s * BM;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float2 d2 = *reinterpret_cast<const float2*>(di + 8 * j + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dp_acc.d[4 * j + e] = s_acc.d[4 * j + e] * (dp_acc.d[4 * j + e] - ((e & 1) ? d2.y : d2.x));
        }
        to_a_operand(ds_frag, dp_acc.d);
        // dS (queries x keys, keys contiguous) into this consumer's tile for dQ = dS·K_c:
        // stmatrix.trans turns each 8x8 block of dSᵀ (rows = keys) into one of dS. Matrix mi of
        // instruction jj is query block j = 2jj + mi/2, key half hh = mi%2 (keys 16w + 8hh ..).
        // Stored row = query, 16 bytes = 8 keys, 128B swizzle of a 64 x 64 tile.
        {
            const int mi = lane / 8, r = lane % 8;
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int query = 8 * (2 * jj + mi / 2) + r;
                const int chunk = 2 * warp + (mi % 2);
                const uint32_t addr = ds_pair(i) + c * C::ds_bytes + query * 128 + ((chunk ^ (query & 7)) << 4);
                // register of matrix (j, hh) = pack(d[4j + 2hh], d[4j + 2hh + 1]) = ds_frag[j/2][2(j%2) + hh]
                stmatrix_x4_trans(addr, ds_frag[jj][0], ds_frag[jj][1], ds_frag[jj][2], ds_frag[jj][3]);
            }
        }
        fence_proxy_async();                             // generic writes -> wgmma (async proxy) reads
        // dK += dSᵀ·Q: A = dSᵀ from registers, B = Q (MN-major)
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < BM / 16; ++k)
            wgmma::mma_rs<wgmma::major::MN>(dk_acc, ds_frag[k], wgmma::desc<wgmma::major::MN, BM, 128>(q_tile(s), 0, k),
                                            accumulate || k > 0);
        wgmma::commit_group();
        if constexpr (SPLIT_DQ) named_sync<256>(3);      // both dS tiles are in shared memory
        else named_sync<128>(1 + c);                     // the whole dS_c tile is in shared memory
        if constexpr (C::dq_after_dk) {
            // D = 128: 64 more accumulators (dQ) on top of dV, dK, P, dS and both A operands
            // do not fit in the registers: let dV and dK finish first.
            wgmma::wait_group<0>();
            wgmma::fence_operand(dv_acc);
            wgmma::fence_operand(dk_acc);
            keep_alive(p_frag);
            keep_alive(ds_frag);
            wgmma::fence();
        }
        if constexpr (SPLIT_DQ) {
            // dQ[:, 64c ..] = dS·K[:, 64c ..]: A = both dS tiles (64 x 128 keys, K-major),
            // B = K's column block c (keys x 64, MN-major), 8 k-steps of 16 keys
#pragma unroll
            for (int k = 0; k < BN / 16; ++k)
                wgmma::mma_ss<wgmma::major::K, wgmma::major::MN>(
                    dq_acc, wgmma::desc<wgmma::major::K, BM, 128>(ds_pair(i), 0, k),
                    wgmma::desc<wgmma::major::MN, BN, 128>(k_tile, 64 * c, k), k > 0);
        } else {
            // dQ_c = dS·K_c: A = dS (K-major, 64 keys), B = K_c rows (keys x D: MN-major)
#pragma unroll
            for (int k = 0; k < 4; ++k)
                wgmma::mma_ss<wgmma::major::K, wgmma::major::MN>(
                    dq_acc, wgmma::desc<wgmma::major::K, BM, 128>(ds_pair(i) + c * C::ds_bytes, 0, k),
                    wgmma::desc<wgmma::major::MN, BN, 128>(k_tile, 0, 4 * c + k), k > 0);
        }
        wgmma::commit_group();
    };
    // After dV, dK, dQ are done: slot s is free. EVERY thread arrives, not lane 0 of each warp:
    // all 32 lanes read lse2_s and di_s (plain loads), and an arrive (release) orders only the
    // arriving thread's own earlier reads before producer warp 1's next writes to the slot.
    // With lane 0 alone, lanes 1-31 could still be reading when warp 1 overwrites the slot
    // (compute-sanitizer racecheck: 16 hazards, session 5; wgmma's reads of Q and dO are
    // complete in every thread after its wait_group, so they were never the problem).
    auto release = [&](int i) {
        wgmma::fence_operand(dv_acc);
        wgmma::fence_operand(dk_acc);
        wgmma::fence_operand(dq_acc);
        keep_alive(p_frag);
        keep_alive(ds_frag);
        mbar::arrive(empty[slot_of(i)]);                // Q, dO, lse, Di of slot s are free
    };
    // Add query block i's dQ partial into dq_accum: registers -> shared memory (register order)
    // -> one bulk reduce-add, in flight while the loop goes on. Split in three for variant 2,
    // which writes the registers while wgmmas run but issues the copy only when none does
    // (thread 0 alone in a branch with wgmmas in flight makes ptxas serialize them: C7518).
    auto write_dq = [&](int buffer) {                    // every thread: its registers -> smem
        float4* dst = dq_smem + buffer * (C::dq_bytes / 16);
#pragma unroll
        for (int jj = 0; jj < C::dq_cols / 8; ++jj)
            dst[jj * 128 + tid] = make_float4(dq_acc.d[4 * jj], dq_acc.d[4 * jj + 1], dq_acc.d[4 * jj + 2],
                                              dq_acc.d[4 * jj + 3]);
        fence_proxy_async();                             // generic writes -> the bulk copy's reads
    };
    auto reduce_dq = [&](int buffer, int i) {            // thread 0, after a bar.sync of the warpgroup
        // variant 3: consumer c's columns are the chunk's second half for c = 1 (kernel 3's
        // order puts columns 64c .. 64c+63 at float4 1024c .. 1024c+1023)
        bulk_reduce_add_f32(p.dq_accum + (int64_t(bh) * p.q_blocks + m_begin + i) * (BM * D) +
                                (SPLIT_DQ ? c * BM * C::dq_cols : 0),
                            dq_tile + buffer * C::dq_bytes, C::dq_bytes);
    };
    // DQ_ATOMIC (variant 7): the same chunk, added from the registers by vector atomics, no
    // shared memory and no bar.sync: each red.global.add.v4.f32 adds one float4 in L2; a warp's
    // 32 of one jj cover 512 contiguous bytes (the chunk's register order).
    auto red_dq = [&](int i) {
        float4* dst = reinterpret_cast<float4*>(p.dq_accum + (int64_t(bh) * p.q_blocks + m_begin + i) * (BM * D) +
                                                (SPLIT_DQ ? c * BM * C::dq_cols : 0));
#pragma unroll
        for (int jj = 0; jj < C::dq_cols / 8; ++jj)
            red_add_v4(dst + jj * 128 + tid, dq_acc.d[4 * jj], dq_acc.d[4 * jj + 1], dq_acc.d[4 * jj + 2],
                       dq_acc.d[4 * jj + 3]);
    };
    auto store_dq = [&](int i) {                         // variant 1: one buffer, all in one go
        if constexpr (C::dq_atomic) { red_dq(i); return; }
        if (tid == 0) tma::store_wait_read<0>();         // the previous reduce has read dq_smem
        named_sync<128>(1 + c);
        write_dq(0);
        named_sync<128>(1 + c);
        if (tid == 0) reduce_dq(0, i);
    };

    // Consumer 1's keys may all lie right of the item's first query block's queries (causal):
    // nothing to do there but hand the slot back (after it filled, so the empty phases stay in
    // order). Returns the first block to compute.
    auto skip_first = [&]() -> int {
        if (PIPELINED && p.causal && first_key > m_begin * BM + BM - 1) {
            mbar::wait(full[slot_of(0)], phase_of(0));
            mbar::arrive(empty[slot_of(0)]);             // every thread, as release does
            return 1;
        }
        return 0;
    };
    // Variant 2: two dQ buffers, so no thread waits for a bulk copy still reading the one it
    // is about to fill (variant 1's wait_read 0), and one bar.sync fewer per block.
    // (Tried and dropped: writing block i-1's dQ registers to shared memory while block i's
    // Sᵀ, dPᵀ run makes ptxas serialize the wgmmas (C7517/C7518), and issuing block i+1's
    // products before waiting for block i's keeps wgmmas in flight across the loop's back
    // edge, which it serializes too (C7514).)
    auto pipelined_blocks = [&](int i0) {
        for (int i = i0; i < n_iter; ++i) {
            issue_s_dp(i);
            wgmma::wait_group<1>();                      // Sᵀ done
            softmax_and_dv(i, i > i0);
            wgmma::wait_group<1>();                      // dPᵀ done (dV may still run)
            ds_dk_dq(i, i > i0);
            wgmma::wait_group<0>();
            release(i);
            if constexpr (C::dq_atomic) {
                // (review, session 7) No bar.sync here, unlike the bulk path below, whose
                // named_sync also ordered every warp's dQ wgmma reads of dS_c (all 64 query rows,
                // all 4 warps' key columns) before any warp's stmatrix of the next block's dS_c
                // into the SAME tile (one dS tile per consumer when !SPLIT_DQ). With atomics the
                // only bar.sync of a block is the one after that stmatrix, so warp w may overwrite
                // its key columns of dS_c while a slower warp's wgmma of this block still reads
                // them: a WAR race across proxies (.sync.aligned is warp-level; wait_group only
                // covers the executing warp's own wgmmas). racecheck need not see wgmma's async-
                // proxy reads, so call 3's 0 hazards do not rule it out; a warp would have to lag
                // most of a block (S, dP, softmax, dV) behind, so the tests never saw it. Variant 15
                // (DS_SYNC, the default since session 8) closes it with the named_sync below; two dS
                // tiles alternated by block would too (not built).
                red_dq(i);                               // variants 8, 9, 12, 13, 15: no shared memory
                if constexpr (C::ds_sync) named_sync<128>(1 + c);   // 15: every warp's dQ wgmma has
                                                         // read dS_c (its wait_group<0> is above)
                                                         // before any warp stores block i+1's dS_c
            } else {
                write_dq(i % 2);                         // buffer i % 2 was freed by the wait_read
                named_sync<128>(1 + c);                  // of block i-1 (before the bar.sync of
                if (tid == 0) {                          // this block's ds_dk_dq)
                    reduce_dq(i % 2, i);
                    tma::store_wait_read<1>();           // block i-1's copy has read its buffer
                }
            }
        }
        if (i0 == n_iter) {                              // nothing at all for these keys: zeros
#pragma unroll
            for (int x = 0; x < D / 2; ++x) dv_acc.d[x] = dk_acc.d[x] = 0.f;
        }
    };

    // ---- epilogue: dK·scale and dV to global memory (bf16), rows key0 and key0 + 8 ----
    auto store = [&](__nv_bfloat16* base, int64_t sb, int64_t sh, int64_t ss, const float (&d)[D / 2], float mul) {
        __nv_bfloat16* head = base + b * sb + h * sh;
#pragma unroll
        for (int i = 0; i < D / 2; i += 2) {
            const int key = key0 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t;
            if (key < p.seq_len)
                *reinterpret_cast<uint32_t*>(head + key * ss + col) = pack_bf16x2(d[i] * mul, d[i + 1] * mul);
        }
    };
    auto store_dk_dv = [&]() {
        store(p.dv, p.dv_stride_batch, p.dv_stride_head, p.dv_stride_seq, dv_acc.d, 1.f);
        store(p.dk, p.dk_stride_batch, p.dk_stride_head, p.dk_stride_seq, dk_acc.d, p.scale);
    };

    if constexpr (C::persistent) {
        // The items in the producer's order: item k's K, V in set k % 2 (item_s says which item).
        for (int k = 0; ; ++k) {
            const int kb = k & 1;
            mbar::wait(kv_full[kb], (k >> 1) & 1);
            const int index = item_s[kb];
            if (index < 0) break;
            set_item(index);
            set_keys();
            k_tile = smem + kb * 2 * C::kv_bytes;
            v_tile = k_tile + C::kv_bytes;
            pipelined_blocks(skip_first());
            mbar::arrive(kv_empty[kb]);                  // every wgmma that read K, V is complete
                                                         // (the last block's wait_group<0>)
            store_dk_dv();                               // the producer loads item k+2 meanwhile
            g0 += n_iter;                                // the producer filled n_iter slots
        }
        return;
    }
    mbar::wait(kv_full[0], 0);
    if constexpr (!PIPELINED) {
        // Variant 1: each block's five products in turn; the two consumers overlap each other.
        for (int i = 0; i < n_iter; ++i) {
            issue_s_dp(i);
            wgmma::wait_group<1>();                      // Sᵀ done
            softmax_and_dv(i, i > 0);
            wgmma::wait_group<1>();                      // dPᵀ done (dV may still run)
            ds_dk_dq(i, i > 0);
            wgmma::wait_group<0>();
            release(i);
            store_dq(i);
        }
    } else {
        pipelined_blocks(skip_first());
    }
    store_dk_dv();
    if (tid == 0) tma::store_wait<0>();                  // the last reduce-add has landed
}

// ---- Kernel 3: dQ = scale · dq_accum, from register order to bf16 in dQ's strides ---------------
// One block per (head, query block) chunk of 64 x D floats. Float4 f of a chunk came from thread
// tid = f % 128 and registers 4jj .. 4jj+3 (jj = f / 128) of the accumulator: rows r, r + 8 with
// r = 16·(tid/32) + (tid%32)/4, columns 8jj + 2·(tid%4) and + 1. Written straight from that order,
// a warp's 4-byte stores land on 8 rows, 8 bytes per row: a quarter of each 32-byte sector, 4x the
// store transactions (67 us per GPT-2 layer in session 5's profile for 150 MB moved). So the block
// reads the chunk in order (coalesced float4 loads), scales it and writes it row-major as bf16 to
// shared memory, then stores whole rows with 16-byte stores. A shared row is D/2 + 4 words: the
// 4-word pad puts the 8 rows one warp writes at once on different banks.
template <int D>
__global__ void __launch_bounds__(256) convert_dq_kernel(const AttentionBackwardParams p, int q_blocks) {
    constexpr int PER_CHUNK = 64 * D / 4;                // float4s per (head, query block)
    constexpr int PITCH = D / 2 + 4;                     // 32-bit words per shared row (bf16 pairs + pad)
    constexpr int SEGS = D / 8;                          // 16-byte pieces of one bf16 row
    __shared__ __align__(16) uint32_t rows[64 * PITCH];
    const int bh = int(blockIdx.x / q_blocks), m = int(blockIdx.x % q_blocks);
    const float4* chunk = reinterpret_cast<const float4*>(p.dq_accum) + int64_t(blockIdx.x) * PER_CHUNK;
    const float sc = p.shape.scale;
#pragma unroll
    for (int f = threadIdx.x; f < PER_CHUNK; f += 256) {
        const float4 v = chunk[f];
        const int tid = f % 128, jj = f / 128;
        const int row = 16 * (tid / 32) + (tid % 32) / 4, word = 4 * jj + tid % 4;   // word = column / 2
        rows[row * PITCH + word] = pack_bf16x2(v.x * sc, v.y * sc);
        rows[(row + 8) * PITCH + word] = pack_bf16x2(v.z * sc, v.w * sc);
    }
    __syncthreads();
    const int b = bh / p.shape.heads, h = bh % p.shape.heads;
    auto* dq = static_cast<__nv_bfloat16*>(p.dq.data) + b * p.dq.stride_batch + h * p.dq.stride_head;
#pragma unroll
    for (int s = threadIdx.x; s < 64 * SEGS; s += 256) {
        const int row = s / SEGS, seg = s % SEGS, t = m * 64 + row;
        if (t < p.shape.seq_len)
            *reinterpret_cast<uint4*>(dq + int64_t(t) * p.dq.stride_seq + 8 * seg) =
                *reinterpret_cast<const uint4*>(&rows[row * PITCH + 4 * seg]);
    }
}

// ---- Host side ---------------------------------------------------------------------------------
inline int query_blocks(int seq_len) { return (seq_len + 63) / 64; }
// Floats of the dQ accumulator: a 64 x D chunk per (head, query block), query blocks padded to 64.
inline int64_t dq_accum_floats(int batch, int heads, int seq_len, int head_dim) {
    return int64_t(batch) * heads * query_blocks(seq_len) * 64 * head_dim;
}
// What the caller allocates: the chunks and, past them, 16 floats (64 bytes) for PERSISTENT's
// work counter (an int; zeroed by prep_kernel, so no separate memset).
constexpr int64_t COUNTER_FLOATS = 16;

template <int D, bool PIPELINED, bool SPLIT_DQ = false, int OPT = 0>
cudaError_t launch(const AttentionBackwardParams& a, cudaStream_t stream, bool l2_groups) {
    using C = config<D, PIPELINED, SPLIT_DQ, OPT>;
    const AttentionShape& sh = a.shape;
    const int q_blocks = query_blocks(sh.seq_len);
    const int64_t rows = int64_t(sh.batch) * sh.heads * sh.seq_len;

    const int64_t accum_floats = dq_accum_floats(sh.batch, sh.heads, sh.seq_len, D);
    cudaError_t err;
    if (C::prep) {
        prep_kernel<D, C::persistent><<<unsigned(int64_t(sh.batch) * sh.heads * q_blocks), 256, 0, stream>>>(a, q_blocks);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
    } else if ((err = cudaMemsetAsync(a.dq_accum, 0, size_t(accum_floats) * sizeof(float), stream)) != cudaSuccess) {
        return err;
    }
    if (!C::prep) {
        rowsum_kernel<D><<<unsigned((rows + 256 / (D / 8) - 1) / (256 / (D / 8))), 256, 0, stream>>>(a);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }

    kernel_params kp{};
    const AttentionTensor* in[4] = {&a.q, &a.k, &a.v, &a.d_o};
    CUtensorMap* maps[4] = {&kp.q_map, &kp.k_map, &kp.v_map, &kp.do_map};
    const int box_rows[4] = {C::block_m, C::block_n, C::block_n, C::block_m};
    for (int i = 0; i < 4; ++i) {
        std::string why = tk::tma::make_bhtd_tensor_map(maps[i], in[i]->data, sh.batch, sh.heads, sh.seq_len, D,
                                                        in[i]->stride_batch, in[i]->stride_head, in[i]->stride_seq,
                                                        box_rows[i]);
        if (!why.empty()) return cudaErrorInvalidValue;
    }
    kp.dk = static_cast<__nv_bfloat16*>(a.dk.data);
    kp.dv = static_cast<__nv_bfloat16*>(a.dv.data);
    kp.dk_stride_batch = a.dk.stride_batch; kp.dk_stride_head = a.dk.stride_head; kp.dk_stride_seq = a.dk.stride_seq;
    kp.dv_stride_batch = a.dv.stride_batch; kp.dv_stride_head = a.dv.stride_head; kp.dv_stride_seq = a.dv.stride_seq;
    kp.lse = a.lse;
    kp.d_rowsum = a.d_rowsum;
    kp.dq_accum = a.dq_accum;
    kp.heads = sh.heads;
    kp.seq_len = sh.seq_len;
    kp.q_blocks = q_blocks;
    kp.scale = sh.scale;
    kp.scale_log2 = sh.scale * LOG2E;
    kp.causal = sh.causal ? 1 : 0;
    kp.batch_heads = sh.batch * sh.heads;
    kp.n_blocks = (sh.seq_len + C::block_n - 1) / C::block_n;
    const int64_t bytes_per_head = int64_t(sh.seq_len) * D * (2 + 2 + 4);   // Q, dO, dQ accumulator
    kp.heads_per_group = attention_l2::heads_per_group(l2_groups, bytes_per_head, kp.batch_heads);
    kp.total_items = kp.batch_heads * kp.n_blocks;
    kp.work_counter = reinterpret_cast<int*>(a.dq_accum + accum_floats);   // the int past the chunks
    int grid = kp.total_items;
    if (C::persistent) {                                 // one CTA per SM (registers), at most one per item
        int device = 0, sms = 0;
        if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
        if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
        grid = std::min(grid, sms);
    }

    auto kernel = backward_kernel<D, PIPELINED, SPLIT_DQ, OPT>;
    static cudaError_t configured = [&] {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::smem_bytes);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared));
        return e;
    }();
    if (configured != cudaSuccess) return configured;
    kernel<<<grid, C::threads, C::smem_bytes, stream>>>(kp);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    convert_dq_kernel<D><<<unsigned(int64_t(sh.batch) * sh.heads * q_blocks), 256, 0, stream>>>(a, q_blocks);
    return cudaGetLastError();
}

}  // namespace attention_hopper_bwd

// Why these inputs cannot run here (nullptr: they can). The bindings turn this into a Python error.
const char* attention_hopper_backward_why_not(const AttentionBackwardParams& a) {
    const AttentionShape& s = a.shape;
    if (s.head_dim != 64 && s.head_dim != 128) return "head_dim must be 64 or 128";
    if (s.seq_len < 1 || s.batch < 1 || s.heads < 1) return "batch, heads and seq_len must be >= 1";
    if (int64_t(s.batch) * s.heads > 0x7fffffff) return "batch * heads must be < 2^31";
    if ((s.seq_len + 127) / 128 > 65535) return "seq_len must be < 65535 * 128";
    if (int64_t(s.batch) * s.heads * ((s.seq_len + 127) / 128) > 0x7fffffff)
        return "batch * heads * ceil(seq_len / 128) must be < 2^31 (one CTA per 128 keys)";
    if (int64_t(s.batch) * s.heads * ((s.seq_len + 63) / 64) > 0x7fffffff)
        return "batch * heads * ceil(seq_len / 64) must be < 2^31 (one dQ conversion block per 64 queries)";
    if (!(s.scale > 0.f) || !std::isfinite(s.scale)) return "scale must be a positive finite number";
    const AttentionTensor* ts[8] = {&a.q, &a.k, &a.v, &a.o, &a.d_o, &a.dq, &a.dk, &a.dv};
    for (const AttentionTensor* t : ts) {
        if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return "q, k, v, o, grad_out, dq, dk, dv must be 16-byte aligned";
        int64_t st[3] = {t->stride_batch, t->stride_head, t->stride_seq};
        int64_t sz[3] = {s.batch, s.heads, s.seq_len};
        for (int i = 0; i < 3; ++i)
            if (sz[i] > 1 && (st[i] <= 0 || st[i] % 8 != 0))
                return "the batch, head and seq strides of every tensor must be positive multiples of 8 elements";
    }
    if (a.lse == nullptr || a.d_rowsum == nullptr || a.dq_accum == nullptr) return "missing scratch buffers";
    return nullptr;
}

// Floats the launcher needs in AttentionBackwardParams::dq_accum (query blocks padded to 64 rows).
int64_t attention_hopper_backward_dq_accum_floats(int batch, int heads, int seq_len, int head_dim) {
    return attention_hopper_bwd::dq_accum_floats(batch, heads, seq_len, head_dim) + attention_hopper_bwd::COUNTER_FLOATS;
}

// The variants, numbered as in kernels/NOTES.md (Session 3, Hopper backward); 0 = the default.
//   1: each query block's five products in turn (2 slots, one dQ buffer); D = 128's default in
//      session 3
//   2: 3 slots, two dQ buffers, consumer 1 skips its fully masked first block; D = 64's
//      default in session 3 (D = 128 has no room for the extra slot and buffers: it runs variant 1)
//   3: D = 128: variant 1 with dQ split by columns over both consumers (D = 64 runs its default)
//   4: the session-3 default (2 for D = 64, 1 for D = 128) with the CTAs in L2 groups of heads
//   5: D = 128: 3 with L2 groups (D = 64 runs 4); D = 128's default
//   6, 7: removed (Di inside the main kernel: lost, see the opening comment)
//   8: D = 64: 4 with the dQ partials added by vector atomics (DQ_ATOMIC)
//   9: D = 64: one consumer (64 keys) per CTA, two CTAs per SM, dQ by vector atomics
//  10: D = 64: 9 with the dQ partials by bulk reduce-add (4's two buffers)
//  11-14: D = 64: 4, 8, 9, 10 with prep_kernel (dq_accum zeroed and Di in one pass)
//  15: D = 64: 12 with a bar.sync after the dQ atomics (DS_SYNC: 12's race closed); D = 64's
//      default in session 8
//  16: D = 64: 15 with one persistent CTA per SM (PERSISTENT: K/V of the next item loaded while
//      the current one runs); D = 64's default in session 9
//  17: removed (session 9's LATE_DQ: 16 with a block's dQ atomics after the next block's Sᵀ, dPᵀ
//      were issued; 535.0 us against 16's 507.6; code at commit 882ef32)
//  18: removed in session 10 (15 + SPLIT_MASK: 521.7 us, behind 16 and 19)
//  19: D = 64: 16 + SPLIT_MASK (the mask's tests only in the blocks that need them; session 9);
//      D = 64's default since session 10
//  20-24: removed (see the opening comment: session 7's and session 10's; 15-19 reused)
//  D = 128 runs 5 for 8-10 and 5 with prep_kernel for 11-16, 19.
// 1-3 take the CTAs in session 3's order (block_at with one group of all heads).
// (The file's opening comment says more about each.)
// Runs the three kernels on `cuda_stream`; returns the CUDA error (0 = ok).
int attention_hopper_backward_variant(const AttentionBackwardParams& p, void* cuda_stream, int variant) {
    using namespace attention_hopper_bwd;
    if (attention_hopper_backward_why_not(p)) return cudaErrorInvalidValue;
    auto stream = static_cast<cudaStream_t>(cuda_stream);
    if (p.shape.head_dim == 128) {
        if (variant == 0) variant = DEFAULT_VARIANT_D128;
        switch (variant) {
        case 1: case 2: return launch<128, false>(p, stream, false);
        case 3: return launch<128, false, true>(p, stream, false);
        case 4: return launch<128, false>(p, stream, true);
        case 5: return launch<128, false, true>(p, stream, true);
        case 8: case 9: case 10: return launch<128, false, true>(p, stream, true);   // = 5 (see above)
        case 11: case 12: case 13: case 14: case 15: case 16: case 19:
            return launch<128, false, true, PREP>(p, stream, true);   // 5 + prep
        default: return cudaErrorInvalidValue;
        }
    }
    if (variant == 0) variant = DEFAULT_VARIANT_D64;
    switch (variant) {
    case 1: return launch<64, false>(p, stream, false);
    case 2: case 3: return launch<64, true>(p, stream, false);
    case 4: case 5: return launch<64, true>(p, stream, true);
    case 8: return launch<64, true, false, DQ_ATOMIC>(p, stream, true);
    case 9: return launch<64, true, false, ONE_CONSUMER | DQ_ATOMIC>(p, stream, true);
    case 10: return launch<64, true, false, ONE_CONSUMER>(p, stream, true);
    case 11: return launch<64, true, false, PREP>(p, stream, true);
    case 12: return launch<64, true, false, PREP | DQ_ATOMIC>(p, stream, true);
    case 13: return launch<64, true, false, PREP | ONE_CONSUMER | DQ_ATOMIC>(p, stream, true);
    case 14: return launch<64, true, false, PREP | ONE_CONSUMER>(p, stream, true);
    case 15: return launch<64, true, false, PREP | DQ_ATOMIC | DS_SYNC>(p, stream, true);
    case 16: return launch<64, true, false, PREP | DQ_ATOMIC | DS_SYNC | PERSISTENT>(p, stream, true);
    case 19: return launch<64, true, false, PREP | DQ_ATOMIC | DS_SYNC | PERSISTENT | SPLIT_MASK>(p, stream, true);
    default: return cudaErrorInvalidValue;
    }
}

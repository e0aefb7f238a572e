// kernels/gemm_5_pingpong.cu — GEMM step 5: ping-pong consumers, so one warpgroup's epilogue
// overlaps the other's math.
//
// What changes from step 4: there, both consumers share one 128x256 tile, finish it together
// and run the epilogue together, so the tensor cores idle at every tile boundary (about 4 µs a
// tile on the H200, 25-30% of a tile with K = 768: kernels/NOTES.md, run 2). Here each consumer
// owns whole tiles (128x128: two m64n128 wgmmas per k-step; or 64x256: one m64n256; 128 fp32
// accumulators a thread either way) and the consumers take the CTA's tiles in turn: consumer 0
// tiles 0, 2, 4, ..., consumer 1 tiles 1, 3, 5, .... The producer fills one ring in tile order,
// so while consumer 0 stores tile 0, consumer 1 already multiplies tile 1 (CUTLASS calls this
// schedule "pingpong"). The price: smaller tiles per k-step (32 KB of operands per 2.1 MFLOP
// instead of 48 KB per 4.2 MFLOP), i.e. a third more L2 and shared-memory traffic per flop.
// What it bought (H200, ratio to cuBLAS in the same run; kernels/NOTES.md session 3, call 2):
//   shape (M x K x N)        step 4   v0 128x128   v1 64x256   v2 128x128/4st   v3, v4 clusters
//   fwd 16384x768x3072       0.695    0.761        0.781       0.780            0.44, 0.48
//   fwd 16384x768x2304       0.697    0.759        0.797       0.780            0.45, 0.49
//   fwd 16384x768x768        0.753    0.753        0.781       0.763            0.46, 0.49
//   fwd 16384x3072x768       0.903    0.848        0.893       0.845            0.35, 0.40
//   dW  768x16384x3072       0.824    0.834        0.850       0.837            0.34, 0.41
//   8192³                    0.85-0.96 0.770       0.826       0.778            0.32, 0.41
// So ping-pong wins where K is short (the epilogue overlap pays: +8-14% at K = 768), and the
// 64x256 tile (one m64n256 wgmma per k16 instead of two m64n128) beats 128x128 by 2-5% almost
// everywhere although it moves a quarter more bytes from L2 per flop: L2 traffic is not what
// limits these tiles (what is, was not measured: no profiler run). It loses where K is
// long (8192³, K = 3072): there the epilogue is rare and step 4's larger tile wins. The 2-CTA
// cluster variants (B multicast) are correct but ran at about half speed. Session 4 ruled out
// the cluster count (66 clusters launched, as many as fit) and found, by ncu, the tensor pipe at
// 36% against 58% without clusters; the suspect is now the consumers' remote arrive, which was a
// cluster-scope release (`.release.cluster`) once per k-step: gemm4::arrive_on_cta now uses the
// CTA-scope default as CUTLASS does. Session 4's final call with it: v4 0.88x at 8192³ and
// 0.62-0.82x at GPT-2 shapes, no longer half speed but still below v1 and v5. Variant 5 (64x256,
// 5 stages, one staging box per warp; session 4, call 2): 0.975x at 8192³, 0.77x at fwd
// 16384x768x3072 (v1 0.79x; 4-5% behind v1 at fwd x768x2304 and x768x768), 0.82-0.86x on the
// weight gradients (step 4 0.78-0.81x) except dW 768x16384x768, where step 4 won (0.92x vs 0.86x;
// final call 0.66x vs 0.65x). kernels/gemm.py `auto_step` picks step 5 v1 for K <= 1024, step 4
// otherwise, for products with a fused bias/GELU (a plain product runs step 4 v8, or, when it has
// too few tiles, step 5 v10 or v7: session 8, below).
//
// Session 6: with the plain epilogue (kernels/gemm_plain_epilogue.cuh; variants 6 = 64x256 and
// 7 = 128x128) the ping-pong runs at 1.02-1.03x cuBLAS at the K = 768 forward shapes, and 128x128
// (fewer L2 bytes per flop) is the better tile for the weight gradients (0.93-1.05x); the old
// epilogue was not hidden behind the other consumer's math: its warps stalled on instruction
// fetch (kernels/NOTES.md, session 6).
//
// The kernel template lives in kernels/gemm_5_pingpong.cuh (shared with the MLP, whose fused
// epilogues it also runs); this file holds step 5's variants and dispatch, with step 4's
// linear-layer epilogue policy (bias, GELU, split-K).
#include "gemm.cuh"
#include "gemm_5_pingpong.cuh"
#include "gemm_plain_epilogue.cuh"
#include "gemm_splitk_epilogue.cuh"

namespace {
using namespace tk;
using wgmma::major;

// Variants measured by kernels/gemm_bench.py --variants5 1,2,3,4; gemm::args::variant picks one
// (0 = the first measured; 1 is the fastest, see the table above).
using config0 = gemm5::pingpong_128x128;   // 128x128 per consumer, 6 stages (the first measured)
using config1 = gemm5::pingpong_64x256;    // 64x256 per consumer (one m64n256 per k16), 4 stages
using config2 = gemm5::config<2, 4>;       // 128x128, 4 stages (does ring depth matter?)
using config3 = gemm5::pingpong_128x128_cluster2;   // 128x128, 6 stages, B multicast across 2-CTA clusters
using config4 = gemm5::pingpong_64x256_cluster2;    // 64x256, 4 stages, B multicast across 2-CTA clusters
using config5 = gemm5::config<1, 5, 1>;   // 64x256, 5 stages, ONE staging box per warp: more bytes in flight
                                           // (200 vs 160 KB) for the same 216 KB of shared memory (session 4)
// Variants 6 and 7 (session 6) = config1's 64x256 and config0's 128x128 tiles with
// gemm4::plain_epilogue (kernels/gemm_plain_epilogue.cuh): the plain product only (no bias, no
// GELU), boxes staged by stmatrix with no per-value branches.
// Variant 8 (session 7) = config0's 128x128 tile with gemm4::splitk_epilogue
// (kernels/gemm_splitk_epilogue.cuh): the plain product whose split-K is finished in the kernel
// (the last split of a tile stores it, bf16 or fp32; no memset, no conversion kernel), given a
// workspace that the caller zeroes once and the kernel keeps zeroed; each consumer warp arrives
// for its own piece. Correct and 1-5% slower than variant 7 WITH its memset and conversion
// kernels (session 7, call 4): opt-in. (Session 7's variant 9, the same with one arrival per
// consumer, measured the same as 8 and was removed after the session; code at 777f4c7.)
// Variant 10 (session 8) = variant 8's tile and arrival protocol, with each CTA's units read from
// a schedule planned on the host (kernels/gemm.py stream_schedule: whole tiles plus a few
// pieces of unequal length, the same k-tiles per CTA) instead of `splits` equal pieces per
// tile: far fewer fp32 partials per CTA (kernels/gemm_splitk_epilogue.cuh says why). A piece
// arrives in its own epilogue (AT_ONCE). Variant 10 is matmul(step=0)'s choice for the weight
// gradients with at least SMs/2 tiles of 128x128 (kernels/gemm.py auto_step; session 8, call 3, CUDA graphs: 0.950 / 1.068 / 1.026x cuBLAS
// at dW 3072x768 / 768x3072 / 2304x768 against variant 7's 0.870 / 0.938 / 0.968x in the same run).
// Session 8's variant 11, the same with a piece arriving one tile of its consumer later (as in 8),
// ran 0-4.5% behind 10 (call 2) and was removed after the session (code at commit 553a564).

template <typename Cfg, major MA, major MB, typename OutT, bool PLAIN>
const char* launch(const gemm::args& g) {
    if constexpr (PLAIN) {
        using Epi = gemm4::plain_epilogue<OutT>;
        return gemm5::launch<Cfg, MA, MB, Epi>(
            "gemm step 5", g.a, g.b, g.M, g.N, g.K, g.splits, g.num_sms, g.stream,
            [&] { return Epi{gemm4::out_gl<OutT>(static_cast<OutT*>(g.c), 1, g.M, g.N)}; });
    } else {
        using Epi = gemm4::linear_epilogue<OutT>;
        return gemm5::launch<Cfg, MA, MB, Epi>(
            "gemm step 5", g.a, g.b, g.M, g.N, g.K, g.splits, g.num_sms, g.stream, [&] {
                return Epi{gemm4::out_gl<OutT>(static_cast<OutT*>(g.c), 1, g.M, g.N),
                           {static_cast<const bf16*>(g.bias), g.gelu}};
            });
    }
}

// Variant 8: the split-K workspace is checked here, where the tile is known.
template <typename Cfg, major MA, major MB, typename OutT>
const char* launch_splitk(const gemm::args& g) {
    using Epi = gemm4::splitk_epilogue<OutT>;
    if (g.splits > 1) {
        const long long tiles = (long long)((g.M + Cfg::BM - 1) / Cfg::BM) * ((g.N + Cfg::BN - 1) / Cfg::BN);
        if (!g.splitk_sums || !g.splitk_arrivals || g.splitk_sums_count < tiles * Cfg::BM * Cfg::BN ||
            g.splitk_arrivals_count < tiles * 4)
            return "gemm step 5: variant 8 with splits > 1 needs a zeroed workspace of tiles x BM x BN fp32 sums "
                   "and tiles x 4 int32 arrival counters (kernels/gemm.py splitk_workspace makes it)";
    }
    return gemm5::launch<Cfg, MA, MB, Epi>(
        "gemm step 5", g.a, g.b, g.M, g.N, g.K, g.splits, g.num_sms, g.stream, [&] {
            return Epi{{gemm4::out_gl<OutT>(static_cast<OutT*>(g.c), 1, g.M, g.N)},
                       reinterpret_cast<float4*>(g.splitk_sums), g.splitk_arrivals};
        });
}

// Variant 10: the workspace as variant 8's, and the schedule (its contents are kernels/gemm.py's;
// here only that it exists and fits the launch).
template <typename Cfg, major MA, major MB, typename OutT>
const char* launch_scheduled(const gemm::args& g) {
    const long long tiles = (long long)((g.M + Cfg::BM - 1) / Cfg::BM) * ((g.N + Cfg::BN - 1) / Cfg::BN);
    if (const char* error = gemm4::scheduled_args_error(
            g, tiles, Cfg::BM * Cfg::BN, 4,
            "gemm step 5: variant 10 needs a zeroed workspace of tiles x BM x BN fp32 sums and tiles x 4 "
            "int32 arrival counters (kernels/gemm.py splitk_workspace makes it)",
            "gemm step 5: variant 10 needs a schedule of units x grid entries (kernels/gemm.py stream_schedule makes it)",
            "gemm step 5: variant 10 plans its own split of K; pass splits = 1"))
        return error;
    return gemm5::launch<Cfg, MA, MB, gemm4::scheduled_splitk_epilogue<OutT, true>>(
        "gemm step 5", g.a, g.b, g.M, g.N, g.K, 1, g.num_sms, g.stream,
        [&] { return gemm4::scheduled_epilogue_of<OutT>(g);
    });
}

template <typename Cfg>
const char* dispatch_scheduled(const gemm::args& g) {
    return gemm4::by_layout(g, [&]<major MA, major MB, typename OutT>() {
        return launch_scheduled<Cfg, MA, MB, OutT>(g);
    });
}

template <typename Cfg>
const char* dispatch_splitk(const gemm::args& g) {
    return gemm4::by_layout(g, [&]<major MA, major MB, typename OutT>() {
        return launch_splitk<Cfg, MA, MB, OutT>(g);
    });
}

template <typename Cfg, bool PLAIN = false>
const char* dispatch(const gemm::args& g) {
    return gemm4::by_layout(g, [&]<major MA, major MB, typename OutT>() {
        return launch<Cfg, MA, MB, OutT, PLAIN>(g);
    });
}
}  // namespace

const char* gemm::step5_pingpong(const gemm::args& g) {
    if (g.a_mn_major && !g.b_mn_major) return "gemm step 5: A M-major with B K-major is not instantiated; pass B N-major";
    if (g.splits > 1 && !g.c_fp32 && g.variant < 8)
        return "gemm step 5: split-K reduce-adds fp32 partials; ask for an fp32 output (or use variant 8)";
    if (g.variant >= 6 && (g.bias || g.gelu))
        return "gemm step 5: variants 6-8 and 10 are the plain product (no bias, no GELU); use variant 1 for a fused epilogue";
#ifdef GEMM_DEFAULT_VARIANT_ONLY   // the CPU compile test: one configuration and the plain epilogues keep it quick
    if (g.variant != 0 && g.variant != 6 && g.variant != 8 && g.variant != 10) return "gemm step 5: built with GEMM_DEFAULT_VARIANT_ONLY";
    return g.variant == 6 ? dispatch<config1, true>(g) : g.variant == 8 ? dispatch_splitk<config0>(g)
         : g.variant == 10 ? dispatch_scheduled<config0>(g) : dispatch<config0>(g);
#endif
    switch (g.variant) {
        case 0: return dispatch<config0>(g);
        case 1: return dispatch<config1>(g);
        case 2: return dispatch<config2>(g);
        case 3: return dispatch<config3>(g);
        case 4: return dispatch<config4>(g);
        case 5: return dispatch<config5>(g);
        case 6: return dispatch<config1, true>(g);
        case 7: return dispatch<config0, true>(g);
        case 8: return dispatch_splitk<config0>(g);
        case 10: return dispatch_scheduled<config0>(g);
        default: return "gemm step 5: variant must be 0..8 or 10 (9 and 11 were removed)";
    }
}

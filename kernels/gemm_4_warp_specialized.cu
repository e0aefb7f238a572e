// kernels/gemm_4_warp_specialized.cu — GEMM step 4: warp-specialized, persistent, TMA-store epilogue.
//
// What changes from step 3: the roles split. One PRODUCER warpgroup only issues TMA loads into a
// ring of shared stages and gives most of its registers away (setmaxnreg 40); two CONSUMER
// warpgroups take them (setmaxnreg 232) and each keeps a 64x256 fp32 accumulator in registers,
// running wgmma back to back. Full/empty mbarriers hand each stage between them, so loads run
// ahead of the math instead of in lock step with it. The grid is persistent (one CTA per SM)
// and walks output tiles in groups of rows so neighbours share A and B in L2; while consumers
// run the epilogue of one tile the producer already loads the next. The epilogue goes
// registers -> swizzled shared tile -> TMA store, per warp (16 rows each, no warpgroup barrier),
// or TMA reduce-add for split-K, which gives the weight gradient's few output tiles enough
// work units to fill 132 SMs. What it bought: 660 TFLOP/s at 8192³, 1.1× step 3 (0.96-0.98×
// cuBLAS); 1.2× step 3 at GPT-2's forward shapes (still only 0.70-0.92× cuBLAS) and 4-5× on the
// weight gradient (split-K, no transposed copies).
// Session 6 found what the forward shapes lost: linear_epilogue decides bias and GELU at run time
// per value, so every tile's epilogue ran ~1000 instructions per warp through ~84 KB of SASS, and
// the warps stalled on instruction fetch (ncu). Variant 6 (kernels/gemm_plain_epilogue.cuh: the
// plain product, stmatrix staging, ~50 instructions per box) and variant 8 (the same with a
// tile's stores issued during the next tile's first k-steps, so the tensor cores never wait for
// an epilogue) run at 0.98-1.05× and 1.02-1.11× cuBLAS at 8192³ and every GPT-2 forward shape
// (H200, CUDA-graph timing; kernels/NOTES.md, session 6); variant 8 is what matmul(step=0) runs
// for a plain product with enough tiles (kernels/gemm.py auto_step).
//
// The kernel template (producer, consumer main loop, epilogue loop, launcher) is in
// kernels/gemm_4_warp_specialized.cuh, shared with the MLP; this file holds step 4's epilogue
// policy and its launcher. Read in order: the header, then this file's variants, epilogue, dispatch.
#include "gemm.cuh"
#include "gemm_4_warp_specialized.cuh"
#include "gemm_plain_epilogue.cuh"
#include "gemm_splitk_epilogue.cuh"

namespace {
using namespace tk;
using wgmma::major;
using gemm4::config;

// Variants measured by kernels/gemm_bench.py --variants; gemm::args::variant picks one (0 = default).
using config0 = config<4, 64, false>;
using config1 = config<4, 64, true>;
using config2 = config<8, 32, false>;
using config3 = config<8, 32, true>;
using config4 = config<3, 64, false, 4>;
using config5 = config<4, 64, false, 2, 2>;   // 2-CTA clusters sharing B by multicast (cuBLAS's "2x1"; session 4)
// Variants 6 and 7 (session 6) = config0's and config5's pipelines with gemm4::plain_epilogue
// (kernels/gemm_plain_epilogue.cuh): the plain product only (no bias, no GELU), boxes staged by
// stmatrix with no per-value branches. Variant 8 = config0 with deferred_plain_epilogue: the
// same, with a tile's stores overlapping the next tile's first k-steps.
// Variant 9 (session 8) = config0 with gemm4::scheduled_splitk_epilogue (kernels/
// gemm_splitk_epilogue.cuh): the plain product on a schedule planned on the host (kernels/gemm.py
// stream_schedule: each CTA the same k-tiles, as whole 128x256 tiles plus a few k-pieces, or a
// tile's head or a share of the tails), the pieces summed in the kernel (each consumer warp's
// 16 x 256 slab a piece of its own, 8 arrival counters a tile). For the weight gradients, whose
// few tiles made split-K (and with it step 5's overlapped epilogues) necessary: with one or two
// pieces per CTA, step 4's larger tile (48 KB of operands per 4.2 MFLOP k-step, 5v7's 32 KB per
// 2.1) might win back what its exposed epilogue costs. It did not (session 8, call 2, CUDA graphs:
// 2-7% behind step 5 variant 10 at the four GPT-2 dW shapes): opt-in.

// Variant 9's workspace and schedule (their contents: kernels/gemm.py).
template <typename Cfg, major MA, major MB, typename OutT>
const char* launch_scheduled(const gemm::args& g) {
    const long long tiles = (long long)((g.M + gemm4::BM - 1) / gemm4::BM) * ((g.N + gemm4::BN - 1) / gemm4::BN);
    if (const char* error = gemm4::scheduled_args_error(
            g, tiles, gemm4::BM * gemm4::BN, 8,
            "gemm step 4: variant 9 needs a zeroed workspace of tiles x 128 x 256 fp32 sums and tiles x 8 int32 "
            "arrival counters (kernels/gemm.py splitk_workspace makes it)",
            "gemm step 4: variant 9 needs a schedule of units x grid entries (kernels/gemm.py stream_schedule makes it)",
            "gemm step 4: variant 9 plans its own split of K; pass splits = 1"))
        return error;
    return gemm4::launch<Cfg, MA, MB, gemm4::scheduled_splitk_epilogue<OutT, true>>(
        "gemm step 4", g.a, g.b, g.M, g.N, g.K, 1, g.num_sms, g.stream,
        [&] { return gemm4::scheduled_epilogue_of<OutT>(g);
    });
}

template <typename Cfg>
const char* dispatch_scheduled(const gemm::args& g) {
    return gemm4::by_layout(g, [&]<major MA, major MB, typename OutT>() {
        return launch_scheduled<Cfg, MA, MB, OutT>(g);
    });
}

template <typename Cfg, major MA, major MB, typename OutT, template <typename> class Policy>
const char* launch(const gemm::args& g) {
    // Step 4's epilogue policy: gemm4::linear_epilogue (in the header, shared with step 5): bias
    // and GELU per value, TMA store or split-K reduce-add per box. Variants 6-8: the plain ones.
    if constexpr (!std::is_same_v<Policy<OutT>, gemm4::linear_epilogue<OutT>>) {
        using Epi = Policy<OutT>;
        return gemm4::launch<Cfg, MA, MB, Epi>(
            "gemm step 4", g.a, g.b, g.M, g.N, g.K, g.splits, g.num_sms, g.stream,
            [&] { return Epi{gemm4::out_gl<OutT>(static_cast<OutT*>(g.c), 1, g.M, g.N)}; });
    } else {
        using Epi = gemm4::linear_epilogue<OutT>;
        return gemm4::launch<Cfg, MA, MB, Epi>(
            "gemm step 4", g.a, g.b, g.M, g.N, g.K, g.splits, g.num_sms, g.stream, [&] {
                return Epi{gemm4::out_gl<OutT>(static_cast<OutT*>(g.c), 1, g.M, g.N),
                           {static_cast<const bf16*>(g.bias), g.gelu}};
            });
    }
}

template <typename Cfg, template <typename> class Policy = gemm4::linear_epilogue>
const char* dispatch(const gemm::args& g) {
    return gemm4::by_layout(g, [&]<major MA, major MB, typename OutT>() {
        return launch<Cfg, MA, MB, OutT, Policy>(g);
    });
}
}  // namespace

const char* gemm::step4_warp_specialized(const gemm::args& g) {
    if (g.a_mn_major && !g.b_mn_major) return "gemm step 4: A M-major with B K-major is not instantiated; pass B N-major";
    if (g.splits > 1 && !g.c_fp32 && g.variant != 9) return "gemm step 4: split-K reduce-adds fp32 partials; ask for an fp32 output";
    if (g.variant >= 6 && (g.bias || g.gelu))
        return "gemm step 4: variants 6-9 are the plain product (no bias, no GELU); use variant 0 for a fused epilogue";
#ifdef GEMM_DEFAULT_VARIANT_ONLY   // the CPU compile test: the default and the plain epilogue keep it quick
    if (g.variant != 0 && g.variant != 6 && g.variant != 9) return "gemm step 4: built with GEMM_DEFAULT_VARIANT_ONLY";
    return g.variant == 6 ? dispatch<config0, gemm4::plain_epilogue>(g) : g.variant == 9 ? dispatch_scheduled<config0>(g)
         : dispatch<config0>(g);
#endif
    switch (g.variant) {
        case 0: return dispatch<config0>(g);
        case 1: return dispatch<config1>(g);
        case 2: return dispatch<config2>(g);
        case 3: return dispatch<config3>(g);
        case 4: return dispatch<config4>(g);
        case 5: return dispatch<config5>(g);
        case 6: return dispatch<config0, gemm4::plain_epilogue>(g);
        case 7: return dispatch<config5, gemm4::plain_epilogue>(g);
        case 8: return dispatch<config0, gemm4::deferred_plain_epilogue>(g);
        case 9: return dispatch_scheduled<config0>(g);
        default: return "gemm step 4: variant must be 0..9";
    }
}

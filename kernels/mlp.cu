// kernels/mlp.cu — GPT-2's MLP (c_fc -> GELU(tanh) -> c_proj), forward and backward, as five GEMMs
// whose epilogues do the elementwise work, on tk's warpgroup ops (wgmma, TMA, mbarriers).
//
// Roofline at GPT-2 sizes (M = B·T tokens, C = 768, hidden H = 4C = 3072, bf16):
//   forward  = 2 GEMMs of 2·M·C·H FLOPs = 4·M·C·H = 155 GFLOP at M = 16384; backward = 2x that.
//   The forward must move x (25 MB), W1 and W2 (5 MB each), pre and h (100 MB each) and y
//   (25 MB): ~260 MB, i.e. ~600 FLOP per byte against the H200's ~180 (750 TFLOP/s over
//   4.2 TB/s). So the op is compute-bound by ~3x: its time is tensor-core time.
//   Why fuse the GELU anyway: unfused, "GELU(x·W1ᵀ + b1)" is a GEMM plus an elementwise pass
//   that reads the 4x-wide pre-activation and writes h (200 MB, ~50 µs at 16k tokens: a quarter
//   of the forward's compute time), and the backward's dGELU is another pass reading dh and pre
//   and writing dpre (300 MB). Fused, those values never make the round trip: the epilogue
//   applies them to the fp32 accumulators on their way out, and only the outputs the next step
//   needs are written once. The cost left is epilogue time (one tanh.approx per value and the
//   stores), which step 4 does not overlap with the math (both consumers finish a tile
//   together) and step 5's ping-pong schedule does.
//   Measured figures and what would close the gap to 1.1x eager: kernels/NOTES.md, MLP and
//   "Session 3: GEMM per shape and the MLP".
//
// The kernels are the GEMM lessons' steps 4 and 5 (kernels/gemm_4_warp_specialized.cuh and
// gemm_5_pingpong.cuh; read them and their .cu lessons first): a producer warpgroup issues TMA
// loads into a ring of stages, two consumer warpgroups run wgmma on a persistent grid, and each
// consumer warp stores its 16-row slabs through its own staging boxes with TMA. Step 4 puts both
// consumers on one 128x256 tile (best for long K); step 5 gives each consumer its own tile and
// alternates their main loops, so one's epilogue overlaps the other's math. Measured on the H200
// (kernels/NOTES.md, session 3): c_fc's forward (K = 768, two outputs per value) is 7% faster on
// step 5's 64x256 tiles; the dGELU GEMM, although its epilogue is the heaviest, was 3-5% SLOWER
// on any ping-pong tile than on step 4, and session 4's pre by TMA (dgelu_pre_tma below, opt-in)
// did not change that (kernels/mlp.h, auto; kernels/NOTES.md, session 4).
// gemm_args::schedule picks one per GEMM (mlp.h; SCHEDULE_AUTO chooses by shape). The epilogue
// is a template parameter, a policy called per accumulator box: the policies live in
// kernels/mlp_epilogues.cuh, step 4's launch in this file, step 5's in kernels/mlp_pingpong.cuh.
//
// The epilogues, one per product (every value passes through them in fp32, in registers):
//   bias_gelu   c_fc forward: pre = acc + b1, h = GELU(pre). Writes BOTH pre and h (bf16).
//               h feeds c_proj; pre is kept for the backward's GELU'. We save pre rather than
//               recompute it: recomputing needs x·W1ᵀ again (one more GEMM, a sixth of the
//               step's FLOPs), and eager PyTorch keeps the same two tensors, so memory is unchanged.
//               In evaluation nothing reads pre: with c == nullptr the h-only policy
//               (bias_gelu_h_only, kernels/mlp_inference.cu) writes h alone, saving the 2·M·4C
//               bytes of pre (50 MB per layer at M = 16384, C = 384).
//   bias        c_proj forward: y = acc + b2 (or plain acc without bias; also used for dx).
//   dgelu       the backward's dh = dy·W2 GEMM: dpre = acc ⊙ GELU'(pre). Each thread reads pre
//               at its own accumulator positions: the first box's worth into registers and the
//               rest into L2 (prefetch) when the tile STARTS, so the latency hides behind the
//               tile's wgmmas; later boxes are loaded one box ahead. It also sums dpre down each
//               16-row slab (warp shuffles) and stores those column sums: db1 is then a small
//               reduction of M/16 rows, not a pass over the M x 4C dpre. (The default.)
//   dgelu_fast, dgelu_pre_tma_fast  (fast=1, session 5: the default, dgelu_fast on step 4) the two
//               above with a cheaper epilogue: GELU' in 8 operations, db1's sums by a spill-free
//               reduce-scatter, unguarded pre loads inside the matrix.
//   bias_gelu_fast, bias_gelu_h_only_fast  (fcfast=1, session 6, opt-in) c_fc's two policies with a
//               cheaper epilogue: GELU in 5 operations and a tanh, the bias of a box without per-column
//               checks; pre bit-identical, h within fp32 rounding of bias_gelu's.
//   bias_gelu_stmatrix  (fcfast=2, session 6, opt-in) bias_gelu_fast's values, staged by the policy
//               itself (gemm4's STORES_SLAB hook): stmatrix, and one fence per box for pre and h.
//   bias_gelu_deferred, bias_gelu_h_only_rounded  (fcfast=3 with fc=4, session 6, opt-in, step 4
//               only) c_fc with its epilogue moved under the next tile's first k-steps (gemm4's
//               DEFERS_STORE hook): pre = bf16(acc + b1) held as bf16 pairs at the tile's end, then
//               per box pre and h = GELU(bf16 pre) staged and stored while the tensor cores work;
//               the evaluation twin computes h from the bf16 pre too.
//   dgelu_parts, bias_gelu_parts  (fast=3, opt-in, and fcfast=4, session 7's default; kernels/mlp_deferred.cuh,
//               mlp_dgelu_deferred.cu, mlp_fc_deferred.cu) the dGELU and c_fc epilogues under the next
//               tile's math in half boxes, on step 4's tile; dGELU's pre by TMA into shared memory
//               ~10 k-steps ahead, dh held as bf16 pairs. fcfast=5: c_fc saves gelu'(pre) (bf16, from
//               the tanh it computes for h anyway) in place of pre, and the dGELU epilogue is one
//               product per value, dpre = dh·gelu'(pre) (the lead's idea, session 7; the default since
//               session 8: the backward is told which of the two its forward saved, mlp_bindings.cpp).
//               fcfast=9 (session 9, opt-in): fcfast=5's c_fc on a lean k-step (descriptors stepped, not
//               rebuilt: kernels/mlp_deferred.cuh); fcfast=10 (opt-in): the dGELU GEMM's too; fcfast=11 (the
//               default since session 10): 10 with dGELU's product one packed bf16x2 multiply a pair (no db1).
//   bias_deferred  (defer=1, session 6, opt-in, step 4 only) c_proj's and dx's bias policy with the
//               same deferral: bias added and values packed at the tile's end, stores under the
//               next tile's first k-steps; the same bf16 values as bias.
//   dgelu_pre_tma  (pre=1, opt-in) the same values as dgelu, but pre arrives by TMA.
//               Each consumer warp's lane 0 loads its tile's pre boxes into the warp's staging
//               buffers when the tile starts (gemm4's INPUT_BOXES), so they land during the
//               main loop; the epilogue reads pre from shared memory, writes dpre over it in place
//               and TMA-stores it. Its db1 sums use a reduce-scatter over the lanes sharing columns.
//   reduce_add  the weight gradients dW = Aᵀ·B contract over the tokens (16k-64k) but have only
//               72 output tiles for 132 SMs: the token range is split (split-K) and each
//               unit's fp32 partial tile is added into a zeroed dW by a TMA reduce-add store.
// GELU is the tanh form, evaluated with the tanh.approx.f32 instruction (relative error about
// 2^-11, below bf16's 2^-8 output precision; the H200 run matched float64 to 2e-3).
//
// Read in order: kernels/mlp_epilogues.cuh (GELU math, the policies), then this file's schedule
// dispatch and launchers, then kernels/mlp_pingpong.cuh (and its two .cu), kernels/mlp_inference.cu
// and kernels/mlp_finish.cu.
#include <algorithm>
#include <type_traits>
#include "mlp.h"
#include "mlp_epilogues.cuh"

namespace {
using namespace tk;
using wgmma::major;
using namespace tk_mlp::detail;
using cfg = step4_config;                    // 4 stages of K = 64, one group in flight (mlp_epilogues.cuh)
constexpr int BM = gemm4::BM, BN = gemm4::BN, BK = cfg::BK;

// ---- the schedule dispatch: step 4 here, step 5 in kernels/mlp_pingpong.cuh ------------------
int resolved_schedule(const tk_mlp::gemm_args& g, bool b_mn_major) {
    return g.schedule ? g.schedule : tk_mlp::auto_schedule(g.M, g.N, g.K, g.splits, b_mn_major, g.pre_tma != 0);
}

template <major MA, major MB, typename Epi>
const char* launch(const tk_mlp::gemm_args& g) {
    if (g.M <= 0 || g.N <= 0 || g.K <= 0) return "tk_mlp: empty GEMM";
    if (!tk_mlp::valid_schedule(g.schedule)) return "tk_mlp: schedule must be 0 (auto) or 4..10";
    const int schedule = resolved_schedule(g, MB == major::MN);
    constexpr bool inputs = gemm4::has_input_boxes<Epi>();
    auto make = [&] { return Epi::make(g); };
    if (schedule == tk_mlp::SCHEDULE_STEP4) {
        using Cfg = std::conditional_t<inputs, step4_inputs_config, cfg>;
        return gemm4::launch<Cfg, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, std::max(g.splits, 1),
                                               g.num_sms, g.stream, make);
    }
    if (schedule == tk_mlp::SCHEDULE_STEP4_CLUSTER2) {
        using Cfg = std::conditional_t<inputs, step4_inputs_cluster2_config, step4_cluster2_config>;
        return gemm4::launch<Cfg, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, std::max(g.splits, 1),
                                               g.num_sms, g.stream, make);
    }
    return launch_pingpong<MA, MB, Epi>(g, schedule);
}

// Session 6's deferred policies (bias_gelu_deferred for fcfast=3, bias_deferred for defer=1: their
// epilogue under the next tile's math) use step 4's DEFERS_STORE hook, so they run on step 4's
// kernel only (alone or in 2-CTA clusters).
template <major MB, typename Epi>
const char* launch_deferred(const tk_mlp::gemm_args& g, int schedule) {
    auto make = [&] { return Epi::make(g); };
    if (schedule == tk_mlp::SCHEDULE_STEP4_CLUSTER2)
        return gemm4::launch<step4_cluster2_config, major::K, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, 1,
                                                                      g.num_sms, g.stream, make);
    return gemm4::launch<cfg, major::K, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, 1, g.num_sms, g.stream, make);
}
bool on_step4(int schedule) { return schedule == tk_mlp::SCHEDULE_STEP4 || schedule == tk_mlp::SCHEDULE_STEP4_CLUSTER2; }
}  // namespace

namespace tk_mlp {

const char* linear_bias_gelu(const gemm_args& g) {
    if (!g.c2) return "tk_mlp: linear_bias_gelu needs the output h (c2)";
    if (!g.c) return linear_bias_gelu_h_only(g);     // evaluation: h only, no pre (kernels/mlp_inference.cu)
    if (g.fast_gelu == 5 || g.fast_gelu >= 9) {       // session 7: gelu'(pre) saved in place of pre, step 4 only;
        if (g.schedule != 0 && g.schedule != SCHEDULE_STEP4)   // 9, 10, 11 (the default since session 10) on the lean k-step
            return "tk_mlp: fcfast=5, 9, 10 and 11 (gelu'(pre) saved in place of pre) run c_fc and the dGELU GEMM on schedule 4 only";
        return linear_bias_gelu_parts(g);            // (kernels/mlp_fc_deferred.cu)
    }
    if (g.fast_gelu == 4 && valid_schedule(g.schedule)) {       // session 7 (the default): in half boxes on step 4's tile
        const int schedule = g.schedule ? g.schedule : fc_auto_schedule(g.M, g.N, g.K, g.splits, g.fast_gelu);
        if (schedule == SCHEDULE_STEP4) return linear_bias_gelu_parts(g);   // (kernels/mlp_fc_deferred.cu; elsewhere as 3)
    }
    if (g.fast_gelu >= 3 && valid_schedule(g.schedule)) {       // session 6, opt-in: deferred on step 4 (auto's choice for it)
        const int schedule = g.schedule ? g.schedule : fc_auto_schedule(g.M, g.N, g.K, g.splits, g.fast_gelu);
        if (on_step4(schedule)) return launch_deferred<major::K, bias_gelu_deferred_epilogue>(g, schedule);
    }
    if (g.fast_gelu >= 2) return launch<major::K, major::K, bias_gelu_stmatrix_epilogue>(g);   // session 6, opt-in
    return g.fast_gelu ? launch<major::K, major::K, bias_gelu_fast_epilogue>(g)                // session 6, opt-in
                       : launch<major::K, major::K, bias_gelu_epilogue>(g);
}
const char* linear_bias(const gemm_args& g) {
    if (g.defer_store && valid_schedule(g.schedule) && on_step4(resolved_schedule(g, false)))   // session 6's defer=1, opt-in
        return launch_deferred<major::K, bias_deferred_epilogue>(g, resolved_schedule(g, false));
    return launch<major::K, major::K, bias_epilogue>(g);
}
const char* linear_dgelu(const gemm_args& g) {
    if (!g.pre) return "tk_mlp: linear_dgelu needs pre";
    if (!g.bias_grad_partial && !g.fast_dgelu)       // session 5's fast policies may skip db1
        return "tk_mlp: linear_dgelu needs bias_grad_partial (only the fast policies run without)";
    const int schedule = resolved_schedule(g, true);
    if (g.fast_dgelu == 5) {                         // session 7's fcfast=5 (and 9, 10, 11): g.pre holds gelu'(pre)
        if (schedule != SCHEDULE_STEP4 || g.splits > 1)
            return "tk_mlp: fcfast=5, 9, 10 and 11 (gelu'(pre) saved in place of pre) run c_fc and the dGELU GEMM on schedule 4 only";
        return linear_dgelu_deferred(g);
    }
    if (g.fast_dgelu == 3 && schedule == SCHEDULE_STEP4 && g.splits <= 1)   // session 7, opt-in
        return linear_dgelu_deferred(g);             // (kernels/mlp_dgelu_deferred.cu; elsewhere as fast=1)
    const bool pre_tma = g.pre_tma && schedule != SCHEDULE_PINGPONG_128x128_CLUSTER2 && schedule != SCHEDULE_PINGPONG_64x256_DEEP;
    if (pre_tma)
        return g.fast_dgelu ? launch<major::K, major::MN, dgelu_pre_tma_fast_epilogue>(g)
                            : launch<major::K, major::MN, dgelu_pre_tma_epilogue>(g);
    return g.fast_dgelu ? launch<major::K, major::MN, dgelu_fast_epilogue>(g) : launch<major::K, major::MN, dgelu_epilogue>(g);
}
const char* linear_grad_input(const gemm_args& g) {
    if (g.defer_store && valid_schedule(g.schedule) && on_step4(resolved_schedule(g, true)))    // session 6's defer=1, opt-in
        return launch_deferred<major::MN, bias_deferred_epilogue>(g, resolved_schedule(g, true));
    return launch<major::K, major::MN, bias_epilogue>(g);
}
const char* weight_grad(const gemm_args& g) { return launch<major::MN, major::MN, reduce_add_epilogue>(g); }

// Split-K for few output tiles (engineer D's cost model from kernels/gemm.py): time ~ waves x
// (k-tiles per unit + the epilogue, worth ~3 k-tiles when it reduce-adds fp32); take the cheapest.
int choose_splits(int M, int N, int K, int num_sms, int schedule) {
    const bool t128 = schedule == SCHEDULE_PINGPONG_128x128 || schedule == SCHEDULE_PINGPONG_128x128_CLUSTER2;
    const int tm = t128 ? 128 : (schedule == SCHEDULE_PINGPONG_64x256 || schedule == SCHEDULE_PINGPONG_64x256_CLUSTER2 ||
                                 schedule == SCHEDULE_PINGPONG_64x256_DEEP) ? 64 : BM;
    const int tn = t128 ? 128 : BN;
    const int tiles = ((M + tm - 1) / tm) * ((N + tn - 1) / tn);
    const int k_tiles = (K + BK - 1) / BK;
    if (tiles >= 2 * num_sms || k_tiles < 16) return 1;
    int best = 1;
    double best_cost = 0;
    for (int s = 1; s <= std::min(16, k_tiles / 8); ++s) {
        const int waves = (tiles * s + num_sms - 1) / num_sms;
        const double cost = waves * (double(k_tiles) / s + (s > 1 ? 3 : 1));
        if (s == 1 || cost < best_cost - 1e-9) { best = s; best_cost = cost; }
    }
    return best;
}

}  // namespace tk_mlp

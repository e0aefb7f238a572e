// kernels/mlp_inference.cu — the evaluation forward's c_fc GEMM: h = GELU(x·W1ᵀ + b1) without
// the pre-activation pre. Training keeps pre for the backward's GELU' (kernels/mlp.cu, the
// bias_gelu epilogue); in evaluation (torch.no_grad, or nothing requires grad) nothing reads it,
// and writing it costs 2·M·4C bytes: 50 MB per layer at shakespeare's eval shape (M = 16384,
// C = 384), about 6% of an eval forward. kernels/mlp.cu's linear_bias_gelu comes here when its
// output c (pre) is nullptr; the epilogue policy is bias_gelu_h_only (kernels/mlp_epilogues.cuh),
// whose values are the same float operations as bias_gelu's h, so h (and y) are bit-identical to
// the training forward's.
// The same schedule choice as every other MLP GEMM (kernels/mlp.h: SCHEDULE_AUTO picks ping-pong
// 64x256 for c_fc's shape; a forced schedule runs as forced), in a file of its own so the
// training kernels and their compile checks are untouched and nvcc builds these in parallel.
// With gemm_args::fast_gelu (fcfast=1 or 2, session 6) the policy is bias_gelu_h_only_fast, whose h
// is bias_gelu_fast's (and bias_gelu_stmatrix's); with fcfast=3 on step 4, bias_gelu_h_only_rounded,
// whose h starts from the bf16 pre as bias_gelu_deferred's does: each training policy has its
// evaluation twin, so y stays bit-identical.
// Read after kernels/mlp.cu and kernels/mlp_pingpong.cu.
#include <algorithm>
#include "mlp.h"
#include "mlp_epilogues.cuh"
#include "gemm_5_pingpong.cuh"

namespace tk_mlp::detail {

namespace {
template <typename Epi>
const char* launch_h_only(const gemm_args& g) {
    if (g.M <= 0 || g.N <= 0 || g.K <= 0) return "tk_mlp: empty GEMM";
    if (!valid_schedule(g.schedule)) return "tk_mlp: schedule must be 0 (auto) or 4..10";
    const int schedule = g.schedule ? g.schedule : auto_schedule(g.M, g.N, g.K, g.splits, /*b_mn_major=*/false);
    const int splits = std::max(g.splits, 1);
    auto make = [&] { return Epi::make(g); };
    switch (schedule) {
    case SCHEDULE_STEP4:
        return gemm4::launch<step4_config, major::K, major::K, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                    g.num_sms, g.stream, make);
    case SCHEDULE_STEP4_CLUSTER2:
        return gemm4::launch<step4_cluster2_config, major::K, major::K, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                             g.num_sms, g.stream, make);
    case SCHEDULE_PINGPONG_128x128:
        return gemm5::launch<gemm5::pingpong_128x128, major::K, major::K, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K,
                                                                               splits, g.num_sms, g.stream, make);
    case SCHEDULE_PINGPONG_64x256:
        return gemm5::launch<gemm5::pingpong_64x256, major::K, major::K, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K,
                                                                              splits, g.num_sms, g.stream, make);
    case SCHEDULE_PINGPONG_128x128_CLUSTER2:
        return gemm5::launch<gemm5::pingpong_128x128_cluster2, major::K, major::K, Epi>(
            "tk_mlp", g.a, g.b, g.M, g.N, g.K, splits, g.num_sms, g.stream, make);
    case SCHEDULE_PINGPONG_64x256_CLUSTER2:
        return gemm5::launch<gemm5::pingpong_64x256_cluster2, major::K, major::K, Epi>(
            "tk_mlp", g.a, g.b, g.M, g.N, g.K, splits, g.num_sms, g.stream, make);
    case SCHEDULE_PINGPONG_64x256_DEEP:
        return gemm5::launch<gemm5::pingpong_64x256_deep, major::K, major::K, Epi>(
            "tk_mlp", g.a, g.b, g.M, g.N, g.K, splits, g.num_sms, g.stream, make);
    }
    return "tk_mlp: unknown schedule";
}
}  // namespace

const char* linear_bias_gelu_h_only(const gemm_args& g) {
    if (g.fast_gelu >= 3) {                         // session 6's fcfast=3 (and session 7's fcfast=4, its values):
                                                    // h from the bf16 pre where training defers
        gemm_args step4 = g;                        // (auto: step 4, as linear_bias_gelu picks for it)
        step4.schedule = g.schedule ? g.schedule : fc_auto_schedule(g.M, g.N, g.K, g.splits, g.fast_gelu);
        if (step4.schedule == SCHEDULE_STEP4 || step4.schedule == SCHEDULE_STEP4_CLUSTER2)
            return launch_h_only<bias_gelu_h_only_rounded_epilogue>(step4);
    }
    return g.fast_gelu ? launch_h_only<bias_gelu_h_only_fast_epilogue>(g)     // session 6's fcfast=1, 2
                       : launch_h_only<bias_gelu_h_only_epilogue>(g);
}

}  // namespace tk_mlp::detail

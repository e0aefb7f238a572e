// kernels/mlp_pingpong.cuh — the MLP's launcher for step 5's ping-pong schedule
// (launch_pingpong: which gemm5 configuration runs a product, by schedule), shared by the two
// translation units that instantiate it: kernels/mlp_pingpong.cu (sessions 3-4's policies) and
// kernels/mlp_pingpong_gelu_grad.cu (session 5's), split so nvcc builds them in parallel. A policy with
// input boxes (dgelu_pre_tma and its forms, pre=1) needs a staging buffer per box, so it runs on
// gemm5's *_inputs configurations and only on schedules that have one (5, 6, 8); mlp.cu's
// linear_dgelu keeps schedules 7 and 10 on the per-thread-load policies.
#pragma once
#include <algorithm>
#include "mlp.h"
#include "mlp_epilogues.cuh"
#include "gemm_5_pingpong.cuh"

namespace tk_mlp::detail {

template <major MA, major MB, typename Epi>
const char* launch_pingpong(const gemm_args& g, int schedule) {
    auto make = [&] { return Epi::make(g); };
    const int splits = std::max(g.splits, 1);
    if constexpr (gemm4::has_input_boxes<Epi>()) {   // a staging buffer per box: the *_inputs configurations
        if (schedule == SCHEDULE_PINGPONG_128x128)
            return gemm5::launch<gemm5::pingpong_128x128_inputs, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                              g.num_sms, g.stream, make);
        if (schedule == SCHEDULE_PINGPONG_64x256)
            return gemm5::launch<gemm5::pingpong_64x256_inputs, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                             g.num_sms, g.stream, make);
        if (schedule == SCHEDULE_PINGPONG_64x256_CLUSTER2)
            return gemm5::launch<gemm5::pingpong_64x256_cluster2_inputs, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K,
                                                                                      splits, g.num_sms, g.stream, make);
        return "tk_mlp: input-box epilogues (pre by TMA) run on schedules 4, 5, 6, 8 and 9 only";
    } else {
        if (schedule == SCHEDULE_PINGPONG_128x128)
            return gemm5::launch<gemm5::pingpong_128x128, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                       g.num_sms, g.stream, make);
        if (schedule == SCHEDULE_PINGPONG_64x256)
            return gemm5::launch<gemm5::pingpong_64x256, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                      g.num_sms, g.stream, make);
        if (schedule == SCHEDULE_PINGPONG_128x128_CLUSTER2)
            return gemm5::launch<gemm5::pingpong_128x128_cluster2, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                                g.num_sms, g.stream, make);
        if (schedule == SCHEDULE_PINGPONG_64x256_CLUSTER2)
            return gemm5::launch<gemm5::pingpong_64x256_cluster2, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                               g.num_sms, g.stream, make);
        if (schedule == SCHEDULE_PINGPONG_64x256_DEEP)
            return gemm5::launch<gemm5::pingpong_64x256_deep, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, splits,
                                                                           g.num_sms, g.stream, make);
        return "tk_mlp: unknown ping-pong schedule";
    }
}

}  // namespace tk_mlp::detail

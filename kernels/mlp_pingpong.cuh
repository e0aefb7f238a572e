// kernels/mlp_pingpong.cuh — the MLP's launcher for step 5's ping-pong schedule
// (launch_pingpong: which gemm5 configuration runs a product, by schedule), shared by the two
// translation units that instantiate it: kernels/mlp_pingpong.cu (sessions 3-4's policies) and
// kernels/mlp_pingpong_gelu_grad.cu (session 5's), split so nvcc builds them in parallel. A policy with
// input boxes (dgelu_pre_tma and its forms, pre=1) needs a staging buffer per box, so it runs on
// gemm5's *_inputs configurations and only on schedules that have one (5, 6, 8); mlp.cu's
// linear_dgelu keeps schedules 7 and 10 on the per-thread-load policies.
#pragma once
#include <algorithm>
#include <type_traits>
#include "mlp.h"
#include "mlp_epilogues.cuh"
#include "gemm_5_pingpong.cuh"

namespace tk_mlp::detail {

template <major MA, major MB, typename Epi>
const char* launch_pingpong(const gemm_args& g, int schedule) {
    // run(tag): gemm5::launch on the configuration the tag names (std::type_identity<Config>)
    auto run = [&](auto config) {
        using Config = typename decltype(config)::type;
        return gemm5::launch<Config, MA, MB, Epi>("tk_mlp", g.a, g.b, g.M, g.N, g.K, std::max(g.splits, 1),
                                                  g.num_sms, g.stream, [&] { return Epi::make(g); });
    };
    using std::type_identity;
    if constexpr (gemm4::has_input_boxes<Epi>()) {   // a staging buffer per box: the *_inputs configurations
        if (schedule == SCHEDULE_PINGPONG_128x128) return run(type_identity<gemm5::pingpong_128x128_inputs>{});
        if (schedule == SCHEDULE_PINGPONG_64x256) return run(type_identity<gemm5::pingpong_64x256_inputs>{});
        if (schedule == SCHEDULE_PINGPONG_64x256_CLUSTER2) return run(type_identity<gemm5::pingpong_64x256_cluster2_inputs>{});
        return "tk_mlp: input-box epilogues (pre by TMA) run on schedules 4, 5, 6, 8 and 9 only";
    } else {
        if (schedule == SCHEDULE_PINGPONG_128x128) return run(type_identity<gemm5::pingpong_128x128>{});
        if (schedule == SCHEDULE_PINGPONG_64x256) return run(type_identity<gemm5::pingpong_64x256>{});
        if (schedule == SCHEDULE_PINGPONG_128x128_CLUSTER2) return run(type_identity<gemm5::pingpong_128x128_cluster2>{});
        if (schedule == SCHEDULE_PINGPONG_64x256_CLUSTER2) return run(type_identity<gemm5::pingpong_64x256_cluster2>{});
        if (schedule == SCHEDULE_PINGPONG_64x256_DEEP) return run(type_identity<gemm5::pingpong_64x256_deep>{});
        return "tk_mlp: unknown ping-pong schedule";
    }
}

}  // namespace tk_mlp::detail

// kernels/mlp_pingpong_gelu_fast.cu — session 6's c_fc epilogue (fcfast=1, opt-in: bias_gelu_fast,
// GELU in 5 operations and the bias of a box without per-column checks; kernels/mlp_epilogues.cuh
// says why) on step 5's ping-pong schedule (the launcher: kernels/mlp_pingpong.cuh). A file of its
// own so nvcc builds these kernels in parallel with kernels/mlp_pingpong.cu's and
// kernels/mlp_pingpong_gelu_grad.cu's. Read after those two.
#include "mlp_pingpong.cuh"

namespace tk_mlp::detail {

template const char* launch_pingpong<major::K, major::K, bias_gelu_fast_epilogue>(const gemm_args&, int);

}  // namespace tk_mlp::detail

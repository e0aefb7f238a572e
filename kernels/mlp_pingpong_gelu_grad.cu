// kernels/mlp_pingpong_gelu_grad.cu — the GELU-gradient epilogue policies added in session 5, on step 5's ping-pong schedule
// (the launcher: kernels/mlp_pingpong.cuh): the fast dGELU forms (fast=1), the dGELU that
// multiplies by a saved GELU'(pre) (gprime=1) and c_fc saving it. A file of its own so nvcc
// builds these kernels in parallel with kernels/mlp_pingpong.cu's.
#include "mlp_pingpong.cuh"

namespace tk_mlp::detail {

template const char* launch_pingpong<major::K, major::MN, dgelu_fast_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::MN, dgelu_saved_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::MN, dgelu_pre_tma_saved_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::K, bias_gelu_gprime_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::MN, dgelu_pre_tma_fast_epilogue>(const gemm_args&, int);

}  // namespace tk_mlp::detail

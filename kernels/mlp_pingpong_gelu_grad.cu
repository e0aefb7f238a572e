// kernels/mlp_pingpong_gelu_grad.cu — the fast dGELU epilogue policies of session 5 (fast=1, the
// default) on step 5's ping-pong schedule (the launcher: kernels/mlp_pingpong.cuh). A file of its
// own so nvcc builds these kernels in parallel with kernels/mlp_pingpong.cu's. (Session 5's
// gprime=1 policies, c_fc saving GELU'(pre) and a dGELU multiplying by it, lost on the H200 and
// were removed: kernels/NOTES.md, "Session 5: M".)
#include "mlp_pingpong.cuh"

namespace tk_mlp::detail {

template const char* launch_pingpong<major::K, major::MN, dgelu_fast_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::MN, dgelu_pre_tma_fast_epilogue>(const gemm_args&, int);

}  // namespace tk_mlp::detail

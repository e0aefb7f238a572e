// kernels/mlp_pingpong.cu — the MLP's five GEMMs on step 5's ping-pong schedule
// (kernels/gemm_5_pingpong.cuh) with the MLP's epilogue policies (kernels/mlp_epilogues.cuh):
// the instantiations of sessions 3-4's policies. kernels/mlp.cu dispatches here when a GEMM's
// schedule is one of the PINGPONG_* (kernels/mlp.h); the launcher itself is in
// kernels/mlp_pingpong.cuh, session 5's policies in kernels/mlp_pingpong_gelu_grad.cu (a file of its own
// so nvcc builds them in parallel).
#include "mlp_pingpong.cuh"

namespace tk_mlp::detail {

// The five products (operand layouts as in kernels/mlp.cu's launchers).
template const char* launch_pingpong<major::K, major::K, bias_gelu_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::K, bias_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::MN, dgelu_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::MN, dgelu_pre_tma_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::MN, bias_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::MN, major::MN, reduce_add_epilogue>(const gemm_args&, int);

}  // namespace tk_mlp::detail

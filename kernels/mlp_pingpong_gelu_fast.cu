// kernels/mlp_pingpong_gelu_fast.cu — session 6's c_fc epilogues (opt-in; kernels/mlp_epilogues.cuh
// says why): fcfast=1, bias_gelu_fast (GELU in 5 operations, the bias of a box without per-column
// checks), and fcfast=2, bias_gelu_stmatrix (the same values staged by stmatrix, one fence per box)
// on step 5's ping-pong schedule (the launcher: kernels/mlp_pingpong.cuh). A file of its
// own so nvcc builds these kernels in parallel with kernels/mlp_pingpong.cu's and
// kernels/mlp_pingpong_gelu_grad.cu's. Read after those two.
#include "mlp_pingpong.cuh"

namespace tk_mlp::detail {

template const char* launch_pingpong<major::K, major::K, bias_gelu_fast_epilogue>(const gemm_args&, int);
template const char* launch_pingpong<major::K, major::K, bias_gelu_stmatrix_epilogue>(const gemm_args&, int);   // fcfast=2

}  // namespace tk_mlp::detail

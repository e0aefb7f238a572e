// kernels/gemm_bindings.cpp — the torch side of the GEMM steps: checks what C++ must not get
// wrong (device, dtype, sizes, contiguity as promised), then calls the plain launcher of one step
// (kernels/gemm_<n>_*.cu via kernels/gemm.cuh). kernels/gemm.py decides layouts and split-K.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include "gemm.cuh"

namespace {

// a: [M][K] (or [K][M] storage when a_mn_major), b: [N][K] (or [K][N] when b_mn_major), both
// contiguous bf16; c: [M][N] contiguous, bf16 or fp32 (zeroed by the caller when splits > 1).
void run(int64_t step, const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, bool a_mn_major,
         bool b_mn_major, const c10::optional<torch::Tensor>& bias, bool gelu, int64_t splits, int64_t variant) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda(), "gemm: a, b and c must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kBFloat16 && b.scalar_type() == torch::kBFloat16, "gemm: a and b must be bfloat16");
    TORCH_CHECK(c.scalar_type() == torch::kBFloat16 || c.scalar_type() == torch::kFloat32, "gemm: c must be bfloat16 or float32");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "gemm: a, b, c must be 2-D");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(), "gemm: a, b, c must be contiguous");
    const int64_t M = c.size(0), N = c.size(1);
    const int64_t K = a_mn_major ? a.size(0) : a.size(1);
    TORCH_CHECK((a_mn_major ? a.size(1) : a.size(0)) == M, "gemm: a does not have M rows");
    TORCH_CHECK((b_mn_major ? b.size(1) : b.size(0)) == N && (b_mn_major ? b.size(0) : b.size(1)) == K,
                "gemm: b does not match K x N");
    TORCH_CHECK(N % 16 == 0 && K % 16 == 0, "gemm: N and K must be multiples of 16");
    TORCH_CHECK(M > 0 && M < (1ll << 31) && N < (1ll << 31) && K < (1ll << 31), "gemm: sizes out of range");
    const void* bias_ptr = nullptr;
    if (bias && bias->defined()) {
        TORCH_CHECK(bias->is_cuda() && bias->scalar_type() == torch::kBFloat16 && bias->is_contiguous() &&
                    bias->numel() == N, "gemm: bias must be a contiguous bfloat16 CUDA vector of length N");
        bias_ptr = bias->data_ptr();
    }
    const c10::cuda::CUDAGuard guard(a.device());
    int num_sms = 0;
    cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, a.device().index());
    gemm::args g{a.data_ptr(), b.data_ptr(), c.data_ptr(), int(M), int(N), int(K), a_mn_major, b_mn_major,
                 c.scalar_type() == torch::kFloat32, bias_ptr, gelu, int(splits),
                 num_sms, int(variant), c10::cuda::getCurrentCUDAStream().stream()};
    const char* err = nullptr;
    switch (step) {
        case 1: err = gemm::step1_warp_mma(g); break;
        case 2: err = gemm::step2_cp_async(g); break;
        case 3: err = gemm::step3_wgmma_tma(g); break;
        case 4: err = gemm::step4_warp_specialized(g); break;
        case 5: err = gemm::step5_pingpong(g); break;
        default: TORCH_CHECK(false, "gemm: step must be 1..5");
    }
    TORCH_CHECK(err == nullptr, err ? err : "");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("run", &run, "C = A·B with one GEMM step (see kernels/gemm.py)");
}

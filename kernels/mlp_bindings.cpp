// kernels/mlp_bindings.cpp — the torch side of the tk_mlp extension: checks every input (a bad
// call is a Python ValueError/TypeError naming the argument, never a crash or garbage),
// allocates the outputs, and runs the GEMMs of kernels/mlp.cu in order.
// Read after kernels/mlp_op.py (which calls `forward` and `backward` from its custom ops).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "mlp.h"

namespace {

using at::Tensor;

// A bf16 CUDA matrix of the given shape (-1: any), contiguous and 16-byte aligned (TMA reads it).
void check_matrix(const Tensor& t, const char* name, int64_t rows, int64_t cols, const Tensor& x) {
    TORCH_CHECK_VALUE(t.defined(), "tk_mlp: ", name, " is missing");
    TORCH_CHECK_VALUE(t.is_cuda(), "tk_mlp: ", name, " must be a CUDA tensor, got one on ", t.device());
    if (x.defined())
        TORCH_CHECK_VALUE(t.device() == x.device(), "tk_mlp: ", name, " is on ", t.device(), " but x is on ", x.device());
    TORCH_CHECK_TYPE(t.scalar_type() == at::kBFloat16, "tk_mlp: ", name, " must be bfloat16, got ", t.scalar_type(),
                     " (run under torch.autocast(dtype=torch.bfloat16) or cast it)");
    TORCH_CHECK_VALUE(t.dim() == 2, "tk_mlp: ", name, " must be a 2-D matrix, got shape ", t.sizes(),
                      " (flatten the batch and time dimensions first)");
    TORCH_CHECK_VALUE((rows < 0 || t.size(0) == rows) && (cols < 0 || t.size(1) == cols), "tk_mlp: ", name,
                      " must have shape (", rows, ", ", cols, ") (-1: any size), got ", t.sizes());
    TORCH_CHECK_VALUE(t.is_contiguous(), "tk_mlp: ", name, " must be contiguous (call .contiguous())");
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "tk_mlp: ", name,
                      " must start 16-byte aligned (pass a fresh tensor, not a view at an odd offset)");
}

void check_bias(const c10::optional<Tensor>& b, const char* name, int64_t n, const Tensor& x) {
    if (!b || !b->defined()) return;
    TORCH_CHECK_VALUE(b->is_cuda() && b->device() == x.device(), "tk_mlp: ", name, " must be on x's device ", x.device());
    TORCH_CHECK_TYPE(b->scalar_type() == at::kBFloat16, "tk_mlp: ", name, " must be bfloat16, got ", b->scalar_type());
    TORCH_CHECK_VALUE(b->dim() == 1 && b->size(0) == n, "tk_mlp: ", name, " must have shape (", n, ",), got ", b->sizes());
    TORCH_CHECK_VALUE(b->is_contiguous(), "tk_mlp: ", name, " must be contiguous");
}

// x [M][C], w_fc [H][C], w_proj [C][H]: the sizes every call shares.
void check_sizes(int64_t M, int64_t C, int64_t H) {
    TORCH_CHECK_VALUE(M >= 1 && M < (int64_t(1) << 31), "tk_mlp: x must have between 1 and 2^31-1 rows (tokens), got ", M);
    TORCH_CHECK_VALUE(C % 64 == 0 && C >= 64, "tk_mlp: the embedding size (x's last dimension) must be a positive multiple of 64, got ", C);
    TORCH_CHECK_VALUE(H % 64 == 0 && H >= 64, "tk_mlp: the hidden size (w_fc's first dimension) must be a positive multiple of 64, got ", H);
}

tk_mlp::gemm_args base_args(const Tensor& x) {
    tk_mlp::gemm_args g{};
    cudaDeviceGetAttribute(&g.num_sms, cudaDevAttrMultiProcessorCount, x.device().index());
    g.splits = 1;
    g.stream = c10::cuda::getCurrentCUDAStream().stream();
    return g;
}

void check_launch(const char* err, const char* what) {
    TORCH_CHECK(err == nullptr, "tk_mlp: ", what, " failed: ", err ? err : "");
}

const void* ptr_or_null(const c10::optional<Tensor>& t) { return t && t->defined() ? t->data_ptr() : nullptr; }

// Returns [y, pre, h]: pre = x·w_fcᵀ + b_fc, h = GELU(pre), y = h·w_projᵀ + b_proj.
std::vector<Tensor> forward(const Tensor& x, const Tensor& w_fc, const c10::optional<Tensor>& b_fc,
                            const Tensor& w_proj, const c10::optional<Tensor>& b_proj) {
    check_matrix(x, "x", -1, x.dim() == 2 ? x.size(1) : -1, Tensor());
    const int64_t M = x.size(0), C = x.size(1);
    check_matrix(w_fc, "w_fc", -1, C, x);
    const int64_t H = w_fc.size(0);
    check_sizes(M, C, H);
    check_matrix(w_proj, "w_proj", C, H, x);
    check_bias(b_fc, "b_fc", H, x);
    check_bias(b_proj, "b_proj", C, x);
    const c10::cuda::CUDAGuard guard(x.device());

    Tensor pre = at::empty({M, H}, x.options()), h = at::empty({M, H}, x.options()), y = at::empty({M, C}, x.options());
    tk_mlp::gemm_args g = base_args(x);
    g.a = x.data_ptr(); g.b = w_fc.data_ptr(); g.c = pre.data_ptr(); g.c2 = h.data_ptr();
    g.M = int(M); g.N = int(H); g.K = int(C); g.bias = ptr_or_null(b_fc);
    check_launch(tk_mlp::linear_bias_gelu(g), "c_fc forward (x·w_fcᵀ + b_fc, GELU)");

    g = base_args(x);
    g.a = h.data_ptr(); g.b = w_proj.data_ptr(); g.c = y.data_ptr();
    g.M = int(M); g.N = int(C); g.K = int(H); g.bias = ptr_or_null(b_proj);
    check_launch(tk_mlp::linear_bias(g), "c_proj forward (h·w_projᵀ + b_proj)");
    return {y, pre, h};
}

// dW = Aᵀ·B over the tokens, split-K into fp32, returned in bf16 (the weights' dtype here).
Tensor weight_grad(const Tensor& a, const Tensor& b, const Tensor& x, const char* what) {
    const int64_t tokens = a.size(0), M = a.size(1), N = b.size(1);
    Tensor dw = at::zeros({M, N}, x.options().dtype(at::kFloat));
    tk_mlp::gemm_args g = base_args(x);
    g.a = a.data_ptr(); g.b = b.data_ptr(); g.c = dw.data_ptr();
    g.M = int(M); g.N = int(N); g.K = int(tokens);
    g.splits = tk_mlp::choose_splits(g.M, g.N, g.K, g.num_sms);
    check_launch(tk_mlp::weight_grad(g), what);
    return dw.to(at::kBFloat16);
}

// Returns [dx, dw_fc, db_fc, dw_proj, db_proj] (all bf16).
std::vector<Tensor> backward(const Tensor& dy, const Tensor& x, const Tensor& pre, const Tensor& h,
                             const Tensor& w_fc, const Tensor& w_proj) {
    check_matrix(x, "x", -1, x.dim() == 2 ? x.size(1) : -1, Tensor());
    const int64_t M = x.size(0), C = x.size(1);
    check_matrix(w_fc, "w_fc", -1, C, x);
    const int64_t H = w_fc.size(0);
    check_sizes(M, C, H);
    check_matrix(w_proj, "w_proj", C, H, x);
    check_matrix(dy, "dy", M, C, x);
    check_matrix(pre, "pre", M, H, x);
    check_matrix(h, "h", M, H, x);
    const c10::cuda::CUDAGuard guard(x.device());

    // dpre = (dy·w_proj) ⊙ GELU'(pre), with db_fc's partial column sums per 16 rows
    Tensor dpre = at::empty({M, H}, x.options());
    Tensor partial = at::empty({(M + 15) / 16, H}, x.options().dtype(at::kFloat));
    tk_mlp::gemm_args g = base_args(x);
    g.a = dy.data_ptr(); g.b = w_proj.data_ptr(); g.c = dpre.data_ptr();
    g.M = int(M); g.N = int(H); g.K = int(C); g.pre = pre.data_ptr(); g.bias_grad_partial = partial.data_ptr<float>();
    check_launch(tk_mlp::linear_dgelu(g), "dGELU (dy·w_proj ⊙ GELU'(pre))");

    // dx = dpre·w_fc
    Tensor dx = at::empty({M, C}, x.options());
    g = base_args(x);
    g.a = dpre.data_ptr(); g.b = w_fc.data_ptr(); g.c = dx.data_ptr();
    g.M = int(M); g.N = int(C); g.K = int(H);
    check_launch(tk_mlp::linear_grad_input(g), "dx (dpre·w_fc)");

    Tensor dw_proj = weight_grad(dy, h, x, "dw_proj (dyᵀ·h)");
    Tensor dw_fc = weight_grad(dpre, x, x, "dw_fc (dpreᵀ·x)");
    Tensor db_fc = partial.sum(0).to(at::kBFloat16);
    Tensor db_proj = dy.sum(0, /*keepdim=*/false, at::kFloat).to(at::kBFloat16);
    return {dx, dw_fc, db_fc, dw_proj, db_proj};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk MLP: c_fc -> GELU(tanh) -> c_proj on fused-epilogue GEMMs (kernels/mlp.cu)";
    m.def("forward", &forward, "y, pre, h = forward(x, w_fc, b_fc|None, w_proj, b_proj|None)",
          py::arg("x"), py::arg("w_fc"), py::arg("b_fc"), py::arg("w_proj"), py::arg("b_proj"));
    m.def("backward", &backward, "dx, dw_fc, db_fc, dw_proj, db_proj = backward(dy, x, pre, h, w_fc, w_proj)",
          py::arg("dy"), py::arg("x"), py::arg("pre"), py::arg("h"), py::arg("w_fc"), py::arg("w_proj"));
}

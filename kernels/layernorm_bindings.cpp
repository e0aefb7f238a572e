// kernels/layernorm_bindings.cpp: the torch side of the tk_layernorm extension. Checks every
// input (a bad call is a Python ValueError/TypeError naming the argument, never a crash or
// garbage), allocates the outputs, and calls the plain C++ launchers of layernorm.cu.
// Read after kernels/layernorm.py (which calls `forward` and `backward` from its custom ops).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "layernorm.h"

namespace {

using at::Tensor;

// "[16, 768]". Written out by hand: on the H200 (torch 2.11) streaming t.sizes() into a
// TORCH_CHECK message crashed the process instead of raising; dtypes and devices stream fine.
std::string shape_of(const Tensor& t) {
    std::string s = "[";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
    return s + "]";
}

tk_layernorm::DType dtype_of(const Tensor& t) {
    return t.scalar_type() == at::kBFloat16 ? tk_layernorm::DType::bf16 : tk_layernorm::DType::f32;
}

// An activation: a CUDA tensor on `like`'s device with `like`'s dtype and shape, contiguous and
// 16-byte aligned (the kernel moves 16-byte vectors). `like` undefined: check `t` as the first.
void check_activation(const Tensor& t, const char* name, const Tensor& like, const char* like_name = "") {
    TORCH_CHECK_VALUE(t.defined(), "tk_layernorm: ", name, " is missing");
    TORCH_CHECK_VALUE(t.is_cuda(), "tk_layernorm: ", name, " must be a CUDA tensor, got one on ", t.device());
    TORCH_CHECK_TYPE(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat,
                     "tk_layernorm: ", name, " must be bfloat16 or float32, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.is_contiguous(), "tk_layernorm: ", name, " must be contiguous (call .contiguous())");
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
                      "tk_layernorm: ", name, " must start 16-byte aligned (pass a fresh tensor, not a view at an odd offset)");
    if (like.defined()) {
        TORCH_CHECK_VALUE(t.device() == like.device(), "tk_layernorm: ", name, " is on ", t.device(), " but ", like_name, " is on ", like.device());
        TORCH_CHECK_TYPE(t.scalar_type() == like.scalar_type(), "tk_layernorm: ", name, " is ", t.scalar_type(),
                         " but ", like_name, " is ", like.scalar_type(), " (cast one of them)");
        TORCH_CHECK_VALUE(t.sizes() == like.sizes(), "tk_layernorm: ", name, " has shape ", shape_of(t), " but ", like_name, " has ", shape_of(like));
    } else {
        TORCH_CHECK_VALUE(t.dim() >= 1, "tk_layernorm: ", name, " must have at least one dimension");
        const int64_t cols = t.size(-1);
        TORCH_CHECK_VALUE(cols % 64 == 0 && cols >= 64 && cols <= tk_layernorm::MAX_COLS, "tk_layernorm: ", name,
                          "'s last dimension (the hidden size) must be a multiple of 64 between 64 and ",
                          tk_layernorm::MAX_COLS, ", got ", cols);
    }
}

// weight or bias: a (cols,) tensor on x's device, bfloat16 or float32 (the kernel reads either;
// bias must match weight). Returned contiguous (a no-op for parameters, which always are).
Tensor check_param(const Tensor& p, const char* name, const Tensor& x, const Tensor& weight) {
    TORCH_CHECK_VALUE(p.defined(), "tk_layernorm: ", name, " is missing");
    TORCH_CHECK_VALUE(p.device() == x.device(), "tk_layernorm: ", name, " is on ", p.device(), " but x is on ", x.device());
    TORCH_CHECK_TYPE(p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kFloat,
                     "tk_layernorm: ", name, " must be bfloat16 or float32, got ", p.scalar_type());
    TORCH_CHECK_TYPE(!weight.defined() || p.scalar_type() == weight.scalar_type(), "tk_layernorm: ", name, " is ",
                     p.scalar_type(), " but weight is ", weight.scalar_type(), " (cast one of them)");
    TORCH_CHECK_VALUE(p.dim() == 1 && p.size(0) == x.size(-1), "tk_layernorm: ", name, " must have shape (",
                      x.size(-1), ",), got ", shape_of(p));
    return p.contiguous();
}

void check_stats(const Tensor& t, const char* name, const Tensor& h) {
    TORCH_CHECK_VALUE(t.defined() && t.is_cuda() && t.device() == h.device(), "tk_layernorm: ", name,
                      " must be a CUDA tensor on h's device");
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "tk_layernorm: ", name, " must be float32, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.is_contiguous() && t.numel() * h.size(-1) == h.numel(), "tk_layernorm: ", name,
                      " must be contiguous with one value per row of h (", h.numel() / h.size(-1), "), got ", shape_of(t));
}

void check_launch(cudaError_t err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, "tk_layernorm: ", what, " launch failed: ", cudaGetErrorString(err));
}

// Returns [y, h, mean, rstd]; h is None when residual is None (then h is x itself).
std::vector<Tensor> forward(const Tensor& x, const c10::optional<Tensor>& residual, const Tensor& weight,
                            const c10::optional<Tensor>& bias, double eps) {
    check_activation(x, "x", Tensor());
    if (residual) check_activation(*residual, "residual", x, "x");
    TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "tk_layernorm: eps must be finite and >= 0, got ", eps);
    c10::cuda::CUDAGuard guard(x.device());
    const Tensor w = check_param(weight, "weight", x, Tensor());
    const Tensor b = bias ? check_param(*bias, "bias", x, w) : Tensor();

    Tensor y = at::empty_like(x);
    Tensor h = residual ? at::empty_like(x) : Tensor();
    auto stats_shape = x.sizes().vec();
    stats_shape.pop_back();
    Tensor mean = at::empty(stats_shape, x.options().dtype(at::kFloat));
    Tensor rstd = at::empty(stats_shape, x.options().dtype(at::kFloat));

    tk_layernorm::ForwardArgs a{};
    a.x = x.data_ptr();
    a.residual = residual ? residual->data_ptr() : nullptr;
    a.weight = w.data_ptr();
    a.bias = b.defined() ? b.data_ptr() : nullptr;
    a.params_bf16 = w.scalar_type() == at::kBFloat16;
    a.y = y.data_ptr();
    a.h = h.defined() ? h.data_ptr() : nullptr;
    a.mean = mean.data_ptr<float>();
    a.rstd = rstd.data_ptr<float>();
    a.cols = int(x.size(-1));
    a.rows = x.numel() / a.cols;
    a.eps = float(eps);
    a.dtype = dtype_of(x);
    check_launch(tk_layernorm::forward(a, c10::cuda::getCurrentCUDAStream().stream()), "forward");
    return {y, h, mean, rstd};
}

// Returns [dh_out, dweight, dbias] (dweight, dbias in weight's dtype). dh may be None.
std::vector<Tensor> backward(const Tensor& dy, const c10::optional<Tensor>& dh, const Tensor& h, const Tensor& mean,
                             const Tensor& rstd, const Tensor& weight) {
    check_activation(h, "h", Tensor());
    check_activation(dy, "dy", h, "h");
    if (dh) check_activation(*dh, "dh", h, "h");
    check_stats(mean, "mean", h);
    check_stats(rstd, "rstd", h);
    c10::cuda::CUDAGuard guard(h.device());
    const Tensor w = check_param(weight, "weight", h, Tensor());

    tk_layernorm::BackwardArgs a{};
    a.cols = int(h.size(-1));
    a.rows = h.numel() / a.cols;
    a.dtype = dtype_of(h);
    Tensor dh_out = at::empty_like(h);
    // Every column is written by the column-sum kernel; with no rows there is no launch, so zeros.
    Tensor dw = a.rows ? at::empty_like(w) : at::zeros_like(w);
    Tensor db = a.rows ? at::empty_like(w) : at::zeros_like(w);
    const int blocks = tk_layernorm::backward_partial_blocks(a.rows, a.cols, a.dtype);
    Tensor partial = at::empty({std::max(blocks, 1), 2, a.cols}, h.options().dtype(at::kFloat));

    a.dy = dy.data_ptr();
    a.dh = dh ? dh->data_ptr() : nullptr;
    a.h = h.data_ptr();
    a.mean = mean.data_ptr<float>();
    a.rstd = rstd.data_ptr<float>();
    a.weight = w.data_ptr();
    a.params_bf16 = w.scalar_type() == at::kBFloat16;
    a.dh_out = dh_out.data_ptr();
    a.partial = partial.data_ptr<float>();
    a.dweight = dw.data_ptr();
    a.dbias = db.data_ptr();
    check_launch(tk_layernorm::backward(a, c10::cuda::getCurrentCUDAStream().stream()), "backward");
    return {dh_out, dw, db};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk fused residual-add + LayerNorm (kernels/layernorm.cu)";
    m.def("forward", &forward, "y, h, mean, rstd = forward(x, residual|None, weight, bias|None, eps)",
          py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"), py::arg("eps"));
    m.def("backward", &backward, "dh_out, dweight, dbias = backward(dy, dh|None, h, mean, rstd, weight)",
          py::arg("dy"), py::arg("dh"), py::arg("h"), py::arg("mean"), py::arg("rstd"), py::arg("weight"));
}

// kernels/layernorm_bindings.cpp: the torch side of the tk_layernorm extension. Checks every
// input (a bad call is a Python ValueError/TypeError naming the argument, never a crash or
// garbage), allocates the outputs, and calls the plain C++ launchers of layernorm.cu.
// Read after kernels/layernorm.py (which calls `forward` and `backward` from its custom ops)
// and kernels/bindings_checks.h (how a check builds its message and raises it).
//
// Dtypes (kernels/layernorm.cu says why they may differ): x and h float32 or bf16; the residual
// x's dtype or bf16; y x's dtype, or bf16 with y_bf16. Backward: dy h's dtype or bf16, dh h's;
// with residual_grad_bf16 (fp32 h only) the gradient is also returned in bf16 for a bf16 residual.
// Dropout of the residual: dropout_seed (one int64 on x's device) and dropout_p in [0, 1), the
// same pair to forward and backward (the backward regenerates the forward's mask from them).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <string>

#include "bindings_checks.h"
#include "layernorm.h"

namespace {

using at::Tensor;
using tk_bindings::Problem;
using tk_bindings::dims;
using tk_bindings::dtype_name;
using tk_bindings::device_name;

tk_layernorm::DType dtype_of(const Tensor& t) {
    return t.scalar_type() == at::kBFloat16 ? tk_layernorm::DType::bf16 : tk_layernorm::DType::f32;
}

bool bf16_or_f32(const Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat; }

// "tk_layernorm: <name><rest>", built only when a check fails.
std::string say(const char* name, const std::string& rest) { return std::string("tk_layernorm: ") + name + rest; }

// An activation: a CUDA tensor on `like`'s device with `like`'s dtype (or bf16, when `or_bf16`
// says why that is fine) and shape, contiguous and 16-byte aligned (the kernel moves 16-byte
// vectors). `like` undefined: check `t` as the first, whose last dimension is the hidden size.
Problem activation_problem(const Tensor& t, const char* name, const Tensor& like, const char* like_name,
                           const char* or_bf16 = nullptr) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!t.defined()) return value_problem(say(name, " is missing"));
    if (!t.is_cuda())
        return value_problem(say(name, " must be a CUDA tensor, got one on " + device_name(t) +
                                           "; move it with .cuda() or use --kernels_layernorm=torch"));
    if (!bf16_or_f32(t))
        return type_problem(say(name, " must be bfloat16 or float32, got " + dtype_name(t) +
                                          "; cast it or use --kernels_layernorm=torch"));
    if (!t.is_contiguous())
        return value_problem(say(name, " must be contiguous, got strides " + dims(t.strides()) + "; call .contiguous() on it"));
    if (!tk_bindings::aligned16(t))
        return value_problem(say(name, " must start 16-byte aligned (it is a view at an odd offset); pass a fresh tensor or .clone() it"));
    if (like.defined()) {
        if (t.device() != like.device())
            return value_problem(say(name, " is on " + device_name(t) + " but " + like_name + " is on " + device_name(like)));
        const bool bf16_ok = or_bf16 != nullptr && t.scalar_type() == at::kBFloat16;
        if (t.scalar_type() != like.scalar_type() && !bf16_ok)
            return type_problem(say(name, " is " + dtype_name(t) + " but " + like_name + " is " + dtype_name(like) +
                                              (or_bf16 ? std::string("; it must have ") + like_name + "'s dtype" + or_bf16
                                                       : std::string(" (cast one of them)"))));
        if (t.sizes() != like.sizes())
            return value_problem(say(name, " has shape " + dims(t.sizes()) + " but " + like_name + " has " + dims(like.sizes())));
        return {};
    }
    if (t.dim() < 1) return value_problem(say(name, " must have at least one dimension, got a scalar"));
    const int64_t cols = t.size(-1);
    if (cols % 64 != 0 || cols < 64 || cols > tk_layernorm::MAX_COLS)
        return value_problem(say(name, "'s last dimension (the hidden size) must be a multiple of 64 between 64 and " +
                                           std::to_string(tk_layernorm::MAX_COLS) + ", got " + std::to_string(cols) +
                                           "; use --kernels_layernorm=torch for other sizes"));
    return {};
}

// weight or bias: a (cols,) tensor on x's device, bfloat16 or float32 (the kernel reads either;
// bias must match weight). `weight` undefined: p is the weight.
Problem param_problem(const Tensor& p, const char* name, const Tensor& x, const Tensor& weight) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!p.defined()) return value_problem(say(name, " is missing"));
    if (p.device() != x.device())
        return value_problem(say(name, " is on " + device_name(p) + " but x is on " + device_name(x)));
    if (!bf16_or_f32(p)) return type_problem(say(name, " must be bfloat16 or float32, got " + dtype_name(p)));
    if (weight.defined() && p.scalar_type() != weight.scalar_type())
        return type_problem(say(name, " is " + dtype_name(p) + " but weight is " + dtype_name(weight) + " (cast one of them)"));
    if (p.dim() != 1 || p.size(0) != x.size(-1))
        return value_problem(say(name, " must have shape (" + std::to_string(x.size(-1)) + ",), got " + dims(p.sizes())));
    return {};
}

// mean or rstd: float32, contiguous, one value per row of h.
Problem stats_problem(const Tensor& t, const char* name, const Tensor& h) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!t.defined() || !t.is_cuda() || t.device() != h.device())
        return value_problem(say(name, " must be a CUDA tensor on h's device (" + device_name(h) + ")"));
    if (t.scalar_type() != at::kFloat) return type_problem(say(name, " must be float32, got " + dtype_name(t)));
    if (!t.is_contiguous() || t.numel() * h.size(-1) != h.numel())
        return value_problem(say(name, " must be contiguous with one value per row of h (" +
                                           std::to_string(h.numel() / h.size(-1)) + "), got shape " + dims(t.sizes())));
    return {};
}

// dropout_seed and dropout_p: a seed is one int64 on `like`'s device; p in [0, 1).
Problem dropout_problem(const c10::optional<Tensor>& seed, double p, const Tensor& like, const char* like_name) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!seed) return {};
    if (!seed->is_cuda() || seed->device() != like.device())
        return value_problem(say("dropout_seed", " must be on " + device_name(like) + " (" + like_name + "'s device), got " +
                                                     device_name(*seed)));
    if (seed->scalar_type() != at::kLong) return type_problem(say("dropout_seed", " must be int64, got " + dtype_name(*seed)));
    if (seed->numel() != 1) return value_problem(say("dropout_seed", " must hold one value, got shape " + dims(seed->sizes())));
    if (!(p >= 0.0 && p < 1.0))
        return value_problem("tk_layernorm: dropout_p must be in [0, 1), got " + tk_bindings::number(p));
    return {};
}

Problem forward_problem(const Tensor& x, const c10::optional<Tensor>& residual, const Tensor& weight,
                        const c10::optional<Tensor>& bias, double eps, const c10::optional<Tensor>& dropout_seed = {},
                        double dropout_p = 0.0) {
    if (Problem p = activation_problem(x, "x", Tensor(), "")) return p;
    if (residual)
        if (Problem p = activation_problem(*residual, "residual", x, "x",
                                           " or be BFloat16 (h = x + residual is stored in x's dtype: pass the wider one as x)"))
            return p;
    if (!(eps >= 0.0 && std::isfinite(eps)))
        return tk_bindings::value_problem("tk_layernorm: eps must be finite and >= 0, got " + tk_bindings::number(eps));
    if (Problem p = param_problem(weight, "weight", x, Tensor())) return p;
    if (bias)
        if (Problem p = param_problem(*bias, "bias", x, weight)) return p;
    if (dropout_seed && !residual)
        return tk_bindings::value_problem("tk_layernorm: dropout_seed is given but residual is None: dropout applies to the residual");
    return dropout_problem(dropout_seed, dropout_p, x, "x");
}

Problem backward_problem(const Tensor& dy, const c10::optional<Tensor>& dh, const Tensor& h, const Tensor& mean,
                         const Tensor& rstd, const Tensor& weight, bool residual_grad_bf16,
                         const c10::optional<Tensor>& dropout_seed = {}, double dropout_p = 0.0) {
    if (Problem p = activation_problem(h, "h", Tensor(), "")) return p;
    if (Problem p = activation_problem(dy, "dy", h, "h", " or be BFloat16 (when y was BFloat16)")) return p;
    if (residual_grad_bf16 && h.scalar_type() != at::kFloat)
        return tk_bindings::value_problem("tk_layernorm: residual_grad_bf16 is for a BFloat16 residual beside Float h, but h is " +
                                          dtype_name(h) + ": dh_out is already the residual's gradient");
    if (dh)
        if (Problem p = activation_problem(*dh, "dh", h, "h")) return p;
    if (Problem p = stats_problem(mean, "mean", h)) return p;
    if (Problem p = stats_problem(rstd, "rstd", h)) return p;
    if (Problem p = dropout_problem(dropout_seed, dropout_p, h, "h")) return p;
    return param_problem(weight, "weight", h, Tensor());
}

// weight or bias as the kernel reads it: contiguous and 16-byte aligned (it loads up to 16 bytes
// of parameters at once). Parameters always are; a view at an odd offset is copied.
Tensor param_for_kernel(const Tensor& p) {
    const Tensor c = p.contiguous();
    return tk_bindings::aligned16(c) ? c : c.clone();
}

tk_layernorm::Dropout dropout_of(const c10::optional<Tensor>& seed, double p) {
    tk_layernorm::Dropout d;
    if (seed) {
        d.seed = seed->data_ptr<int64_t>();
        d.p = p;
    }
    return d;
}

void raise_if_launch_failed(cudaError_t err, const char* what) {
    tk_bindings::raise_if_failed(err == cudaSuccess ? nullptr : cudaGetErrorString(err), "tk_layernorm", what);
}

// Returns [y, h, mean, rstd]; h is None when residual is None (then h is x itself). h has x's
// dtype; y has x's dtype, or bf16 with y_bf16 (for a bf16 matmul that reads it).
// With dropout_seed: h = x + dropout(residual), the mask a function of the seed (layernorm.cu).
std::vector<Tensor> forward(const Tensor& x, const c10::optional<Tensor>& residual, const Tensor& weight,
                            const c10::optional<Tensor>& bias, double eps, bool y_bf16,
                            const c10::optional<Tensor>& dropout_seed, double dropout_p) {
    tk_bindings::raise_if(forward_problem(x, residual, weight, bias, eps, dropout_seed, dropout_p));
    c10::cuda::CUDAGuard guard(x.device());
    const Tensor w = param_for_kernel(weight);
    const Tensor b = bias ? param_for_kernel(*bias) : Tensor();

    Tensor y = at::empty_like(x, x.options().dtype(y_bf16 ? at::kBFloat16 : x.scalar_type()));
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
    a.x_dtype = dtype_of(x);
    a.residual_dtype = residual ? dtype_of(*residual) : a.x_dtype;
    a.y_dtype = dtype_of(y);
    a.dropout = dropout_of(dropout_seed, dropout_p);
    raise_if_launch_failed(tk_layernorm::forward(a, c10::cuda::getCurrentCUDAStream().stream()), "forward");
    return {y, h, mean, rstd};
}

// Returns [dh_out, dweight, dbias] (dh_out in h's dtype; dweight, dbias in weight's), and with
// residual_grad_bf16 or dropout_seed a fourth: the residual's gradient, written by the kernel
// (bf16 with residual_grad_bf16, else h's dtype; with dropout it is dh_out * mask / (1 - p)).
// dh may be None.
std::vector<Tensor> backward(const Tensor& dy, const c10::optional<Tensor>& dh, const Tensor& h, const Tensor& mean,
                             const Tensor& rstd, const Tensor& weight, bool residual_grad_bf16,
                             const c10::optional<Tensor>& dropout_seed, double dropout_p) {
    tk_bindings::raise_if(backward_problem(dy, dh, h, mean, rstd, weight, residual_grad_bf16, dropout_seed, dropout_p));
    c10::cuda::CUDAGuard guard(h.device());
    const Tensor w = param_for_kernel(weight);

    tk_layernorm::BackwardArgs a{};
    a.cols = int(h.size(-1));
    a.rows = h.numel() / a.cols;
    a.h_dtype = dtype_of(h);
    a.residual_dtype = residual_grad_bf16 ? tk_layernorm::DType::bf16 : a.h_dtype;
    a.y_dtype = dtype_of(dy);
    a.dropout = dropout_of(dropout_seed, dropout_p);
    Tensor dh_out = at::empty_like(h);
    Tensor dresidual = residual_grad_bf16 ? at::empty_like(h, h.options().dtype(at::kBFloat16))
                       : dropout_seed     ? at::empty_like(h)
                                          : Tensor();
    // Every column is written by the column-sum kernel; with no rows there is no launch, so zeros.
    Tensor dw = a.rows ? at::empty_like(w) : at::zeros_like(w);
    Tensor db = a.rows ? at::empty_like(w) : at::zeros_like(w);
    const int blocks = tk_layernorm::backward_partial_blocks(a);
    Tensor partial = at::empty({std::max(blocks, 1), 2, a.cols}, h.options().dtype(at::kFloat));

    a.dy = dy.data_ptr();
    a.dh = dh ? dh->data_ptr() : nullptr;
    a.h = h.data_ptr();
    a.mean = mean.data_ptr<float>();
    a.rstd = rstd.data_ptr<float>();
    a.weight = w.data_ptr();
    a.params_bf16 = w.scalar_type() == at::kBFloat16;
    a.dh_out = dh_out.data_ptr();
    a.dresidual_out = dresidual.defined() ? dresidual.data_ptr() : nullptr;
    a.partial = partial.data_ptr<float>();
    a.dweight = dw.data_ptr();
    a.dbias = db.data_ptr();
    raise_if_launch_failed(tk_layernorm::backward(a, c10::cuda::getCurrentCUDAStream().stream()), "backward");
    if (dresidual.defined()) return {dh_out, dw, db, dresidual};
    return {dh_out, dw, db};
}

// The checks alone: "" if forward / backward would take these arguments, else the message they
// would raise (without any C++ throw).
std::string check_forward(const Tensor& x, const c10::optional<Tensor>& residual, const Tensor& weight,
                          const c10::optional<Tensor>& bias, double eps, const c10::optional<Tensor>& dropout_seed,
                          double dropout_p) {
    return forward_problem(x, residual, weight, bias, eps, dropout_seed, dropout_p).message;
}

std::string check_backward(const Tensor& dy, const c10::optional<Tensor>& dh, const Tensor& h, const Tensor& mean,
                           const Tensor& rstd, const Tensor& weight, bool residual_grad_bf16,
                           const c10::optional<Tensor>& dropout_seed, double dropout_p) {
    return backward_problem(dy, dh, h, mean, rstd, weight, residual_grad_bf16, dropout_seed, dropout_p).message;
}

// Measuring variants (kernels/layernorm.cu, "variants"): set_variant("bwd_narrow,pdl") and the
// launches that follow use that plan ("default": the default plan; "none": no flag). Returns
// the flags now on.
std::string set_variant(const std::string& spec) {
    const std::string error = tk_layernorm::set_variant(spec.c_str());
    tk_bindings::raise_if(error.empty() ? Problem{} : tk_bindings::value_problem("tk_layernorm: " + error));
    return tk_layernorm::variant_name();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk fused residual-add + LayerNorm (kernels/layernorm.cu)";
    m.def("check_forward", &check_forward, "'' or what forward(x, residual, weight, bias, eps, ...) would raise",
          py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
          py::arg("dropout_seed") = py::none(), py::arg("dropout_p") = 0.0);
    m.def("check_backward", &check_backward, "'' or what backward(dy, dh, h, mean, rstd, weight, ...) would raise",
          py::arg("dy"), py::arg("dh"), py::arg("h"), py::arg("mean"), py::arg("rstd"), py::arg("weight"),
          py::arg("residual_grad_bf16") = false, py::arg("dropout_seed") = py::none(), py::arg("dropout_p") = 0.0);
    m.def("set_variant", &set_variant, "set_variant('fwd_full,bwd_narrow,...' | 'default' | 'none') -> the flags on",
          py::arg("spec"));
    m.def("variant", &tk_layernorm::variant_name, "the flags on, comma-separated, or 'none'");
    m.def("forward", &forward,
          "y, h, mean, rstd = forward(x, residual|None, weight, bias|None, eps, y_bf16=False, dropout_seed=None, dropout_p=0)",
          py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
          py::arg("y_bf16") = false, py::arg("dropout_seed") = py::none(), py::arg("dropout_p") = 0.0);
    m.def("backward", &backward,
          "dh_out, dweight, dbias[, dresidual] = backward(dy, dh|None, h, mean, rstd, weight, residual_grad_bf16=False, "
          "dropout_seed=None, dropout_p=0)",
          py::arg("dy"), py::arg("dh"), py::arg("h"), py::arg("mean"), py::arg("rstd"), py::arg("weight"),
          py::arg("residual_grad_bf16") = false, py::arg("dropout_seed") = py::none(), py::arg("dropout_p") = 0.0);
}

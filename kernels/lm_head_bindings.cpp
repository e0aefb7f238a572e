// kernels/lm_head_bindings.cpp: the torch side of the tk_lm_head extension. One function,
// cross_entropy_, which checks its arguments (a bad call is a Python ValueError/TypeError naming
// the argument, never a crash) and launches kernels/cross_entropy.cu on the current stream.
// Read after kernels/lm_head_op.py (which calls it once per chunk of rows, between the logits'
// GEMM and dx's and dW's) and kernels/bindings_checks.h (how a check builds its message and raises it).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>

#include "bindings_checks.h"
#include "cross_entropy.h"

namespace {

using at::Tensor;
using tk_bindings::Problem;
using tk_bindings::dims;
using tk_bindings::dtype_name;
using tk_bindings::device_name;

std::string say(const char* name, const std::string& rest) { return std::string("tk_lm_head: ") + name + rest; }

// A CUDA tensor on `like`'s device (like undefined: any CUDA device), of dtype `dtype`
// (at::ScalarType::Undefined: bf16 or float), contiguous, with numel elements (-1: any).
Problem tensor_problem(const Tensor& t, const char* name, at::ScalarType dtype, int64_t numel, const Tensor& like) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!t.defined()) return value_problem(say(name, " is missing"));
    if (!t.is_cuda())
        return value_problem(say(name, " must be a CUDA tensor, got one on " + device_name(t) +
                                       "; use --kernels_lm_head=torch for the PyTorch reference"));
    if (like.defined() && t.device() != like.device())
        return value_problem(say(name, " is on " + device_name(t) + " but logits is on " + device_name(like)));
    if (dtype == at::ScalarType::Undefined) {
        if (t.scalar_type() != at::kBFloat16 && t.scalar_type() != at::kFloat)
            return type_problem(say(name, " must be bfloat16 or float32, got " + dtype_name(t)));
    } else if (t.scalar_type() != dtype) {
        return type_problem(say(name, std::string(" must be ") + c10::toString(dtype) + ", got " + dtype_name(t)));
    }
    if (!t.is_contiguous())
        return value_problem(say(name, " must be contiguous, got strides " + dims(t.strides()) + "; call .contiguous() on it"));
    if (numel >= 0 && t.numel() != numel)
        return value_problem(say(name, " must have " + std::to_string(numel) + " elements, got shape " + dims(t.sizes())));
    return {};
}

// The logits matrix alone: what cross_entropy_ and plan both need.
Problem logits_problem(const Tensor& logits) {
    using tk_bindings::value_problem;
    if (Problem p = tensor_problem(logits, "logits", at::ScalarType::Undefined, -1, Tensor())) return p;
    if (logits.dim() != 2 || logits.size(0) < 1 || logits.size(1) < 1)
        return value_problem(say("logits", " must be a non-empty 2-D (rows, vocab) matrix, got shape " + dims(logits.sizes())));
    if (logits.size(0) >= (int64_t(1) << 31))
        return value_problem(say("logits", " must have fewer than 2^31 rows, got " + std::to_string(logits.size(0))));
    return {};
}

Problem cross_entropy_problem(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                              const Tensor& grad_scale) {
    if (Problem p = logits_problem(logits)) return p;
    const int64_t rows = logits.size(0);
    if (Problem p = tensor_problem(targets, "targets", at::kLong, rows, logits)) return p;
    if (Problem p = tensor_problem(loss_rows, "loss_rows", at::kFloat, rows, logits)) return p;
    return tensor_problem(grad_scale, "grad_scale", at::kFloat, 1, logits);
}

// A kernel's name (tk_cross_entropy::KERNEL_NAMES: "auto", "registers", "shared", "streamed",
// "warp") -> the launcher's Kernel (a request: where that kernel cannot take the rows, a fallback
// runs; kernels/lm_head_op.py says which one the op asks for). Anything else: a ValueError
// naming the choices.
Problem kernel_problem(const std::string& name, tk_cross_entropy::Kernel* kernel) {
    if (tk_cross_entropy::kernel_from_name(name.c_str(), kernel)) return {};
    return tk_bindings::value_problem(say("kernel", std::string(" must be ") + tk_cross_entropy::KERNEL_NAMES + ", got '" +
                                                        name + "'"));
}

// Elements from one row to the next. A one-row tensor counts as contiguous whatever its first
// stride says (torch ignores the strides of size-1 dimensions), so it gets the row width.
int64_t row_pitch(const Tensor& logits) { return logits.size(0) == 1 ? logits.size(1) : logits.stride(0); }

// The launcher's arguments that come from the logits tensor and the kernel choice.
tk_cross_entropy::Args args_for(const Tensor& logits, tk_cross_entropy::Kernel kernel) {
    tk_cross_entropy::Args a{};
    a.logits = logits.data_ptr();
    a.rows = logits.size(0);
    a.cols = logits.size(1);
    a.ld = row_pitch(logits);
    a.dtype = logits.scalar_type() == at::kBFloat16 ? tk_cross_entropy::DType::bf16 : tk_cross_entropy::DType::f32;
    a.kernel = kernel;
    return a;
}

// Fills loss_rows; with write_grad, overwrites logits with (softmax - onehot) * grad_scale.
void cross_entropy_(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows, const Tensor& grad_scale,
                    bool write_grad, const std::string& kernel) {
    tk_bindings::raise_if(cross_entropy_problem(logits, targets, loss_rows, grad_scale));
    tk_cross_entropy::Kernel which{};
    tk_bindings::raise_if(kernel_problem(kernel, &which));
    const c10::cuda::CUDAGuard guard(logits.device());
    tk_cross_entropy::Args a = args_for(logits, which);
    a.targets = targets.data_ptr<int64_t>();
    a.loss_rows = loss_rows.data_ptr<float>();
    a.grad_scale = grad_scale.data_ptr<float>();
    a.write_grad = write_grad;
    tk_bindings::raise_if_failed(tk_cross_entropy::cross_entropy_rows(a, c10::cuda::getCurrentCUDAStream().stream()),
                                 "tk_lm_head", "cross_entropy kernel");
}

// "" if cross_entropy_ would take these arguments, else the message it would raise.
std::string check_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                                const Tensor& grad_scale) {
    return cross_entropy_problem(logits, targets, loss_rows, grad_scale).message;
}

// Which kernel cross_entropy_ takes for this logits tensor (checked as cross_entropy_ checks it):
// tests and notes.
std::string plan(const Tensor& logits, const std::string& kernel) {
    tk_bindings::raise_if(logits_problem(logits));
    tk_cross_entropy::Kernel which{};
    tk_bindings::raise_if(kernel_problem(kernel, &which));
    const c10::cuda::CUDAGuard guard(logits.device());
    return tk_cross_entropy::plan_name(args_for(logits, which));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk LM head: softmax cross-entropy loss and gradient in place (kernels/cross_entropy.cu)";
    m.def("cross_entropy_", &cross_entropy_, "loss_rows (and, with write_grad, dlogits in place of logits)",
          py::arg("logits"), py::arg("targets"), py::arg("loss_rows"), py::arg("grad_scale"), py::arg("write_grad"),
          py::arg("kernel") = "auto");
    m.def("check_cross_entropy", &check_cross_entropy, "'' or what cross_entropy_ would raise",
          py::arg("logits"), py::arg("targets"), py::arg("loss_rows"), py::arg("grad_scale"));
    m.def("plan", &plan, "which kernel cross_entropy_ takes for these logits", py::arg("logits"),
          py::arg("kernel") = "auto");
}

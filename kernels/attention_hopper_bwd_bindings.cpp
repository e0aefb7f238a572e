// kernels/attention_hopper_bwd_bindings.cpp — torch bindings of the Hopper attention BACKWARD
// (kernels/attention_hopper_bwd.cu): input checks with errors a Python user can act on, the
// scratch buffers (Di, the fp32 dQ accumulator) and the call to the plain C++ launcher on torch's
// current stream. A separate extension from the forward's, so each builds (and fails) alone.
// Read after kernels/attention_hopper.py (backend_backward) and kernels/bindings_checks.h.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <string>

#include "attention_params.h"
#include "bindings_checks.h"

// From attention_hopper_bwd.cu.
const char* attention_hopper_backward_why_not(const AttentionBackwardParams& p);
int64_t attention_hopper_backward_dq_accum_floats(int batch, int heads, int seq_len, int head_dim);
int attention_hopper_backward_variant(const AttentionBackwardParams& p, void* cuda_stream, int variant);

namespace {

using tk_bindings::Problem;
using tk_bindings::dims;
using tk_bindings::dtype_name;
using tk_bindings::device_name;

AttentionTensor view_of(const at::Tensor& t) {
    return AttentionTensor{t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

// The launcher's parameters; d_rowsum and dq_accum are the scratch buffers (stand-ins while checking).
AttentionBackwardParams params_of(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& o, const at::Tensor& lse, bool causal, double scale,
                                  const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv, float* d_rowsum,
                                  float* dq_accum) {
    const AttentionShape shape{int(q.size(0)), int(q.size(1)), int(q.size(2)), int(q.size(3)), causal, float(scale)};
    return AttentionBackwardParams{shape, view_of(q), view_of(k), view_of(v), view_of(o), view_of(d_o),
                                   view_of(dq), view_of(dk), view_of(dv), lse.data_ptr<float>(), d_rowsum, dq_accum};
}

std::string say(const char* name, const std::string& rest) {
    return std::string("tk Hopper attention backward: ") + name + rest;
}

// q, k, v, o, grad_out, dq, dk, dv: bf16 (B, H, T, D) CUDA tensors of q's shape on q's device.
Problem tensor_problem(const at::Tensor& t, const char* name, const at::Tensor& q) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!t.is_cuda())
        return value_problem(say(name, " must be a CUDA tensor, got one on " + device_name(t) +
                                           "; use --kernels_attention=torch for CPU tensors"));
    if (t.device() != q.device())
        return value_problem(say(name, " is on " + device_name(t) + " but q is on " + device_name(q)));
    if (t.scalar_type() != at::kBFloat16)
        return type_problem(say(name, " must be bfloat16, got " + dtype_name(t)));
    if (t.dim() != 4 || t.sizes() != q.sizes())
        return value_problem(say(name, " must have q's shape " + dims(q.sizes()) + ", got " + dims(t.sizes())));
    if (t.stride(3) != 1)
        return value_problem(say(name, " must be contiguous in its last (head_dim) dimension (strides " +
                                           dims(t.strides()) + "); call .contiguous() on it"));
    return {};
}

Problem backward_problem(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& o, const at::Tensor& lse, double scale, const at::Tensor& dq,
                         const at::Tensor& dk, const at::Tensor& dv) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    const std::pair<const at::Tensor*, const char*> all[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"},
                                                             {&d_o, "grad_out"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
    for (const auto& [t, name] : all)
        if (Problem p = tensor_problem(*t, name, q)) return p;
    if (!lse.is_cuda() || lse.device() != q.device())
        return value_problem(say("lse", " must be on " + device_name(q)));
    if (lse.scalar_type() != at::kFloat) return type_problem(say("lse", " must be float32, got " + dtype_name(lse)));
    if (lse.dim() != 3 || lse.size(0) != q.size(0) || lse.size(1) != q.size(1) || lse.size(2) != q.size(2) ||
        !lse.is_contiguous())
        return value_problem(say("lse", " must be contiguous with shape " + dims(q.sizes().slice(0, 3)) + ", got " +
                                            dims(lse.sizes()) + " strides " + dims(lse.strides())));
    if (q.size(0) > INT32_MAX || q.size(1) > INT32_MAX || q.size(2) > INT32_MAX)
        return value_problem(say("q", " is too large: " + dims(q.sizes())));
    float dummy = 0.f;   // stands in for the scratch buffers, allocated after the checks
    if (const char* why = attention_hopper_backward_why_not(
            params_of(d_o, q, k, v, o, lse, true, scale, dq, dk, dv, &dummy, &dummy)))
        return value_problem(std::string("tk Hopper attention backward cannot take these inputs: ") + why + " (q " +
                             dims(q.sizes()) + ", scale " + tk_bindings::number(scale) +
                             "). Use --kernels_attention=torch for the PyTorch reference.");
    return {};
}

}  // namespace

// "" if backward_into(...) would take these arguments, else the message it would raise.
std::string check_backward(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& o, const at::Tensor& lse, double scale, const at::Tensor& dq,
                           const at::Tensor& dk, const at::Tensor& dv) {
    return backward_problem(d_o, q, k, v, o, lse, scale, dq, dk, dv).message;
}

// Writes dq, dk, dv (bf16 (B, H, T, D) views, e.g. three slices of one (B, T, 3, H, D) buffer).
void backward_into(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& o, const at::Tensor& lse, bool causal, double scale, const at::Tensor& dq,
                   const at::Tensor& dk, const at::Tensor& dv, int64_t variant) {
    tk_bindings::raise_if(backward_problem(d_o, q, k, v, o, lse, scale, dq, dk, dv));
    // 6, 7: removed in session 7; 17 in session 9; 18 (and 20-24, past the range) in session 10
    if (variant < 0 || variant > 19 || variant == 6 || variant == 7 || variant == 17 || variant == 18)
        tk_bindings::raise_if(tk_bindings::value_problem(
            "tk Hopper attention backward: variant must be 0 (the default), 1-5, 8-16 or 19, got " + std::to_string(variant)));
    const int B = int(q.size(0)), H = int(q.size(1)), T = int(q.size(2)), D = int(q.size(3));
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor d_rowsum = at::empty({B, H, T}, q.options().dtype(at::kFloat));
    at::Tensor dq_accum = at::empty({attention_hopper_backward_dq_accum_floats(B, H, T, D)}, q.options().dtype(at::kFloat));
    const AttentionBackwardParams p = params_of(d_o, q, k, v, o, lse, causal, scale, dq, dk, dv,
                                                d_rowsum.data_ptr<float>(), dq_accum.data_ptr<float>());
    auto stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
    const int err = attention_hopper_backward_variant(p, stream, int(variant));
    tk_bindings::raise_if_failed(err == 0 ? nullptr : cudaGetErrorString(static_cast<cudaError_t>(err)),
                                 "tk Hopper attention", "backward launch");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk Hopper flash attention backward (wgmma + TMA, sm_90a)";
    m.def("check_backward", &check_backward, "'' or what backward_into would raise", py::arg("grad_out"), py::arg("q"),
          py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("scale"), py::arg("dq"), py::arg("dk"),
          py::arg("dv"));
    m.def("backward_into", &backward_into, "(grad_out, q, k, v, o, lse, causal, scale, dq, dk, dv): writes dq, dk, dv",
          py::arg("grad_out"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("causal"),
          py::arg("scale"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("variant") = 0);
}

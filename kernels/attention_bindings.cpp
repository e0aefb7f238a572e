// kernels/attention_bindings.cpp: torch bindings of the portable attention kernels
// (kernels/attention_portable.cu): input checks whose errors name the argument and say what
// to do, output and scratch allocation, and the calls to the plain C++ launchers on torch's
// current stream. Read after kernels/attention.py; the kernels are in attention_portable.cu.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <utility>

#include "attention_params.h"

namespace {

// The checks return the problem as a string ("" when the inputs are fine) instead of throwing:
// attention_op.py asks first (check_forward / check_backward) and raises ValueError in Python.
// On the H200 (torch 2.11) raising c10::ValueError from these checks crashed the process
// (segfault) in two runs, at different checks; the cause was not pinned down. forward() and
// backward() still refuse bad inputs with TORCH_CHECK for callers that skip the question.
// Messages are built from std::string and std::to_string only.
std::string dims(at::IntArrayRef a) {
    std::string s = "(";
    for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
    return s + ")";
}

// q, k, v, o, dO: bf16 (B, H, T, D) on q's device, D contiguous, every row 16-byte aligned
// (cp.async moves 16 bytes at a time). Views of a (B, T, 3, H, D) qkv tensor pass as they are.
std::string input_problem(const at::Tensor& t, const std::string& name, const at::Tensor& q) {
    const std::string what = "tk attention: " + name;
    if (!t.is_cuda()) return what + " must be a CUDA tensor (got " + t.device().str() + ")";
    if (t.device() != q.device()) return what + " is on " + t.device().str() + " but q is on " + q.device().str();
    if (t.scalar_type() != at::kBFloat16)
        return what + " must be bfloat16 (got " + c10::toString(t.scalar_type()) + "); cast it or use --kernels_attention=torch";
    if (t.dim() != 4) return what + " must have shape (batch, heads, seq, head_dim); got " + dims(t.sizes());
    if (!t.sizes().equals(q.sizes()))
        return what + " has shape " + dims(t.sizes()) + " but q has " + dims(q.sizes()) +
               " (q, k and v must match: no cross-attention or grouped heads)";
    const int64_t d = t.size(3);
    if (d != 64 && d != 128) return "tk attention: head_dim of " + name + " is " + std::to_string(d) + "; the kernel takes 64 or 128";
    if (t.size(0) == 0 || t.size(1) == 0 || t.size(2) == 0) return what + " is empty: " + dims(t.sizes());
    if (t.stride(3) != 1)
        return what + " must be contiguous in its last (head_dim) dimension (strides " + dims(t.strides()) +
               "); call .contiguous() on it";
    const bool aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0 &&
                         t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0;
    if (!aligned)
        return "tk attention: every row of " + name + " must start on a 16-byte boundary (strides " + dims(t.strides()) +
               " must be multiples of 8 elements); call .contiguous() on it";
    // grid = (B * H, T / 64): at most 2^31 - 1 by 65535 blocks.
    if (t.size(0) * t.size(1) > INT32_MAX || t.size(2) > 65535LL * 64) return what + " is too large: " + dims(t.sizes());
    return "";
}

std::string scale_problem(double scale) {
    if (std::isfinite(scale) && scale > 0) return "";
    return "tk attention: scale must be a finite positive number; got " + std::to_string(scale);
}

std::string lse_problem(const at::Tensor& lse, const at::Tensor& q) {
    if (!lse.is_cuda() || lse.device() != q.device()) return "tk attention: lse must be on " + q.device().str();
    if (lse.scalar_type() != at::kFloat)
        return std::string("tk attention: lse must be float32 (got ") + c10::toString(lse.scalar_type()) + ")";
    if (lse.dim() != 3 || lse.size(0) != q.size(0) || lse.size(1) != q.size(1) || lse.size(2) != q.size(2))
        return "tk attention: lse must have shape (batch, heads, seq) = " + dims(q.sizes().slice(0, 3)) + "; got " +
               dims(lse.sizes());
    if (!lse.is_contiguous()) return "tk attention: lse must be contiguous";
    return "";
}

}  // namespace

// "" if forward(q, k, v, causal, scale) can run, else what is wrong (attention_op.py raises it).
std::string check_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
    const std::pair<const at::Tensor*, const char*> inputs[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}};
    for (const auto& [t, name] : inputs)
        if (std::string problem = input_problem(*t, name, q); !problem.empty()) return problem;
    return scale_problem(scale);
}

// The same for backward(grad_out, q, k, v, o, lse, causal, scale).
std::string check_backward(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& o, const at::Tensor& lse, double scale) {
    const std::pair<const at::Tensor*, const char*> inputs[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}, {&d_o, "grad_out"}};
    for (const auto& [t, name] : inputs)
        if (std::string problem = input_problem(*t, name, q); !problem.empty()) return problem;
    if (std::string problem = lse_problem(lse, q); !problem.empty()) return problem;
    return scale_problem(scale);
}

// The same for backward_into's outputs dq, dk, dv: bf16 (B, H, T, D) views like the inputs
// (typically three slices of one (B, T, 3, H, D) gradient buffer).
std::string check_outputs(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& q) {
    const std::pair<const at::Tensor*, const char*> outputs[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
    for (const auto& [t, name] : outputs)
        if (std::string problem = input_problem(*t, name, q); !problem.empty()) return problem;
    return "";
}

namespace {

AttentionTensor view_of(const at::Tensor& t) {
    return AttentionTensor{t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

AttentionShape shape_of(const at::Tensor& q, bool causal, double scale) {
    return AttentionShape{int(q.size(0)), int(q.size(1)), int(q.size(2)), int(q.size(3)), causal, float(scale)};
}

// (B, H, T, D) bf16 laid out as (B, T, H, D) in memory: y.transpose(1, 2).reshape(B, T, C)
// in the model then needs no copy.
at::Tensor empty_bthd(const at::Tensor& q) {
    return at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
}

void check_launch(int err, const char* what) {
    TORCH_CHECK(err == 0, "tk attention: ", what, " launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace

// Returns (o, lse): o (B, H, T, D) bf16, lse (B, H, T) fp32 in natural log.
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                double scale) {
    const std::string problem = check_forward(q, k, v, scale);
    TORCH_CHECK_VALUE(problem.empty(), problem);
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor o = empty_bthd(q);
    at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    AttentionForwardParams p{shape_of(q, causal, scale), view_of(q), view_of(k), view_of(v), view_of(o),
                             lse.data_ptr<float>()};
    check_launch(attention_portable_forward(p, c10::cuda::getCurrentCUDAStream(q.get_device()).stream()), "forward");
    return {o, lse};
}

// Writes dq, dk, dv (bf16 (B, H, T, D), any strides the checks accept): the model passes three
// slices of one (B, T, 3, H, D) buffer, the gradient of the c_attn output, so nothing has to
// stack them afterwards.
void backward_into(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& o, const at::Tensor& lse, bool causal, double scale,
                   const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv) {
    std::string problem = check_backward(d_o, q, k, v, o, lse, scale);
    if (problem.empty()) problem = check_outputs(dq, dk, dv, q);
    TORCH_CHECK_VALUE(problem.empty(), problem);
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor d_rowsum = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    at::Tensor dq_accum = at::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options().dtype(at::kFloat));
    AttentionBackwardParams p{shape_of(q, causal, scale), view_of(q), view_of(k), view_of(v), view_of(o), view_of(d_o),
                              view_of(dq), view_of(dk), view_of(dv), lse.data_ptr<float>(),
                              d_rowsum.data_ptr<float>(), dq_accum.data_ptr<float>()};
    check_launch(attention_portable_backward(p, c10::cuda::getCurrentCUDAStream(q.get_device()).stream()), "backward");
}

// Returns (dq, dk, dv), each (B, H, T, D) bf16 laid out as (B, T, H, D).
std::vector<at::Tensor> backward(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& o, const at::Tensor& lse, bool causal, double scale) {
    const std::string problem = check_backward(d_o, q, k, v, o, lse, scale);   // before q's sizes are used
    TORCH_CHECK_VALUE(problem.empty(), problem);
    at::Tensor dq = empty_bthd(q), dk = empty_bthd(q), dv = empty_bthd(q);
    backward_into(d_o, q, k, v, o, lse, causal, scale, dq, dk, dv);
    return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk portable flash attention (mma.sync): forward and backward";
    m.def("check_forward", &check_forward, "(q, k, v, scale) -> '' or what is wrong", py::arg("q"), py::arg("k"),
          py::arg("v"), py::arg("scale"));
    m.def("check_backward", &check_backward, "(grad_out, q, k, v, o, lse, scale) -> '' or what is wrong",
          py::arg("grad_out"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("scale"));
    m.def("forward", &forward, "(q, k, v, causal, scale) -> [o, lse]", py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("causal"), py::arg("scale"));
    m.def("check_outputs", &check_outputs, "(dq, dk, dv, q) -> '' or what is wrong", py::arg("dq"), py::arg("dk"),
          py::arg("dv"), py::arg("q"));
    m.def("backward_into", &backward_into, "(grad_out, q, k, v, o, lse, causal, scale, dq, dk, dv): writes dq, dk, dv",
          py::arg("grad_out"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("causal"),
          py::arg("scale"), py::arg("dq"), py::arg("dk"), py::arg("dv"));
    m.def("backward", &backward, "(grad_out, q, k, v, o, lse, causal, scale) -> [dq, dk, dv]", py::arg("grad_out"),
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("causal"), py::arg("scale"));
}

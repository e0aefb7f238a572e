// kernels/attention_bindings.cpp: torch bindings of the portable attention kernels
// (kernels/attention_portable.cu): input checks whose errors name the argument and say what
// to do, output and scratch allocation, and the calls to the plain C++ launchers on torch's
// current stream. Read after kernels/attention.py; the kernels are in attention_portable.cu.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cmath>

#include "attention_params.h"

namespace {

// Messages are built from strings only: shapes go through dims() ("(1, 2, 16, 64)") and numbers
// through std::to_string. On the H200 (torch 2.11) two checks whose messages streamed integers
// (an IntArrayRef, then an int64) crashed the process while raising, and the checks that streamed
// only strings and dtypes did not. The cause was not pinned down; this form avoids the pattern.
std::string dims(at::IntArrayRef a) {
    std::string s = "(";
    for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
    return s + ")";
}

// q, k, v, o, dO: bf16 (B, H, T, D) on q's device, D contiguous, every row 16-byte aligned
// (cp.async moves 16 bytes at a time). Views of a (B, T, 3, H, D) qkv tensor pass as they are.
void check_input(const at::Tensor& t, const char* name, const at::Tensor& q) {
    TORCH_CHECK_VALUE(t.is_cuda(), "tk attention: ", name, " must be a CUDA tensor (got ", t.device().str(), ")");
    TORCH_CHECK_VALUE(t.device() == q.device(), "tk attention: ", name, " is on ", t.device().str(), " but q is on ", q.device().str());
    TORCH_CHECK_VALUE(t.scalar_type() == at::kBFloat16, "tk attention: ", name, " must be bfloat16 (got ",
                      t.scalar_type(), "); cast it or use --kernels_attention=torch");
    TORCH_CHECK_VALUE(t.dim() == 4, "tk attention: ", name, " must have shape (batch, heads, seq, head_dim); got ", dims(t.sizes()));
    TORCH_CHECK_VALUE(t.sizes().equals(q.sizes()), "tk attention: ", name, " has shape ", dims(t.sizes()), " but q has ", dims(q.sizes()),
                      " (q, k and v must match: no cross-attention or grouped heads)");
    const int64_t d = t.size(3);
    TORCH_CHECK_VALUE(d == 64 || d == 128, "tk attention: head_dim of ", name, " is ", std::to_string(d), "; the kernel takes 64 or 128");
    TORCH_CHECK_VALUE(t.size(0) > 0 && t.size(1) > 0 && t.size(2) > 0, "tk attention: ", name, " is empty: ", dims(t.sizes()));
    TORCH_CHECK_VALUE(t.stride(3) == 1, "tk attention: ", name, " must be contiguous in its last (head_dim) dimension "
                      "(strides ", dims(t.strides()), "); call .contiguous() on it");
    const bool aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0 &&
                         t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0;
    TORCH_CHECK_VALUE(aligned, "tk attention: every row of ", name, " must start on a 16-byte boundary (strides ",
                      dims(t.strides()), " must be multiples of 8 elements); call .contiguous() on it");
    // grid = (B * H, T / 64): at most 2^31 - 1 by 65535 blocks.
    TORCH_CHECK_VALUE(t.size(0) * t.size(1) <= INT32_MAX && t.size(2) <= 65535LL * 64,
                      "tk attention: ", name, " is too large: ", dims(t.sizes()));
}

void check_lse(const at::Tensor& lse, const at::Tensor& q) {
    TORCH_CHECK_VALUE(lse.is_cuda() && lse.device() == q.device(), "tk attention: lse must be on ", q.device().str());
    TORCH_CHECK_VALUE(lse.scalar_type() == at::kFloat, "tk attention: lse must be float32 (got ", lse.scalar_type(), ")");
    TORCH_CHECK_VALUE(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
                      "tk attention: lse must have shape (batch, heads, seq) = ", dims(q.sizes().slice(0, 3)), "; got ", dims(lse.sizes()));
    TORCH_CHECK_VALUE(lse.is_contiguous(), "tk attention: lse must be contiguous");
}

void check_scale(double scale) {
    TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0, "tk attention: scale must be a finite positive number; got ", std::to_string(scale));
}

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
    check_input(q, "q", q);
    check_input(k, "k", q);
    check_input(v, "v", q);
    check_scale(scale);
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor o = empty_bthd(q);
    at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    AttentionForwardParams p{shape_of(q, causal, scale), view_of(q), view_of(k), view_of(v), view_of(o),
                             lse.data_ptr<float>()};
    check_launch(attention_portable_forward(p, c10::cuda::getCurrentCUDAStream(q.get_device()).stream()), "forward");
    return {o, lse};
}

// Returns (dq, dk, dv), each (B, H, T, D) bf16 laid out as (B, T, H, D).
std::vector<at::Tensor> backward(const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& o, const at::Tensor& lse, bool causal, double scale) {
    check_input(q, "q", q);
    check_input(k, "k", q);
    check_input(v, "v", q);
    check_input(o, "o", q);
    check_input(d_o, "grad_out", q);
    check_lse(lse, q);
    check_scale(scale);
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor dq = empty_bthd(q), dk = empty_bthd(q), dv = empty_bthd(q);
    at::Tensor d_rowsum = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    at::Tensor dq_accum = at::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options().dtype(at::kFloat));
    AttentionBackwardParams p{shape_of(q, causal, scale), view_of(q), view_of(k), view_of(v), view_of(o), view_of(d_o),
                              view_of(dq), view_of(dk), view_of(dv), lse.data_ptr<float>(),
                              d_rowsum.data_ptr<float>(), dq_accum.data_ptr<float>()};
    check_launch(attention_portable_backward(p, c10::cuda::getCurrentCUDAStream(q.get_device()).stream()), "backward");
    return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk portable flash attention (mma.sync): forward and backward";
    m.def("forward", &forward, "(q, k, v, causal, scale) -> [o, lse]", py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("causal"), py::arg("scale"));
    m.def("backward", &backward, "(grad_out, q, k, v, o, lse, causal, scale) -> [dq, dk, dv]", py::arg("grad_out"),
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("causal"), py::arg("scale"));
}

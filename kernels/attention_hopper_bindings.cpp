// kernels/attention_hopper_bindings.cpp — torch bindings of the Hopper attention forward
// (kernels/attention_hopper.cu): input checks with errors a Python user can act on, the output
// allocation, and the call to the plain C++ launcher on torch's current stream.
// Read after kernels/attention_hopper.py; the kernel is in attention_hopper.cu.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include "attention_params.h"

// From attention_hopper.cu.
const char* attention_hopper_why_not(const AttentionForwardParams& p);
int attention_hopper_forward_variant(const AttentionForwardParams& p, void* cuda_stream, int variant);

namespace {

AttentionTensor view_of(const at::Tensor& t) {
    return AttentionTensor{t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

void check_input(const at::Tensor& t, const char* name, const at::Tensor& q) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor (got ", t.device(), ")");
    TORCH_CHECK(t.scalar_type() == at::kBFloat16, name, " must be bfloat16 (got ", t.scalar_type(), ")");
    TORCH_CHECK(t.dim() == 4, name, " must have shape (batch, heads, seq, head_dim); got ", t.sizes());
    TORCH_CHECK(t.sizes() == q.sizes(), name, " has shape ", t.sizes(), " but q has ", q.sizes());
    TORCH_CHECK(t.device() == q.device(), name, " is on ", t.device(), " but q is on ", q.device());
    TORCH_CHECK(t.stride(3) == 1, name, " must be contiguous in its last (head_dim) dimension; "
                "call .contiguous() on it or take it from a (B, T, 3, H, D) qkv tensor");
}

}  // namespace

// Returns (o, lse): o is (B, H, T, D) bf16, a view of (B, T, H, D) memory so that
// o.transpose(1, 2).reshape(B, T, H * D) needs no copy; lse is (B, H, T) fp32, natural log.
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                bool causal, double scale, int64_t variant) {
    check_input(q, "q", q);
    check_input(k, "k", q);
    check_input(v, "v", q);
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
    TORCH_CHECK(B <= INT32_MAX && H <= INT32_MAX && T <= INT32_MAX, "q is too large: ", q.sizes());

    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor o = at::empty({B, T, H, D}, q.options()).transpose(1, 2);
    at::Tensor lse = at::empty({B, H, T}, q.options().dtype(at::kFloat));

    AttentionForwardParams p{};
    p.shape = AttentionShape{int(B), int(H), int(T), int(D), causal, float(scale)};
    p.q = view_of(q);
    p.k = view_of(k);
    p.v = view_of(v);
    p.o = view_of(o);
    p.lse = lse.data_ptr<float>();
    if (const char* why = attention_hopper_why_not(p))
        TORCH_CHECK_VALUE(false, "tk Hopper attention cannot take these inputs: ", why,
                          " (q ", q.sizes(), ", strides q ", q.strides(), " k ", k.strides(), " v ", v.strides(),
                          "). Use --kernels_attention=torch for the PyTorch reference.");
    auto stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
    TORCH_CHECK_VALUE(variant >= 0 && variant <= 4, "variant must be 0 (default) .. 4; got ", variant);
    int err = attention_hopper_forward_variant(p, stream, int(variant));
    TORCH_CHECK(err == 0, "tk Hopper attention forward failed to launch: ",
                cudaGetErrorString(static_cast<cudaError_t>(err)));
    return {o, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", &forward, "Hopper causal flash attention forward: (o, lse)",
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("scale"),
          py::arg("variant") = 0);
}

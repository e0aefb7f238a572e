// kernels/attention_hopper_bindings.cpp — torch bindings of the Hopper attention forward
// (kernels/attention_hopper.cu): input checks with errors a Python user can act on, the output
// allocation, and the call to the plain C++ launcher on torch's current stream.
// Read after kernels/attention_hopper.py and kernels/bindings_checks.h (how a check builds its
// message and raises it: one pre-built string, nothing streamed); the kernel is in
// attention_hopper.cu.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "attention_params.h"
#include "bindings_checks.h"

// From attention_hopper.cu.
const char* attention_hopper_why_not(const AttentionForwardParams& p);
int attention_hopper_forward_variant(const AttentionForwardParams& p, void* cuda_stream, int variant,
                                     unsigned int* work_counter);

namespace {

using tk_bindings::Problem;
using tk_bindings::dims;
using tk_bindings::dtype_name;
using tk_bindings::device_name;

// 0 (the default) and the variants that remain (attention_hopper.cu's opening comment says where the
// removed numbers went); kernels/attention_hopper.py names them.
constexpr int VARIANTS[] = {0, 2, 4, 5, 8, 11, 12, 13, 21, 26, 27, 28, 29, 30, 31};
constexpr int LAST_VARIANT = VARIANTS[sizeof(VARIANTS) / sizeof(VARIANTS[0]) - 1];
bool is_variant(int64_t v) {
    for (int k : VARIANTS)
        if (v == k) return true;
    return false;
}
std::string variant_list() {
    std::string s;
    for (int k : VARIANTS) s += (s.empty() ? "" : ", ") + std::to_string(k);
    return s;
}

AttentionTensor view_of(const at::Tensor& t) {
    return AttentionTensor{t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

// "tk Hopper attention: <name><rest>", built only when a check fails.
std::string say(const char* name, const std::string& rest) { return std::string("tk Hopper attention: ") + name + rest; }

// q, k, v: bf16 (B, H, T, D) CUDA tensors of q's shape on q's device, head_dim contiguous.
Problem input_problem(const at::Tensor& t, const char* name, const at::Tensor& q) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!t.is_cuda())
        return value_problem(say(name, " must be a CUDA tensor, got one on " + device_name(t) +
                                           "; move it with .cuda() or use --kernels_attention=torch"));
    if (t.device() != q.device())
        return value_problem(say(name, " is on " + device_name(t) + " but q is on " + device_name(q)));
    if (t.scalar_type() != at::kBFloat16)
        return type_problem(say(name, " must be bfloat16, got " + dtype_name(t) + "; cast it or use --kernels_attention=torch"));
    if (t.dim() != 4)
        return value_problem(say(name, " must have shape (batch, heads, seq, head_dim), got " + dims(t.sizes())));
    if (t.sizes() != q.sizes())
        return value_problem(say(name, " has shape " + dims(t.sizes()) + " but q has " + dims(q.sizes()) +
                                           " (q, k and v must match: no cross-attention or grouped heads)"));
    if (t.stride(3) != 1)
        return value_problem(say(name, " must be contiguous in its last (head_dim) dimension (strides " + dims(t.strides()) +
                                           "); call .contiguous() on it or take it from a (B, T, 3, H, D) qkv tensor"));
    return {};
}

// The parameters the launcher gets; o is a stand-in until forward() allocates the real one.
AttentionForwardParams params_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                                 float* lse, bool causal, double scale) {
    AttentionForwardParams p{};
    p.shape = AttentionShape{int(q.size(0)), int(q.size(1)), int(q.size(2)), int(q.size(3)), causal, float(scale)};
    p.q = view_of(q);
    p.k = view_of(k);
    p.v = view_of(v);
    p.o = view_of(o);
    p.lse = lse;
    return p;
}

Problem forward_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                        int64_t variant) {
    using tk_bindings::value_problem;
    if (Problem p = input_problem(q, "q", q)) return p;
    if (Problem p = input_problem(k, "k", q)) return p;
    if (Problem p = input_problem(v, "v", q)) return p;
    if (q.size(0) > INT32_MAX || q.size(1) > INT32_MAX || q.size(2) > INT32_MAX)
        return value_problem(say("q", " is too large: " + dims(q.sizes())));
    if (!is_variant(variant))
        return value_problem("tk Hopper attention: variant must be 0 (the default) .. " + std::to_string(LAST_VARIANT) +
                             " and one of " + variant_list() + " (the others were removed), got " +
                             std::to_string(variant));
    // The kernel's own rules (head_dim, sizes, scale, TMA alignment and strides). o is not
    // allocated yet: q stands in for it (forward() allocates o dense and aligned, which passes).
    if (const char* why = attention_hopper_why_not(params_of(q, k, v, q, nullptr, causal, scale)))
        return value_problem(std::string("tk Hopper attention cannot take these inputs: ") + why + " (q " + dims(q.sizes()) +
                             ", strides q " + dims(q.strides()) + " k " + dims(k.strides()) + " v " + dims(v.strides()) +
                             ", scale " + tk_bindings::number(scale) +
                             "). Use --kernels_attention=torch for the PyTorch reference.");
    return {};
}

// Variant 30 (a measurement, not a default): its counter comes from a ring of RING counters per
// device, zeroed once, which the kernel sets back to 0 itself (SELF_RESET), so a call launches no
// zeroing kernel. Only safe while no two launches that use one counter are in flight at once (a
// launch RING calls later on another stream could meet a CUDA graph's captured one): why this is
// a measurement of what the per-call zeroing costs and not the default's scheme. The ring is made
// outside any CUDA-graph capture (the first variant-30 call must not be captured) and never freed.
constexpr int RING = 1024;
unsigned int* ring_counter(const at::Tensor& q) {
    static std::mutex mutex;
    static std::map<int, at::Tensor*> rings;                // per device; leaked on purpose (exit order)
    static uint32_t next = 0;
    const std::lock_guard<std::mutex> lock(mutex);
    at::Tensor*& ring = rings[q.get_device()];
    if (ring == nullptr) {
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(q.get_device()).stream(), &capturing);
        if (capturing != cudaStreamCaptureStatusNone)
            tk_bindings::raise_if(tk_bindings::value_problem(
                "tk Hopper attention: variant 30 must run once outside CUDA-graph capture before it is captured"));
        ring = new at::Tensor(at::zeros({RING}, q.options().dtype(at::kInt)));
        const cudaError_t e = cudaDeviceSynchronize();   // zero before any stream uses it
        tk_bindings::raise_if_failed(e == cudaSuccess ? nullptr : cudaGetErrorString(e), "tk Hopper attention",
                                     "zeroing variant 30's counters");
    }
    return reinterpret_cast<unsigned int*>(ring->data_ptr<int>()) + (next++ % RING);
}

}  // namespace

// "" if forward(q, k, v, causal, scale, variant) would take these arguments, else the message it
// would raise (without any C++ throw).
std::string check_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                          int64_t variant) {
    return forward_problem(q, k, v, causal, scale, variant).message;
}

// Returns (o, lse): o is (B, H, T, D) bf16, a view of (B, T, H, D) memory so that
// o.transpose(1, 2).reshape(B, T, H * D) needs no copy; lse is (B, H, T) fp32, natural log.
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                bool causal, double scale, int64_t variant) {
    tk_bindings::raise_if(forward_problem(q, k, v, causal, scale, variant));
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);

    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor o = at::empty({B, T, H, D}, q.options()).transpose(1, 2);
    at::Tensor lse = at::empty({B, H, T}, q.options().dtype(at::kFloat));
    // The dynamically scheduled variants' work counter: this call's own, zeroed on this stream
    // (one 4-byte memset), so forwards on several streams at once never share one.
    // (Variant 30: one from ring_counter instead, already zero. Variant 31: zeroed by cudaMemsetAsync,
    // a memset node in a CUDA graph where at::zeros is a fill kernel: a measurement beside 30.)
    at::Tensor work_counter;
    unsigned int* counter = nullptr;
    if (variant == 30) {
        counter = ring_counter(q);
    } else if (variant == 31) {
        work_counter = at::empty({1}, q.options().dtype(at::kInt));
        counter = reinterpret_cast<unsigned int*>(work_counter.data_ptr<int>());
        const cudaError_t e = cudaMemsetAsync(counter, 0, sizeof(unsigned int),
                                              c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
        tk_bindings::raise_if_failed(e == cudaSuccess ? nullptr : cudaGetErrorString(e), "tk Hopper attention",
                                     "zeroing the work counter");
    } else {
        work_counter = at::zeros({1}, q.options().dtype(at::kInt));
        counter = reinterpret_cast<unsigned int*>(work_counter.data_ptr<int>());
    }
    const AttentionForwardParams p = params_of(q, k, v, o, lse.data_ptr<float>(), causal, scale);
    auto stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
    const int err = attention_hopper_forward_variant(p, stream, int(variant), counter);
    tk_bindings::raise_if_failed(err == 0 ? nullptr : cudaGetErrorString(static_cast<cudaError_t>(err)),
                                 "tk Hopper attention", "forward launch");
    return {o, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("check_forward", &check_forward, "'' or what forward(q, k, v, causal, scale, variant) would raise",
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("scale"), py::arg("variant") = 0);
    m.def("forward", &forward, "Hopper causal flash attention forward: (o, lse)",
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("scale"),
          py::arg("variant") = 0);
}

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
bool attention_hopper_counter_resets(const AttentionForwardParams& p, int variant);

namespace {

using tk_bindings::Problem;
using tk_bindings::dims;
using tk_bindings::dtype_name;
using tk_bindings::device_name;

// 0 (the default) and the variants that remain (attention_hopper.cu's opening comment says where the
// removed numbers went); kernels/attention_hopper.py names them.
constexpr int VARIANTS[] = {0, 2, 4, 5, 8, 11, 12, 13, 21, 26, 30, 33, 37};
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

// The work counter of a kernel that sets it back to 0 itself (attention_hopper_counter_resets: the
// default, variant 30) need not be zeroed for each call, only owned: no two launches that use one
// counter may be in flight at once. So each device has a pool of COUNTERS zeroed once, and
//   - an eager launch takes its stream's counter (the first launch on a stream assigns one):
//     launches on one stream run one after the other;
//   - a launch captured into a CUDA graph takes a counter of its own for good: the graph's replays
//     run one after the other (a graph is never launched alongside itself), and nothing else ever
//     uses that counter, whichever stream the graph is replayed on;
//   - where the pool cannot serve (its first use would be inside a capture, where it cannot be
//     zeroed; it is used up: 4096 streams plus captured launches; or the stream is the handle
//     cudaStreamPerThread, which names another stream in each thread), nullptr: the caller zeroes
//     a counter of the call's own, as every call did until session 7.
// Why: that zeroing (at::zeros, a fill kernel before every forward) cost ~1.2 us a call on the H200
// (kernels/NOTES.md, "Session 7: A"). The holes left: a stream destroyed with launches still
// pending, whose handle a new stream gets, would share their counter (torch's own streams are pooled
// and never destroyed; a torch.cuda.ExternalStream could be), and so would two executable graphs
// instantiated from one capture and launched at once (torch instantiates each capture once).
constexpr int COUNTERS = 4096;
struct CounterPool {
    at::Tensor* memory = nullptr;                      // COUNTERS zeroed uint32; never freed (exit order)
    int handed_out = 0;
    std::map<cudaStream_t, int> of_stream;
};
unsigned int* owned_counter(const at::Tensor& q, cudaStream_t stream) {
    static std::mutex mutex;
    static std::map<int, CounterPool> pools;             // per device
    const std::lock_guard<std::mutex> lock(mutex);
    CounterPool& pool = pools[q.get_device()];
    if (stream == cudaStreamPerThread) return nullptr;   // one handle, a different stream in each thread
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
        (void)cudaGetLastError();                         // not the launch's error: clear it
        return nullptr;
    }
    const bool captured = capture != cudaStreamCaptureStatusNone;
    if (pool.memory == nullptr) {
        if (captured) return nullptr;
        at::Tensor zeros = at::zeros({COUNTERS}, q.options().dtype(at::kInt));
        // zero before any launch on any stream reads it: those are issued after this returns
        // (review, session 7) A failed synchronise (e.g. under another thread's global-mode
        // capture, where it is a prohibited call) leaves the runtime's last error set, and the
        // launch check after the kernel would report it as the launch's (as cudaStreamIsCapturing's
        // did before 8c0525a). Not mended (no GPU time left): (void)cudaGetLastError() before nullptr.
        if (cudaStreamSynchronize(stream) != cudaSuccess) return nullptr;
        pool.memory = new at::Tensor(std::move(zeros));
    }
    int index = -1;
    if (captured) {
        if (pool.handed_out < COUNTERS) index = pool.handed_out++;
    } else {
        auto it = pool.of_stream.find(stream);
        if (it != pool.of_stream.end()) index = it->second;
        else if (pool.handed_out < COUNTERS) index = pool.of_stream[stream] = pool.handed_out++;
    }
    if (index < 0) return nullptr;
    return reinterpret_cast<unsigned int*>(pool.memory->data_ptr<int>()) + index;
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
    // The dynamically scheduled variants' work counter. A kernel that sets it back to 0 itself (the
    // default) takes one the bindings own (owned_counter); otherwise the call has its own, zeroed on
    // this stream (at::zeros, a fill kernel), so forwards on several streams at once never share one.
    auto stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
    unsigned int* counter = attention_hopper_counter_resets(params_of(q, k, v, q, nullptr, causal, scale), int(variant))
                                ? owned_counter(q, stream) : nullptr;
    at::Tensor work_counter;
    if (counter == nullptr) {
        work_counter = at::zeros({1}, q.options().dtype(at::kInt));
        counter = reinterpret_cast<unsigned int*>(work_counter.data_ptr<int>());
    }
    const AttentionForwardParams p = params_of(q, k, v, o, lse.data_ptr<float>(), causal, scale);
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

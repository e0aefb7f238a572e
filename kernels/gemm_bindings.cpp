// kernels/gemm_bindings.cpp — the torch side of the GEMM steps: checks what C++ must not get
// wrong (device, dtype, sizes, contiguity as promised), then calls the plain launcher of one step
// (kernels/gemm_<n>_*.cu via kernels/gemm.cuh). kernels/gemm.py decides layouts and split-K.
// A bad call is a Python ValueError/TypeError naming the argument; kernels/bindings_checks.h
// says how the messages are built and raised (one pre-built string, nothing streamed).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <string>

#include "bindings_checks.h"
#include "gemm.cuh"

namespace {

using tk_bindings::Problem;
using tk_bindings::dims;
using tk_bindings::dtype_name;
using tk_bindings::device_name;

// "gemm: <name><rest>", built only when a check fails.
std::string say(const char* name, const std::string& rest) { return std::string("gemm: ") + name + rest; }

// One operand or the output: a contiguous 2-D CUDA tensor on a's device (a itself: `a` undefined).
Problem matrix_problem(const torch::Tensor& t, const char* name, const torch::Tensor& a) {
    using tk_bindings::value_problem;
    if (!t.is_cuda())
        return value_problem(say(name, " must be a CUDA tensor, got one on " + device_name(t) + "; move it with .cuda()"));
    if (a.defined() && t.device() != a.device())
        return value_problem(say(name, " is on " + device_name(t) + " but a is on " + device_name(a)));
    if (t.dim() != 2) return value_problem(say(name, " must be a 2-D matrix, got shape " + dims(t.sizes())));
    if (!t.is_contiguous())
        return value_problem(say(name, " must be contiguous, got strides " + dims(t.strides()) +
                                           "; pass the dense storage and its layout in a_mn_major / b_mn_major (kernels/gemm.py does)"));
    return {};
}

// a: [M][K] (or [K][M] storage when a_mn_major), b: [N][K] (or [K][N] when b_mn_major), both
// contiguous bf16; c: [M][N] contiguous, bf16 or fp32 (zeroed by the caller when splits > 1);
// bias: N bf16 values or None.
Problem run_problem(int64_t step, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                    bool a_mn_major, bool b_mn_major, const c10::optional<torch::Tensor>& bias, int64_t splits) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (step < 1 || step > 5) return value_problem("gemm: step must be 1..5, got " + std::to_string(step));
    if (splits < 1) return value_problem("gemm: splits must be >= 1 (1: no split-K), got " + std::to_string(splits));
    if (Problem p = matrix_problem(a, "a", torch::Tensor())) return p;
    if (Problem p = matrix_problem(b, "b", a)) return p;
    if (Problem p = matrix_problem(c, "c", a)) return p;
    if (a.scalar_type() != torch::kBFloat16) return type_problem("gemm: a must be bfloat16, got " + dtype_name(a));
    if (b.scalar_type() != torch::kBFloat16) return type_problem("gemm: b must be bfloat16, got " + dtype_name(b));
    if (c.scalar_type() != torch::kBFloat16 && c.scalar_type() != torch::kFloat32)
        return type_problem("gemm: c must be bfloat16 or float32, got " + dtype_name(c));
    const int64_t M = c.size(0), N = c.size(1);
    const int64_t K = a_mn_major ? a.size(0) : a.size(1);
    const std::string a_layout = a_mn_major ? "[K][M] (a_mn_major)" : "[M][K]";
    const std::string b_layout = b_mn_major ? "[K][N] (b_mn_major)" : "[N][K]";
    if ((a_mn_major ? a.size(1) : a.size(0)) != M)
        return value_problem("gemm: a, stored as " + a_layout + ", has shape " + dims(a.sizes()) + " but c has M = " +
                             std::to_string(M) + " rows");
    const int64_t b_n = b_mn_major ? b.size(1) : b.size(0), b_k = b_mn_major ? b.size(0) : b.size(1);
    if (b_n != N || b_k != K)
        return value_problem("gemm: b, stored as " + b_layout + ", has shape " + dims(b.sizes()) + " but needs N = " +
                             std::to_string(N) + " (c's columns) and K = " + std::to_string(K) + " (from a)");
    if (N % 16 != 0 || K % 16 != 0)
        return value_problem("gemm: N and K must be multiples of 16, got N = " + std::to_string(N) + ", K = " +
                             std::to_string(K) + "; pad the weight to a multiple of 16");
    if (M < 1 || M >= (int64_t(1) << 31) || N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31))
        return value_problem("gemm: M must be at least 1 and M, N, K below 2^31, got M = " + std::to_string(M) +
                             ", N = " + std::to_string(N) + ", K = " + std::to_string(K));
    if (bias && bias->defined()) {
        if (!bias->is_cuda() || bias->device() != a.device())
            return value_problem("gemm: bias must be on a's device " + device_name(a) + ", got one on " + device_name(*bias));
        if (bias->scalar_type() != torch::kBFloat16)
            return type_problem("gemm: bias must be bfloat16, got " + dtype_name(*bias));
        if (bias->dim() != 1 || bias->numel() != N || !bias->is_contiguous())
            return value_problem("gemm: bias must be a contiguous vector of length N = " + std::to_string(N) + ", got shape " +
                                 dims(bias->sizes()) + " with strides " + dims(bias->strides()));
    }
    return {};
}

// The split-K workspace of step 5 variant 8 (kernels/gemm_splitk_epilogue.cuh): fp32 sums
// and int32 arrival counters, contiguous, on a's device, or both absent. Whether they are large
// enough depends on the variant's tile: the launcher checks that (RuntimeError).
Problem workspace_problem(const torch::Tensor& a, const c10::optional<torch::Tensor>& sums,
                          const c10::optional<torch::Tensor>& arrivals) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    const bool has_sums = sums && sums->defined(), has_arrivals = arrivals && arrivals->defined();
    if (has_sums != has_arrivals)
        return value_problem("gemm: splitk_sums and splitk_arrivals come together (both or neither)");
    if (!has_sums) return {};
    for (const auto* t : {&*sums, &*arrivals}) {
        const char* name = t == &*sums ? "splitk_sums" : "splitk_arrivals";
        if (!t->is_cuda() || t->device() != a.device())
            return value_problem(say(name, " must be on a's device " + device_name(a) + ", got one on " + device_name(*t)));
        if (!t->is_contiguous()) return value_problem(say(name, " must be contiguous"));
    }
    if (sums->scalar_type() != torch::kFloat32) return type_problem("gemm: splitk_sums must be float32, got " + dtype_name(*sums));
    if (arrivals->scalar_type() != torch::kInt32)
        return type_problem("gemm: splitk_arrivals must be int32, got " + dtype_name(*arrivals));
    return {};
}

// The scheduled variants' work schedule (step 5 v10, step 4 v9; kernels/gemm.py stream_schedule): int32 [units per CTA][CTAs][4]
// on a's device, contiguous, or absent. Its contents are checked where it is made (Python).
Problem schedule_problem(const torch::Tensor& a, const c10::optional<torch::Tensor>& schedule) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!schedule || !schedule->defined()) return {};
    const torch::Tensor& t = *schedule;
    if (!t.is_cuda() || t.device() != a.device())
        return value_problem("gemm: schedule must be on a's device " + device_name(a) + ", got one on " + device_name(t));
    if (t.scalar_type() != torch::kInt32) return type_problem("gemm: schedule must be int32, got " + dtype_name(t));
    if (t.dim() != 3 || t.size(2) != 4 || t.size(0) < 1 || t.size(1) < 1 || !t.is_contiguous() ||
        t.size(0) * t.size(1) >= (int64_t(1) << 31))
        return value_problem("gemm: schedule must be a contiguous [units per CTA][CTAs][4] tensor, got shape " +
                             dims(t.sizes()) + " with strides " + dims(t.strides()));
    return {};
}

// SM count per device, asked once: the launchers size their persistent grids with it on every
// call, and the attribute query is host work each call would otherwise repeat.
int sm_count(int device) {
    static std::array<std::atomic<int>, 64> known{};   // 0 = not asked yet
    if (device < 0 || device >= int(known.size())) {
        int n = 0;
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
        return n;
    }
    int n = known[device].load(std::memory_order_relaxed);
    if (n == 0) {
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
        known[device].store(n, std::memory_order_relaxed);
    }
    return n;
}

void run(int64_t step, const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, bool a_mn_major,
         bool b_mn_major, const c10::optional<torch::Tensor>& bias, bool gelu, int64_t splits, int64_t variant,
         const c10::optional<torch::Tensor>& splitk_sums, const c10::optional<torch::Tensor>& splitk_arrivals,
         const c10::optional<torch::Tensor>& schedule) {
    tk_bindings::raise_if(run_problem(step, a, b, c, a_mn_major, b_mn_major, bias, splits));
    tk_bindings::raise_if(workspace_problem(a, splitk_sums, splitk_arrivals));
    tk_bindings::raise_if(schedule_problem(a, schedule));
    const int64_t M = c.size(0), N = c.size(1);
    const int64_t K = a_mn_major ? a.size(0) : a.size(1);
    const void* bias_ptr = bias && bias->defined() ? bias->data_ptr() : nullptr;
    const c10::cuda::CUDAGuard guard(a.device());
    const int num_sms = sm_count(a.device().index());
    gemm::args g{a.data_ptr(), b.data_ptr(), c.data_ptr(), int(M), int(N), int(K), a_mn_major, b_mn_major,
                 c.scalar_type() == torch::kFloat32, bias_ptr, gelu, int(splits),
                 num_sms, int(variant), c10::cuda::getCurrentCUDAStream().stream()};
    if (splitk_sums && splitk_sums->defined()) {
        g.splitk_sums = splitk_sums->data_ptr<float>();
        g.splitk_arrivals = splitk_arrivals->data_ptr<int>();
        g.splitk_sums_count = splitk_sums->numel();
        g.splitk_arrivals_count = splitk_arrivals->numel();
    }
    if (schedule && schedule->defined()) {
        g.schedule = schedule->data_ptr<int>();
        g.schedule_grid = int(schedule->size(1));
        g.schedule_units = int(schedule->size(0) * schedule->size(1));
    }
    // The launchers return nullptr, or why they refused (an unsupported layout or option for the
    // step) or what failed at launch.
    const char* err = nullptr;
    switch (step) {
        case 1: err = gemm::step1_warp_mma(g); break;
        case 2: err = gemm::step2_cp_async(g); break;
        case 3: err = gemm::step3_wgmma_tma(g); break;
        case 4: err = gemm::step4_warp_specialized(g); break;
        case 5: err = gemm::step5_pingpong(g); break;
    }
    tk_bindings::raise_if_failed(err, "gemm", ("step " + std::to_string(step)).c_str());
}

// The checks alone: "" if run(...) would take these arguments, else the message it would raise
// (without any C++ throw). The launchers' own refusals (layouts or options a step lacks) are
// not included: they come from run itself, as RuntimeError.
std::string check_run(int64_t step, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                      bool a_mn_major, bool b_mn_major, const c10::optional<torch::Tensor>& bias, bool /*gelu*/,
                      int64_t splits, int64_t /*variant*/, const c10::optional<torch::Tensor>& splitk_sums,
                      const c10::optional<torch::Tensor>& splitk_arrivals, const c10::optional<torch::Tensor>& schedule) {
    if (Problem p = run_problem(step, a, b, c, a_mn_major, b_mn_major, bias, splits)) return p.message;
    if (Problem p = workspace_problem(a, splitk_sums, splitk_arrivals)) return p.message;
    return schedule_problem(a, schedule).message;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    // The last three arguments are optional (None): the in-kernel split-K's workspace (step 5 variants
    // 8 and 10; step 4 variant 9) and the scheduled variants' schedule (5v10, 4v9).
    m.def("check_run", &check_run, "'' or what run(...) with the same arguments would raise", py::arg("step"), py::arg("a"),
          py::arg("b"), py::arg("c"), py::arg("a_mn_major"), py::arg("b_mn_major"), py::arg("bias"), py::arg("gelu"),
          py::arg("splits"), py::arg("variant"), py::arg("splitk_sums") = py::none(), py::arg("splitk_arrivals") = py::none(),
          py::arg("schedule") = py::none());
    m.def("run", &run, "C = A·B with one GEMM step (see kernels/gemm.py)", py::arg("step"), py::arg("a"), py::arg("b"),
          py::arg("c"), py::arg("a_mn_major"), py::arg("b_mn_major"), py::arg("bias"), py::arg("gelu"), py::arg("splits"),
          py::arg("variant"), py::arg("splitk_sums") = py::none(), py::arg("splitk_arrivals") = py::none(),
          py::arg("schedule") = py::none());
}

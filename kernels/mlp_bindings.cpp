// kernels/mlp_bindings.cpp — the torch side of the tk_mlp extension: checks every input (a bad
// call is a Python ValueError/TypeError naming the argument, never a crash or garbage),
// allocates the outputs, and runs the GEMMs of kernels/mlp.cu in order.
// Read after kernels/mlp_op.py (which calls `forward` and `backward` from its custom ops, and
// `forward_inference` on the eager path when no gradient is needed) and
// kernels/bindings_checks.h (how a check builds its message and raises it).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>

#include "bindings_checks.h"
#include "mlp.h"

namespace {

using at::Tensor;
using tk_bindings::Problem;
using tk_bindings::dims;
using tk_bindings::dtype_name;
using tk_bindings::device_name;

// "tk_mlp: <name><rest>", built only when a check fails.
std::string say(const char* name, const std::string& rest) { return std::string("tk_mlp: ") + name + rest; }

// A bf16 CUDA matrix of the given shape (-1: any), on x's device (x undefined: t is x),
// contiguous and 16-byte aligned (TMA reads it).
Problem matrix_problem(const Tensor& t, const char* name, int64_t rows, int64_t cols, const Tensor& x) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!t.defined()) return value_problem(say(name, " is missing"));
    if (!t.is_cuda())
        return value_problem(say(name, " must be a CUDA tensor, got one on " + device_name(t) +
                                           "; move it with .cuda() or use --kernels_mlp=torch"));
    if (x.defined() && t.device() != x.device())
        return value_problem(say(name, " is on " + device_name(t) + " but x is on " + device_name(x)));
    if (t.scalar_type() != at::kBFloat16)
        return type_problem(say(name, " must be bfloat16, got " + dtype_name(t) +
                                          " (run under torch.autocast(dtype=torch.bfloat16) or cast it)"));
    if (t.dim() != 2)
        return value_problem(say(name, " must be a 2-D matrix, got shape " + dims(t.sizes()) +
                                           " (flatten the batch and time dimensions first)"));
    if ((rows >= 0 && t.size(0) != rows) || (cols >= 0 && t.size(1) != cols))
        return value_problem(say(name, " must have shape " + dims({rows, cols}) + ", got " + dims(t.sizes())));
    if (!t.is_contiguous())
        return value_problem(say(name, " must be contiguous, got strides " + dims(t.strides()) + "; call .contiguous() on it"));
    if (!tk_bindings::aligned16(t))
        return value_problem(say(name, " must start 16-byte aligned (it is a view at an odd offset); pass a fresh tensor or .clone() it"));
    return {};
}

// An optional bias: a contiguous bf16 vector of length n on x's device.
Problem bias_problem(const c10::optional<Tensor>& b, const char* name, int64_t n, const Tensor& x) {
    using tk_bindings::type_problem, tk_bindings::value_problem;
    if (!b || !b->defined()) return {};
    if (!b->is_cuda() || b->device() != x.device())
        return value_problem(say(name, " must be on x's device " + device_name(x) + ", got one on " + device_name(*b)));
    if (b->scalar_type() != at::kBFloat16) return type_problem(say(name, " must be bfloat16, got " + dtype_name(*b)));
    if (b->dim() != 1 || b->size(0) != n)
        return value_problem(say(name, " must have shape (" + std::to_string(n) + ",), got " + dims(b->sizes())));
    if (!b->is_contiguous()) return value_problem(say(name, " must be contiguous; call .contiguous() on it"));
    return {};
}

// x [M][C], w_fc [H][C], w_proj [C][H]: the sizes every call shares.
Problem sizes_problem(int64_t M, int64_t C, int64_t H) {
    using tk_bindings::value_problem;
    if (M < 1 || M >= (int64_t(1) << 31))
        return value_problem("tk_mlp: x must have between 1 and 2^31-1 rows (tokens), got " + std::to_string(M));
    if (C % 64 != 0 || C < 64)
        return value_problem("tk_mlp: the embedding size (x's last dimension) must be a positive multiple of 64, got " +
                             std::to_string(C) + "; use --kernels_mlp=torch for other sizes");
    if (H % 64 != 0 || H < 64)
        return value_problem("tk_mlp: the hidden size (w_fc's first dimension) must be a positive multiple of 64, got " +
                             std::to_string(H) + "; use --kernels_mlp=torch for other sizes");
    return {};
}

// x, w_fc and w_proj, which every call takes: x [M][C], w_fc [H][C], w_proj [C][H].
Problem weights_problem(const Tensor& x, const Tensor& w_fc, const Tensor& w_proj) {
    if (Problem p = matrix_problem(x, "x", -1, -1, Tensor())) return p;
    const int64_t M = x.size(0), C = x.size(1);
    if (Problem p = matrix_problem(w_fc, "w_fc", -1, C, x)) return p;
    const int64_t H = w_fc.size(0);
    if (Problem p = sizes_problem(M, C, H)) return p;
    return matrix_problem(w_proj, "w_proj", C, H, x);
}

Problem forward_problem(const Tensor& x, const Tensor& w_fc, const c10::optional<Tensor>& b_fc, const Tensor& w_proj,
                        const c10::optional<Tensor>& b_proj) {
    if (Problem p = weights_problem(x, w_fc, w_proj)) return p;
    if (Problem p = bias_problem(b_fc, "b_fc", w_fc.size(0), x)) return p;
    return bias_problem(b_proj, "b_proj", x.size(1), x);
}

Problem backward_problem(const Tensor& dy, const Tensor& x, const Tensor& pre, const Tensor& h, const Tensor& w_fc,
                         const Tensor& w_proj) {
    if (Problem p = weights_problem(x, w_fc, w_proj)) return p;
    const int64_t M = x.size(0), C = x.size(1), H = w_fc.size(0);
    if (Problem p = matrix_problem(dy, "dy", M, C, x)) return p;
    if (Problem p = matrix_problem(pre, "pre", M, H, x)) return p;
    return matrix_problem(h, "h", M, H, x);
}

// Which kernel schedule each of the five GEMMs runs (tk_mlp::SCHEDULE_*; 0 = auto by shape), and
// whether the dGELU GEMM's idle producer warps do the backward's side jobs (zero the weight
// gradients' split-K buffer, sum dy's columns for db_proj) instead of separate fill and
// reduction kernels. Set from Python (kernels/mlp_op.py set_schedule, or the TK_MLP_SCHEDULE
// environment variable) so one process can time several. Order: c_fc forward, c_proj
// forward, dGELU, dx, weight gradients, side jobs (1 on, 0 off), pre by TMA in the dGELU GEMM
// (1: dgelu_pre_tma_epilogue, whose side job also pipelines dy's column sums; 0: per-thread
// loads, the default; kernels/mlp_epilogues.cuh), then session 5's two: the dGELU epilogue's
// cheaper form (fast: dgelu_fast / dgelu_pre_tma_fast; the default) and the backward's tail in
// one kernel (finish: kernels/mlp_finish.cu instead of two torch reductions and four casts;
// opt-in), and session 6's c_fc epilogue's cheaper forms (fcfast=1: bias_gelu_fast and its
// evaluation twin; fcfast=2: the same values staged by stmatrix; fcfast=3: deferred on step 4, h
// from the bf16 pre; opt-in) and c_proj's and dx's stores
// under the next tile's math on step 4 (defer: bias_deferred; opt-in). (Session 5's gprime flag lost on the H200 and was removed: NOTES.md,
// session 5 M; so was session 6's fast=2, the dGELU epilogue deferred on step 4: NOTES.md, session 6 M.)
// Session 7 (opt-in): fast=3, the dGELU epilogue deferred on step 4's tile in half boxes with pre
// by TMA (kernels/mlp_dgelu_deferred.cu; on other schedules as fast=1; its one-loop form fast=4 lost
// on the H200 and was removed), and fcfast=4 (the default in session 7), c_fc's the same way
// (kernels/mlp_fc_deferred.cu; fcfast=3's values); fcfast=5, as 4 but
// the forward saves gelu'(pre) where pre was and the backward's dGELU multiplies by it (step 4 only;
// the backward is told what its forward saved: pre_holds_gelu_grad; the default in sessions 8-9).
// Session 8: fcfast=6, 5 for an MLP without biases (GPT-2's bias=False) and 4 with. Session 9: fcfast=9,
// 5's parts on a leaner k-step (kernels/mlp_fc_deferred.cu, kernels/mlp_deferred.cuh; tests passed on the
// H200 in session 10, the MLP 0.5-0.6% faster); its fcfast=7 (quarter boxes) and
// fcfast=8 (whole boxes, the consumers taking turns) lost on the H200 and were removed. Session 10
// (opt-in): fcfast=10, 9 with the backward's dGELU GEMM on the lean k-step too (gemm_args::dgelu_lean), and
// fcfast=11, 10 with that GEMM's product one packed bf16x2 multiply a pair when no db1 is wanted (the
// default since session 10's call 2: 143 tests passed, the MLP 1.2-1.3% faster than fcfast=9).
enum product { FC = 0, PROJ, DGELU, DX, DW, PRODUCTS };
constexpr int FLAG_VALUES = 6;                 // side, pre, fast, finish, fcfast, defer
int schedules[PRODUCTS] = {0, 0, 0, 0, 0};
int side_jobs = 1;                             // 0 off, 1 on (dy's column sums one row load at a time), 2 on with
                                               // those sums 8 row loads in flight (session 8, opt-in)
bool pre_tma = false;
int fast_dgelu = 1;                            // default since session 5 (calls 2 and 3: dGELU -8% under ncu); 3: session 7, opt-in
bool finish_kernel = true;                     // default since session 7 (was false: two torch reductions and four casts)
int fast_gelu = 11;                            // session 6 (fcfast=1, 2 or 3), 7 (4, 5), 8 (6: 5 for an MLP without biases,
                                               // 4 with), 9 (9: 5 on a lean k-step) and 10 (10: 9 with a lean dGELU k-step;
                                               // 11: 10 with dGELU's packed product);
                                               // 11 the default since session 10 (call 2; 9 after call 1, 5 since
                                               // session 8, 4 since 7, 0 before)

// What c_fc's training forward saves in pre under the fcfast flag: gelu'(pre) (fcfast=5, 9, 10 and 11;
// fcfast=6 when the MLP has no biases, GPT-2's bias=False) or pre itself. "Has biases" is b_fc or b_proj
// given in the forward, bias_grads in the backward (autograd asks for bias gradients exactly then).
bool saves_gelu_grad(bool has_biases) { return fast_gelu == 5 || fast_gelu >= 9 || (fast_gelu == 6 && !has_biases); }
bool defer_store = false;                      // session 6 (defer=1), opt-in

void set_schedule(const std::vector<int64_t>& s) {
    using tk_bindings::raise_if;
    using tk_bindings::value_problem;
    if (s.size() != PRODUCTS + FLAG_VALUES)
        raise_if(value_problem("tk_mlp: set_schedule takes 11 values (fc, proj, dgelu, dx, dw, side jobs, pre by TMA, "
                               "fast dGELU, finish kernel, fast c_fc epilogue, deferred stores), got " + std::to_string(s.size())));
    for (int i = 0; i < PRODUCTS; ++i)
        if (s[i] < 0 || s[i] > 10 || !tk_mlp::valid_schedule(int(s[i])))
            raise_if(value_problem("tk_mlp: a schedule is 0 (auto), 4 (step 4), 5 (ping-pong 128x128), 6 (ping-pong 64x256), "
                                   "7 (ping-pong 128x128, 2-CTA clusters), 8 (ping-pong 64x256, 2-CTA clusters), 9 (step 4, 2-CTA clusters) "
                                   "or 10 (ping-pong 64x256, 5 stages), got " +
                                   std::to_string(s[i])));
    if (s[PRODUCTS] < 0 || s[PRODUCTS] > 2)
        raise_if(value_problem("tk_mlp: the side-jobs flag is 0, 1 or 2, got " + std::to_string(s[PRODUCTS])));
    if (s[PRODUCTS + 1] != 0 && s[PRODUCTS + 1] != 1)
        raise_if(value_problem("tk_mlp: the pre-by-TMA flag is 0 or 1, got " + std::to_string(s[PRODUCTS + 1])));
    if (s[PRODUCTS + 2] != 0 && s[PRODUCTS + 2] != 1 && s[PRODUCTS + 2] != 3)
        raise_if(value_problem("tk_mlp: the fast-dGELU flag is 0, 1 or 3 (2 and 4 were removed), got " + std::to_string(s[PRODUCTS + 2])));
    if (s[PRODUCTS + 3] != 0 && s[PRODUCTS + 3] != 1)
        raise_if(value_problem("tk_mlp: the finish-kernel flag is 0 or 1, got " + std::to_string(s[PRODUCTS + 3])));
    if (s[PRODUCTS + 4] < 0 || s[PRODUCTS + 4] > 11 || s[PRODUCTS + 4] == 7 || s[PRODUCTS + 4] == 8)
        raise_if(value_problem("tk_mlp: the fast-c_fc-epilogue flag is 0 to 6 or 9 to 11 (7 and 8 were removed), got " +
                               std::to_string(s[PRODUCTS + 4])));
    if (s[PRODUCTS + 4] >= 5 && ((s[FC] != 0 && s[FC] != 4) || (s[DGELU] != 0 && s[DGELU] != 4) || s[PRODUCTS + 1] != 0))
        raise_if(value_problem("tk_mlp: fcfast=5, 6, 9, 10 and 11 (gelu'(pre) saved in place of pre) run c_fc and the dGELU GEMM on "
                               "schedule 4 only (fc and dgelu 0 or 4, pre=0)"));
    if (s[PRODUCTS + 5] != 0 && s[PRODUCTS + 5] != 1)
        raise_if(value_problem("tk_mlp: the deferred-stores flag is 0 or 1, got " + std::to_string(s[PRODUCTS + 5])));
    for (int i = 0; i < PRODUCTS; ++i) schedules[i] = int(s[i]);
    side_jobs = int(s[PRODUCTS]);
    pre_tma = s[PRODUCTS + 1] == 1;
    fast_dgelu = int(s[PRODUCTS + 2]);
    finish_kernel = s[PRODUCTS + 3] == 1;
    fast_gelu = int(s[PRODUCTS + 4]);
    defer_store = s[PRODUCTS + 5] == 1;
}
std::vector<int64_t> get_schedule() {
    std::vector<int64_t> out(schedules, schedules + PRODUCTS);
    out.push_back(side_jobs);
    out.push_back(pre_tma ? 1 : 0);
    out.push_back(fast_dgelu);
    out.push_back(finish_kernel ? 1 : 0);
    out.push_back(fast_gelu);
    out.push_back(defer_store ? 1 : 0);
    return out;
}

tk_mlp::gemm_args base_args(const Tensor& x, product which) {
    tk_mlp::gemm_args g{};
    g.schedule = schedules[which];
    cudaDeviceGetAttribute(&g.num_sms, cudaDevAttrMultiProcessorCount, x.device().index());
    g.splits = 1;
    g.stream = c10::cuda::getCurrentCUDAStream().stream();
    return g;
}

void raise_if_launch_failed(const char* err, const char* what) { tk_bindings::raise_if_failed(err, "tk_mlp", what); }

const void* ptr_or_null(const c10::optional<Tensor>& t) { return t && t->defined() ? t->data_ptr() : nullptr; }

// The forward's two GEMMs. Returns [y, pre, h]: pre = x·w_fcᵀ + b_fc (gelu'(pre) in its place when
// saves_gelu_grad: fcfast=11, the default, 5, 9 and 10, or 6 without biases), h = GELU(pre), y = h·w_projᵀ +
// b_proj. keep_pre = false (evaluation, forward_inference): c_fc's epilogue writes h alone
// (gemm_args::c = nullptr; kernels/mlp_inference.cu), no (M, H) pre is allocated or written and
// pre comes back undefined; y is bit-identical either way (the same math, schedules and
// summation order).
std::vector<Tensor> run_forward(const Tensor& x, const Tensor& w_fc, const c10::optional<Tensor>& b_fc,
                                const Tensor& w_proj, const c10::optional<Tensor>& b_proj, bool keep_pre) {
    tk_bindings::raise_if(forward_problem(x, w_fc, b_fc, w_proj, b_proj));
    const int64_t M = x.size(0), C = x.size(1), H = w_fc.size(0);
    const c10::cuda::CUDAGuard guard(x.device());

    Tensor pre = keep_pre ? at::empty({M, H}, x.options()) : Tensor();
    Tensor h = at::empty({M, H}, x.options()), y = at::empty({M, C}, x.options());
    tk_mlp::gemm_args g = base_args(x, FC);
    g.a = x.data_ptr(); g.b = w_fc.data_ptr(); g.c = keep_pre ? pre.data_ptr() : nullptr; g.c2 = h.data_ptr();
    g.M = int(M); g.N = int(H); g.K = int(C); g.bias = ptr_or_null(b_fc);
    const bool has_biases = (b_fc && b_fc->defined()) || (b_proj && b_proj->defined());
    g.fast_gelu = fast_gelu == 6 ? (saves_gelu_grad(has_biases) ? 5 : 4) : fast_gelu;   // (5 and 4: the same h)
    raise_if_launch_failed(tk_mlp::linear_bias_gelu(g), keep_pre ? "c_fc forward (x·w_fcᵀ + b_fc, GELU)"
                                                                 : "c_fc forward, evaluation (GELU(x·w_fcᵀ + b_fc), no pre)");

    g = base_args(x, PROJ);
    g.a = h.data_ptr(); g.b = w_proj.data_ptr(); g.c = y.data_ptr();
    g.M = int(M); g.N = int(C); g.K = int(H); g.bias = ptr_or_null(b_proj);
    g.defer_store = defer_store ? 1 : 0;
    raise_if_launch_failed(tk_mlp::linear_bias(g), "c_proj forward (h·w_projᵀ + b_proj)");
    return {y, pre, h};
}

std::vector<Tensor> forward(const Tensor& x, const Tensor& w_fc, const c10::optional<Tensor>& b_fc,
                            const Tensor& w_proj, const c10::optional<Tensor>& b_proj) {
    return run_forward(x, w_fc, b_fc, w_proj, b_proj, /*keep_pre=*/true);
}

// Evaluation: y alone (run_forward without pre).
Tensor forward_inference(const Tensor& x, const Tensor& w_fc, const c10::optional<Tensor>& b_fc,
                         const Tensor& w_proj, const c10::optional<Tensor>& b_proj) {
    return run_forward(x, w_fc, b_fc, w_proj, b_proj, /*keep_pre=*/false)[0];
}

// Session 13 (the default; mlp_op's TK_MLP_DW_GEMM=tk turns it off): the two weight gradients on
// cuBLAS instead of the tk split-K GEMM below. Why: at GPT-2's 32768 tokens the tk dW kernel takes
// ~224 us a product in the training step against ~213 for cuBLAS's split-K (201.6 + an 11 us reduce,
// session 13's profile): six exposed reduce-add epilogues per CTA (kernels/NOTES.md, sessions 8-10);
// the GPT-2 step was 0.36 ms faster with cuBLAS (session 13, call 1). The other four products stay on tk.
bool dw_on_cublas = true;
void set_dw_on_cublas(bool on) { dw_on_cublas = on; }
bool get_dw_on_cublas() { return dw_on_cublas; }

// dW = Aᵀ·B over the tokens, split-K reduce-added into dw (fp32, zeroed); the caller casts it.
// With dw_on_cublas: cuBLAS writes the fp32 product into dw (torch's mm with out_dtype: bf16 in,
// fp32 accumulate and out; dw need not be zeroed).
void weight_grad(const Tensor& a, const Tensor& b, const Tensor& x, const Tensor& dw, const char* what) {
    if (dw_on_cublas) {
        Tensor out = dw;
        at::mm_out(out, a.t(), b, at::kFloat);
        return;
    }
    const int64_t tokens = a.size(0), M = a.size(1), N = b.size(1);
    tk_mlp::gemm_args g = base_args(x, DW);
    g.a = a.data_ptr(); g.b = b.data_ptr(); g.c = dw.data_ptr();
    g.M = int(M); g.N = int(N); g.K = int(tokens);
    g.splits = tk_mlp::choose_splits(g.M, g.N, g.K, g.num_sms, g.schedule);
    raise_if_launch_failed(tk_mlp::weight_grad(g), what);
}

// Returns [dx, dw_fc, db_fc, dw_proj, db_proj] (all bf16). bias_grads = false (session 5; a model
// without biases): db_fc and db_proj come back empty (0 elements), dy's column sums and both bias
// reductions are skipped, and with the fast dGELU policies so are db1's partial sums.
// pre_holds_gelu_grad (session 8): what the forward saved in `pre`: 1 gelu'(pre) (its c_fc ran with
// fcfast=5, 9, 10 or 11, or 6 without biases), 0 pre itself, -1 (the default, for direct callers) as the fcfast
// flag says now (saves_gelu_grad(bias_grads)). The
// autograd paths pass what their forward ran, so a schedule changed between forward and backward
// cannot make the dGELU GEMM read one for the other; gelu'(pre) always takes the one-product dGELU
// kernel (step 4's tile, whatever the dgelu schedule).
// dw_float (session 10, lead; mlp_op's fp32-weight path, TK_MLP_DW_FLOAT): dw_fc and dw_proj come
// back in fp32, straight from their split-K buffer, for fp32 weights under autocast: no finish launch
// and no bf16 round trip that autograd's cast would turn back into fp32. Without biases only (their
// sums are the finish kernel's other job).
std::vector<Tensor> backward(const Tensor& dy, const Tensor& x, const Tensor& pre, const Tensor& h,
                             const Tensor& w_fc, const Tensor& w_proj, bool bias_grads, int64_t pre_holds_gelu_grad,
                             bool dw_float) {
    tk_bindings::raise_if(backward_problem(dy, x, pre, h, w_fc, w_proj));
    if (dw_float && bias_grads)
        tk_bindings::raise_if(tk_bindings::value_problem("tk_mlp: dw_float=True (fp32 weight gradients) is for an MLP without "
                                                         "biases; pass bias_grads=False, or dw_float=False"));
    if (pre_holds_gelu_grad < -1 || pre_holds_gelu_grad > 1)
        tk_bindings::raise_if(tk_bindings::value_problem("tk_mlp: pre_holds_gelu_grad is -1 (as the fcfast flag says), 0 (pre) or 1 "
                                                         "(gelu'(pre), fcfast=5/9/10/11's forward), got " + std::to_string(pre_holds_gelu_grad)));
    const int64_t M = x.size(0), C = x.size(1), H = w_fc.size(0);
    const c10::cuda::CUDAGuard guard(x.device());

    // Both weight gradients' fp32 split-K buffers in one allocation, zeroed by the dGELU GEMM's
    // idle warps (side jobs on) or by one fill; with side jobs the same warps also sum dy's
    // columns per CTA for db_proj, so no kernel re-reads dy for it.
    const int64_t HC = H * C;
    // (cuBLAS's weight gradients overwrite the buffer: no zeroing then)
    Tensor dw_buf = side_jobs || dw_on_cublas ? at::empty({2 * HC}, x.options().dtype(at::kFloat))
                                              : at::zeros({2 * HC}, x.options().dtype(at::kFloat));

    // dpre = (dy·w_proj) ⊙ GELU'(pre), with db_fc's partial column sums per 16 rows
    Tensor dpre = at::empty({M, H}, x.options());
    // db1's partials: session 5's fast policies skip them when no bias gradient is wanted;
    // sessions 3-4's always write them
    const bool saved_grad = pre_holds_gelu_grad < 0 ? saves_gelu_grad(bias_grads) : pre_holds_gelu_grad == 1;
    const bool partials = bias_grads || !(fast_dgelu || saved_grad);
    Tensor partial = partials ? at::empty({(M + 15) / 16, H}, x.options().dtype(at::kFloat)) : Tensor();
    tk_mlp::gemm_args g = base_args(x, DGELU);
    const bool dy_sums = side_jobs && bias_grads;     // the side job's column sums of dy, for db_proj
    Tensor colsum = dy_sums ? at::empty({g.num_sms, C}, x.options().dtype(at::kFloat)) : Tensor();
    g.a = dy.data_ptr(); g.b = w_proj.data_ptr(); g.c = dpre.data_ptr();
    g.M = int(M); g.N = int(H); g.K = int(C); g.pre = pre.data_ptr();
    g.bias_grad_partial = partials ? partial.data_ptr<float>() : nullptr;
    g.pre_tma = pre_tma ? 1 : 0;
    g.fast_dgelu = saved_grad ? 5 : fast_dgelu;        // fcfast=5's forward saved gelu'(pre) in pre's place
    if (saved_grad) { g.schedule = tk_mlp::SCHEDULE_STEP4; g.pre_tma = 0; }   // its kernel's only tile
    // fcfast=10 (opt-in) / 11 (the default since session 10): on the lean k-step / and the packed product; the same values
    // (whatever the forward ran)
    g.dgelu_lean = !saved_grad ? 0 : fast_gelu == 11 ? 2 : fast_gelu == 10 ? 1 : 0;
    if (side_jobs) {
        if (!dw_on_cublas) { g.zero = dw_buf.data_ptr<float>(); g.zero_floats = 2 * HC; }
        if (dy_sums) g.a_colsum = colsum.data_ptr<float>();
        g.side_pipelined = side_jobs == 2 ? 1 : 0;
    }
    raise_if_launch_failed(tk_mlp::linear_dgelu(g), "dGELU (dy·w_proj ⊙ GELU'(pre))");

    // dx = dpre·w_fc
    Tensor dx = at::empty({M, C}, x.options());
    g = base_args(x, DX);
    g.a = dpre.data_ptr(); g.b = w_fc.data_ptr(); g.c = dx.data_ptr();
    g.M = int(M); g.N = int(C); g.K = int(H);
    g.defer_store = defer_store ? 1 : 0;
    raise_if_launch_failed(tk_mlp::linear_grad_input(g), "dx (dpre·w_fc)");

    weight_grad(dy, h, x, dw_buf.narrow(0, HC, HC).view({C, H}), "dw_proj (dyᵀ·h)");
    weight_grad(dpre, x, x, dw_buf.narrow(0, 0, HC).view({H, C}), "dw_fc (dpreᵀ·x)");
    if (dw_float)                        // (no biases: checked above) the fp32 sums are the gradients
        return {dx, dw_buf.narrow(0, 0, HC).view({H, C}), at::empty({0}, x.options()),
                dw_buf.narrow(0, HC, HC).view({C, H}), at::empty({0}, x.options())};
    if (finish_kernel) {                 // one launch: db_fc, db_proj (with side jobs), both casts
        Tensor dw_fc = at::empty({H, C}, x.options()), dw_proj = at::empty({C, H}, x.options());
        Tensor db_fc = at::empty({bias_grads ? H : 0}, x.options()), db_proj = at::empty({bias_grads ? C : 0}, x.options());
        tk_mlp::finish_args f{};
        if (bias_grads) { f.sum_a = partial.data_ptr<float>(); f.rows_a = int(partial.size(0)); f.cols_a = int(H); f.out_a = db_fc.data_ptr(); }
        if (dy_sums) { f.sum_b = colsum.data_ptr<float>(); f.rows_b = int(colsum.size(0)); f.cols_b = int(C); f.out_b = db_proj.data_ptr(); }
        f.cast_in = dw_buf.data_ptr<float>(); f.cast_n = 2 * HC; f.cast_split = HC;
        f.cast_out0 = dw_fc.data_ptr(); f.cast_out1 = dw_proj.data_ptr();
        f.num_sms = g.num_sms; f.stream = c10::cuda::getCurrentCUDAStream().stream();
        raise_if_launch_failed(tk_mlp::finish_backward(f), "the backward's tail (bias sums, dW casts)");
        if (bias_grads && !side_jobs) db_proj = dy.sum(0, /*keepdim=*/false, at::kFloat).to(at::kBFloat16);
        return {dx, dw_fc, db_fc, dw_proj, db_proj};
    }
    Tensor dw_proj = dw_buf.narrow(0, HC, HC).view({C, H}).to(at::kBFloat16);
    Tensor dw_fc = dw_buf.narrow(0, 0, HC).view({H, C}).to(at::kBFloat16);
    if (!bias_grads) return {dx, dw_fc, at::empty({0}, x.options()), dw_proj, at::empty({0}, x.options())};
    Tensor db_fc = partial.sum(0).to(at::kBFloat16);
    Tensor db_proj = side_jobs ? colsum.sum(0).to(at::kBFloat16)
                               : dy.sum(0, /*keepdim=*/false, at::kFloat).to(at::kBFloat16);
    return {dx, dw_fc, db_fc, dw_proj, db_proj};
}

// The checks alone: "" if forward / backward would take these arguments, else the message they
// would raise (without any C++ throw).
std::string check_forward(const Tensor& x, const Tensor& w_fc, const c10::optional<Tensor>& b_fc, const Tensor& w_proj,
                          const c10::optional<Tensor>& b_proj) {
    return forward_problem(x, w_fc, b_fc, w_proj, b_proj).message;
}

std::string check_backward(const Tensor& dy, const Tensor& x, const Tensor& pre, const Tensor& h, const Tensor& w_fc,
                           const Tensor& w_proj) {
    return backward_problem(dy, x, pre, h, w_fc, w_proj).message;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "tk MLP: c_fc -> GELU(tanh) -> c_proj on fused-epilogue GEMMs (kernels/mlp.cu)";
    m.def("check_forward", &check_forward, "'' or what forward(x, w_fc, b_fc, w_proj, b_proj) would raise",
          py::arg("x"), py::arg("w_fc"), py::arg("b_fc"), py::arg("w_proj"), py::arg("b_proj"));
    m.def("check_backward", &check_backward, "'' or what backward(dy, x, pre, h, w_fc, w_proj) would raise",
          py::arg("dy"), py::arg("x"), py::arg("pre"), py::arg("h"), py::arg("w_fc"), py::arg("w_proj"));
    m.def("set_schedule", &set_schedule,
          "set_schedule([fc, proj, dgelu, dx, dw, side_jobs, pre_tma, fast_dgelu, finish, fast_gelu, defer]): schedules 0 (auto) or "
          "4..10 (kernels/mlp.h), side jobs 0/1/2 (2: dy's column sums pipelined), pre by TMA 0/1, fast dGELU epilogue 0/1/3 (3: deferred, pre by TMA, step 4), finish kernel 0/1, "
          "fast c_fc epilogue 0/1/2/3/4/5/6/9/10/11 (2: staged by stmatrix; 3: deferred on step 4; 4: in half boxes; 5: 4 saving gelu'(pre) for the backward; "
          "6: 5 without biases, 4 with; 9: 5 on a lean k-step; 10: 9 with the dGELU GEMM on the lean k-step too; "
          "11, the default: 10 with dGELU's product packed), deferred c_proj/dx stores on step 4 0/1",
          py::arg("schedules"));
    m.def("get_schedule", &get_schedule, "the eleven values set_schedule last set");
    m.def("set_dw_on_cublas", &set_dw_on_cublas,
          "set_dw_on_cublas(on): the backward's two weight gradients on cuBLAS (True, the default) or the tk split-K GEMM (False)",
          py::arg("on"));
    m.def("get_dw_on_cublas", &get_dw_on_cublas, "True when the weight gradients run on cuBLAS (set_dw_on_cublas)");
    m.def("forward", &forward, "y, pre, h = forward(x, w_fc, b_fc|None, w_proj, b_proj|None)",
          py::arg("x"), py::arg("w_fc"), py::arg("b_fc"), py::arg("w_proj"), py::arg("b_proj"));
    m.def("forward_inference", &forward_inference,
          "y = forward_inference(x, w_fc, b_fc|None, w_proj, b_proj|None): forward's y without writing pre (evaluation)",
          py::arg("x"), py::arg("w_fc"), py::arg("b_fc"), py::arg("w_proj"), py::arg("b_proj"));
    m.def("backward", &backward,
          "dx, dw_fc, db_fc, dw_proj, db_proj = backward(dy, x, pre, h, w_fc, w_proj, bias_grads=True, pre_holds_gelu_grad=-1, "
          "dw_float=False); "
          "bias_grads=False: db_fc and db_proj empty, their work skipped; pre_holds_gelu_grad: 1 the forward saved "
          "gelu'(pre) (fcfast=5, 9, 10, 11), 0 pre, -1 as the current fcfast flag says; dw_float=True (bias_grads=False only): "
          "dw_fc and dw_proj in fp32 (for fp32 weights), no finish kernel",
          py::arg("dy"), py::arg("x"), py::arg("pre"), py::arg("h"), py::arg("w_fc"), py::arg("w_proj"),
          py::arg("bias_grads") = true, py::arg("pre_holds_gelu_grad") = -1, py::arg("dw_float") = false);
}

// kernels/layernorm.h: the plain C++ launchers of kernels/layernorm.cu (no torch types here, so
// nvcc never parses torch headers), called by kernels/layernorm_bindings.cpp after its checks.
//
// Dtypes (layernorm.cu says why they may differ): h = x + residual is stored in x's dtype;
// the residual is x's dtype or bf16; y (and so dy) is x's dtype or bf16. The launchers take
// float32 x with any of those, or bf16 everywhere. Statistics are always fp32.
//
// Dropout of the branch (optional): h = x + dropout(residual). The mask is a pure function of a
// seed on the device and each element's index (layernorm.cu, "dropout"), so the backward
// regenerates it instead of reading a saved mask.
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime.h>

namespace tk_layernorm {

enum class DType { f32, bf16 };

constexpr int MAX_COLS = 4096;    // hidden sizes: multiples of 64 up to this

// Dropout of the residual (the branch): element i is kept when 16 bits of a hash of (*seed, i)
// are >= round(p * 65536), and a kept element is scaled by 1 / (1 - p). seed nullptr: no dropout
// (the kernels without any dropout code run).
struct Dropout {
    const int64_t* seed = nullptr;   // [1] int64 on the device, drawn by the caller for each forward
    double p = 0.0;                  // in [0, 1)
};

struct ForwardArgs {
    const void* x;          // [rows, cols]  x_dtype
    const void* residual;   // [rows, cols]  residual_dtype, or nullptr (then h is not written: h = x)
    const void* weight;     // [cols], fp32 or bf16 (params_bf16)
    const void* bias;       // [cols] or nullptr, same dtype as weight
    bool params_bf16;
    void* y;                // [rows, cols]  y_dtype: y = LN(x + residual)
    void* h;                // [rows, cols]  x_dtype: h = x + residual (nullptr iff residual is)
    float* mean;            // [rows]
    float* rstd;            // [rows]  1 / sqrt(var + eps)
    int64_t rows;
    int cols;
    float eps;
    DType x_dtype;          // x and h
    DType residual_dtype;   // x_dtype or bf16 (ignored without a residual)
    DType y_dtype;          // x_dtype or bf16
    Dropout dropout;        // of the residual (needs one)
};

struct BackwardArgs {
    const void* dy;         // [rows, cols]  y_dtype: gradient of y
    const void* dh;         // [rows, cols]  h_dtype: gradient of h from its other uses, or nullptr
    const void* h;          // [rows, cols]  h_dtype: the saved LayerNorm input
    const float* mean;      // [rows]
    const float* rstd;      // [rows]
    const void* weight;     // [cols], fp32 or bf16 (params_bf16)
    bool params_bf16;
    void* dh_out;           // [rows, cols]  h_dtype: dh + LN's input gradient (= grad of x, and of
                            //               the residual when it has h's dtype)
    void* dresidual_out;    // [rows, cols]  residual_dtype: the residual's gradient, written when its
                            //               dtype differs from h's (bf16 beside fp32 h: dh_out
                            //               rounded) or with dropout (dh_out * mask / (1 - p));
                            //               else nullptr (dh_out is the residual's gradient)
    float* partial;         // [partial_blocks, 2, cols] scratch: per-block dweight, dbias sums
    void* dweight;          // [cols], weight's dtype
    void* dbias;            // [cols], weight's dtype
    int64_t rows;
    int cols;
    DType h_dtype;          // h, dh, dh_out
    DType residual_dtype;   // h_dtype, or bf16 with dresidual_out set
    DType y_dtype;          // dy: h_dtype or bf16
    Dropout dropout;        // the forward's (same seed and p: the same mask)
};

// Runtime choices of grid, block sum, row order and launch, for measuring them against each other
// in one process (kernels/layernorm.cu, "variants", says what each does). All false is session
// 2's plan ("none"); the default plan is layernorm.cu's DEFAULT_PLAN.
struct Variant {
    bool fwd_full_grid = false;   // "fwd_full"
    bool bwd_reverse = false;     // "bwd_reverse"
    bool bwd_tree = false;        // "bwd_tree"
    bool pdl = false;             // "pdl"
    bool fwd_early_pdl = false;   // "fwd_early_pdl" (session 6: opt-in, kernels without dropout)
    bool bwd_l2_first = false;    // "bwd_l2_first"
    bool bwd_l2_first2 = false;   // "bwd_l2_first2"
    bool fwd_lean = false;        // "fwd_lean" (session 8: rows of one warp, no dropout)
    bool bwd_lean = false;        // "bwd_lean" (session 8: the same for the backward)
    bool bwd_wide = false;        // "bwd_wide" (session 9: the lean backward for rows of two warps)
};

// Set the plan from a comma-separated list of flag names ("none" or "": no flag; "default": the
// default plan's); returns "" or, for an unknown name, a message (and changes nothing). The
// process starts with $TK_LAYERNORM_VARIANT, or the default plan when that is unset or empty.
// Read at launch time: a CUDA graph keeps the plan it was captured with.
std::string set_variant(const char* spec);
std::string variant_name();   // the flags on, comma-separated, or "none"

// Rows of fp32 scratch the backward needs (one per block of its persistent grid). Reads the
// dtypes, rows and cols of `a`; -1 for a dtype combination the kernels do not take.
int backward_partial_blocks(const BackwardArgs& a);

// cudaErrorInvalidValue for a dtype combination the kernels do not take (the bindings refuse
// those first, with a message).
cudaError_t forward(const ForwardArgs& a, cudaStream_t stream);
cudaError_t backward(const BackwardArgs& a, cudaStream_t stream);

}  // namespace tk_layernorm

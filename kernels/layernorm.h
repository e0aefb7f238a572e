// kernels/layernorm.h: the plain C++ launchers of kernels/layernorm.cu (no torch types here, so
// nvcc never parses torch headers), called by kernels/layernorm_bindings.cpp after its checks.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace tk_layernorm {

enum class DType { f32, bf16 };   // activations (x, r, h, y, dy, dh); statistics are always fp32

constexpr int MAX_COLS = 4096;    // hidden sizes: multiples of 64 up to this

struct ForwardArgs {
    const void* x;          // [rows, cols]
    const void* residual;   // [rows, cols] or nullptr (then h is not written: h = x)
    const void* weight;     // [cols], fp32 or bf16 (params_bf16)
    const void* bias;       // [cols] or nullptr, same dtype as weight
    bool params_bf16;
    void* y;                // [rows, cols]  y = LN(x + residual)
    void* h;                // [rows, cols]  h = x + residual (nullptr iff residual is)
    float* mean;            // [rows]
    float* rstd;            // [rows]  1 / sqrt(var + eps)
    int64_t rows;
    int cols;
    float eps;
    DType dtype;
};

struct BackwardArgs {
    const void* dy;         // [rows, cols]  gradient of y
    const void* dh;         // [rows, cols]  gradient of h from its other uses, or nullptr
    const void* h;          // [rows, cols]  the saved LayerNorm input
    const float* mean;      // [rows]
    const float* rstd;      // [rows]
    const void* weight;     // [cols], fp32 or bf16 (params_bf16)
    bool params_bf16;
    void* dh_out;           // [rows, cols]  dh + LN's input gradient (= grad of x and residual)
    float* partial;         // [partial_blocks, 2, cols] scratch: per-block dweight, dbias sums
    void* dweight;          // [cols], weight's dtype
    void* dbias;            // [cols], weight's dtype
    int64_t rows;
    int cols;
    DType dtype;
};

// Rows of fp32 scratch the backward needs (one per block of its persistent grid).
int backward_partial_blocks(int64_t rows, int cols, DType dtype);

cudaError_t forward(const ForwardArgs& a, cudaStream_t stream);
cudaError_t backward(const BackwardArgs& a, cudaStream_t stream);

}  // namespace tk_layernorm

// kernels/attention_params.h: the plain-C++ arguments of the attention launchers, shared by
// the kernels (attention_portable.cu) and the torch bindings (attention_bindings.cpp).
// No torch and no CUDA headers here, so both sides can include it.
#pragma once
#include <cstdint>

// One (B, H, T, D) bf16 tensor whose last dimension is contiguous; strides in elements.
// A view of the c_attn output (B, T, 3, H, D) permuted to (B, H, T, D) fits as it is.
struct AttentionTensor {
    void* data;
    int64_t stride_batch, stride_head, stride_seq;
};

struct AttentionShape {
    int batch, heads, seq_len, head_dim;  // head_dim is 64 or 128
    bool causal;
    float scale;                          // softmax(scale * q k^T)
};

struct AttentionForwardParams {
    AttentionShape shape;
    AttentionTensor q, k, v, o;           // o is written
    float* lse;                           // (B, H, T) contiguous, natural log, written
};

struct AttentionBackwardParams {
    AttentionShape shape;
    AttentionTensor q, k, v, o, d_o;      // inputs
    AttentionTensor dq, dk, dv;           // written
    const float* lse;                     // (B, H, T) from the forward pass
    float* d_rowsum;                      // (B, H, T) scratch: D = rowsum(dO * O)
    float* dq_accum;                      // (B, H, T, head_dim) fp32 scratch, zeroed by the launcher
};

// Launchers in attention_portable.cu. They return the CUDA error of the launches (0 = ok).
int attention_portable_forward(const AttentionForwardParams& p, void* cuda_stream);
int attention_portable_backward(const AttentionBackwardParams& p, void* cuda_stream);

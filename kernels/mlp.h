// kernels/mlp.h — the plain C++ face of kernels/mlp.cu (no torch here, so nvcc stays fast):
// one argument struct and the five GEMM launchers the MLP's forward and backward are made of.
// Read kernels/mlp.cu's opening comment for what each one computes and why; the torch side that
// checks inputs and calls these is kernels/mlp_bindings.cpp.
#pragma once
#include <cuda_runtime.h>

namespace tk_mlp {

// Every product is C[M][N] = A·B, bf16 in, fp32 accumulate. Row-major storage throughout; which
// operand is transposed is fixed by the launcher (see each one's comment).
struct gemm_args {
    const void* a;              // bf16
    const void* b;              // bf16
    void* c;                    // the output (bf16, or fp32 for weight_grad)
    void* c2;                   // linear_bias_gelu only: the second output h = GELU(c); there c may
                                //   be nullptr (evaluation): h alone is written, no pre
    int M, N, K;
    const void* bias;           // bf16 [N] added to every row, or nullptr
    const void* pre;            // linear_dgelu only: bf16 [M][N] pre-activation saved by the forward
    float* bias_grad_partial;   // linear_dgelu only: fp32 [ceil(M/16)][N], column sums per 16 rows
                                //   (nullptr with fast_dgelu: no db1, session 5)
    float* zero;                // linear_dgelu only, optional: an fp32 buffer its idle warps zero
    long long zero_floats;      //   (its length, a multiple of 4; 16-byte aligned)
    float* a_colsum;            // linear_dgelu only, optional: fp32 [num_sms][K], column sums of A
                                //   (dy) per CTA: db_proj = the sum of its rows
    int side_pipelined;         // linear_dgelu only, with a_colsum: 1 = those sums with 8 row loads in
                                //   flight per thread (side=2, session 8), 0 = one dependent load per row
                                //   (side=1); pre_tma's policies always pipeline them
    int splits;                 // weight_grad only: split-K factor (c is fp32, zeroed beforehand)
    int num_sms;                // persistent grid size
    int schedule;               // which kernel runs it: SCHEDULE_AUTO (0) or one of the values below
    int pre_tma;                // linear_dgelu only: 1 = pre comes in by TMA into shared memory at the
                                //   tile's start (dgelu_pre_tma_epilogue), 0 = per-thread loads in the
                                //   epilogue (dgelu_epilogue). Schedules 7 and 10 (fewer than 4 staging
                                //   boxes per warp) always take 0.
    int fast_dgelu;             // linear_dgelu only: 1 = the same policy with session 5's cheaper
                                //   epilogue (dgelu_fast / dgelu_pre_tma_fast, kernels/mlp_epilogues.cuh);
                                //   3 = on step 4's tile, that epilogue under the next tile's math with
                                //   pre by TMA (session 7, kernels/mlp_dgelu_deferred.cu), elsewhere as 1;
                                //   5 = the same with pre holding gelu'(pre) (fcfast=5's forward; schedule 4 only)
    int fast_gelu;              // linear_bias_gelu only: 1 = c_fc's epilogue with session 6's cheaper GELU
                                //   and bias (bias_gelu_fast / bias_gelu_h_only_fast, kernels/mlp_epilogues.cuh);
                                //   2 = the same values staged by stmatrix, one fence per box (bias_gelu_stmatrix;
                                //   evaluation as 1); 3 = on step 4, deferred under the next tile's math with h
                                //   from the bf16 pre (bias_gelu_deferred / bias_gelu_h_only_rounded), elsewhere as 2;
                                //   4 = 3's values on step 4's tile in half boxes (session 7, kernels/mlp_fc_deferred.cu),
                                //   on step 4 in clusters as 3, elsewhere as 2; 5 = as 4, but c holds gelu'(pre)
                                //   instead of pre (schedule 4 only; the backward's linear_dgelu then gets
                                //   fast_dgelu = 5 and reads gelu'(pre) from pre); 9 = 5 on a leaner k-step
                                //   (session 9), 10 and 11 (the default since session 10) = the same c_fc as 9
                                //   (the bindings' fcfast=10, 11 also set dgelu_lean in the backward); the bindings'
                                //   fcfast=6 arrives here as 4 or 5 (7 and 8 lost on the H200 and were removed)
    int dgelu_lean;             // linear_dgelu with fast_dgelu = 5 only: 1 = its deferred kernel on the lean
                                //   k-step (kernels/mlp_deferred.cuh, lean_kstep; fcfast=10, session 10, opt-in);
                                //   2 = that, and without db1 one packed bf16x2 multiply per pair (fcfast=11,
                                //   the default since session 10); the same values bit for bit; 0 = the k-step that
                                //   rebuilds its descriptors
    int defer_store;            // linear_bias / linear_grad_input only: 1 = on step 4, the tile's stores
                                //   under the next tile's math (bias_deferred, session 6); elsewhere as 0
    cudaStream_t stream;
};

// The kernel schedules a GEMM can run on (kernels/NOTES.md, "Session 3: GEMM per shape and the
// MLP", has what each measured on the H200):
//   STEP4             engineer D's step 4: both consumers on one 128x256 tile (cooperative);
//                     best where K is long and tile boundaries are rare.
//   PINGPONG_128x128  step 5: each consumer its own 128x128 tile, main loops alternating, so one
//                     consumer's epilogue overlaps the other's math.
//   PINGPONG_64x256   step 5 with 64x256 consumer tiles (one m64n256 wgmma per k16): the fastest
//                     schedule measured for K = 768 with K-major operands (c_fc forward).
//   PINGPONG_128x128_CLUSTER2  step 5 128x128 with CTA pairs sharing each B tile by TMA
//                     multicast: correct; 0.3-0.5x of the others in session 3, not re-measured
//                     since session 4's remote-arrive change brought the 64x256 pairing near its
//                     cluster-less twin (kernels/gemm_5_pingpong.cu); never picked by auto.
//   PINGPONG_64x256_CLUSTER2   the same pairing on 64x256 tiles (session 4, for the cluster
//                     question at K = 768; never picked by auto).
//   STEP4_CLUSTER2    step 4's cooperative 128x256 tile in 2-CTA clusters sharing B (cuBLAS's
//                     "128x256 2x1" design for these shapes; session 4; never picked by auto).
//   PINGPONG_64x256_DEEP  ping-pong 64x256 with 5 stages and one staging box per warp (GEMM step
//                     5 variant 5: 0.81-0.86x cuBLAS on the MLP's two weight-gradient shapes,
//                     where step 4 has 0.78-0.80x, session 4 call 2 and final call; dw=10 in the
//                     final call's mlp_bench: 114 vs 119 µs per dW; not auto's choice yet).
// SCHEDULE_AUTO picks by shape (auto_schedule).
constexpr int SCHEDULE_AUTO = 0, SCHEDULE_STEP4 = 4, SCHEDULE_PINGPONG_128x128 = 5, SCHEDULE_PINGPONG_64x256 = 6,
              SCHEDULE_PINGPONG_128x128_CLUSTER2 = 7, SCHEDULE_PINGPONG_64x256_CLUSTER2 = 8, SCHEDULE_STEP4_CLUSTER2 = 9,
              SCHEDULE_PINGPONG_64x256_DEEP = 10;
inline bool valid_schedule(int s) { return s == 0 || (s >= 4 && s <= 10); }
// The rule SCHEDULE_AUTO applies, from the H200 measurements of session 3 (call 2): ping-pong
// 64x256 when a tile's K loop is short (K <= 1024) and there is no split-K: c_fc's forward,
// 0.293 -> 0.273 ms per MLP forward at M = 16384, C = 768 (plain GEMMs of that shape: 0.70x ->
// 0.78-0.80x cuBLAS). Step 4 everywhere else: long K (c_proj, dx: step 4 0.90x vs ping-pong
// 0.85-0.89x) and the weight gradients (split-K). The dGELU GEMM (B N-major, K = C) measured
// SLOWER on ping-pong than on step 4 in session 3 (backward 0.62-0.64 vs 0.601 ms), and again in
// session 4 (call 2: 192 µs on step 4, 197-206 on ping-pong, per-thread loads or pre by TMA), so
// it stays on step 4; with pre_tma (opt-in) auto gives it ping-pong 64x256 like c_fc.
inline int auto_schedule(int /*M*/, int /*N*/, int K, int splits, bool b_mn_major, bool pre_tma = false) {
    return (K <= 1024 && splits <= 1 && (!b_mn_major || pre_tma)) ? SCHEDULE_PINGPONG_64x256 : SCHEDULE_STEP4;
}

// c_fc's automatic schedule: auto_schedule's, except that fcfast=3 (gemm_args::fast_gelu == 3, c_fc's
// deferred epilogue, session 6) runs on step 4, the one kernel with the DEFERS_STORE hook, and so
// does fcfast=4 (session 7: in half boxes, kernels/mlp_fc_deferred.cu).
inline int fc_auto_schedule(int M, int N, int K, int splits, int fast_gelu) {
    return fast_gelu >= 3 ? SCHEDULE_STEP4 : auto_schedule(M, N, K, splits, /*b_mn_major=*/false);
}

// Each returns nullptr on success, else a message.
// pre = x·W1ᵀ + b1 (c), h = GELU(pre) (c2). a = x [M][K], b = W1 [N][K]. c == nullptr: h only
// (for evaluation, when no backward needs pre); h is bit-identical either way.
const char* linear_bias_gelu(const gemm_args&);
// y = h·W2ᵀ + b2 (bias may be null). a = h [M][K], b = W2 [N][K].
const char* linear_bias(const gemm_args&);
// dpre = (dy·W2) ⊙ GELU'(pre), plus column sums of dpre for db1. a = dy [M][K], b = W2 [K][N].
const char* linear_dgelu(const gemm_args&);
// dx = dpre·W1. a = dpre [M][K], b = W1 [K][N].
const char* linear_grad_input(const gemm_args&);
// dW += Aᵀ·B over the token axis, split-K, fp32 reduce-add into a zeroed c.
// a = dy or dpre stored [K=tokens][M], b = h or x stored [K=tokens][N].
const char* weight_grad(const gemm_args&);

// The backward's small tail in ONE launch (session 5, "finish=1"; replaces two torch reductions
// and four casts): out_a = bf16(column sums of sum_a [rows_a][cols_a]) (db_fc from the dGELU
// GEMM's partials), out_b likewise for sum_b (db_proj from the side job's per-CTA sums; sum_b may
// be nullptr; so may sum_a: no bias sums), and the fp32 weight gradients cast_in [cast_n] -> bf16, the first cast_split
// floats into cast_out0 and the rest into cast_out1. cols_a, cols_b multiples of 16, cast_n and
// cast_split multiples of 4. Deterministic (a fixed summation order).
struct finish_args {
    const float* sum_a; int rows_a, cols_a; void* out_a;
    const float* sum_b; int rows_b, cols_b; void* out_b;
    const float* cast_in; long long cast_n, cast_split; void* cast_out0; void* cast_out1;
    int num_sms;
    cudaStream_t stream;
};
const char* finish_backward(const finish_args&);

// The split-K factor weight_grad should use for an M x N output with K tokens on num_sms SMs,
// for the tile of `schedule` (SCHEDULE_AUTO: what auto picks for split-K, step 4).
int choose_splits(int M, int N, int K, int num_sms, int schedule = SCHEDULE_AUTO);

}  // namespace tk_mlp

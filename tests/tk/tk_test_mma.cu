// tests/tk/tk_test_mma.cu: mma_AB / mma_ABt / mma_AtB / mma_AtBt (and the mm_ forms) against a
// float64 matmul. Operands go global -> shared -> registers in the layout each variant needs
// (col_l through ldmatrix.trans), so this also checks the operand layouts end to end.
// Read after tk_test_memory.cu.
#include "tk_test.cuh"
using namespace tk;

// variant: 0 AB, 1 ABt, 2 AtB, 3 AtBt. a is stored M x K (AB, ABt) or K x M (AtB, AtBt); b is
// stored K x N (AB, AtB) or N x K (ABt, AtBt), all row-major and dense.
template <typename T, int M, int N, int K, int VARIANT>
__global__ void mma_kernel(const T* a, const T* b, const float* c, float* d, int accumulate) {
    constexpr bool at = VARIANT >= 2, bt = VARIANT % 2 == 1;
    constexpr int AR = at ? K : M, AC = at ? M : K, BR = bt ? N : K, BC = bt ? K : N;
    using LA = std::conditional_t<at, col_l, row_l>;
    using LB = std::conditional_t<bt, row_l, col_l>;
    __shared__ st<T, AR, AC> sa;
    __shared__ st<T, BR, BC> sb;
    load(sa, a, AC);
    load(sb, b, BC);
    __syncwarp();
    rt<T, AR, AC, LA> ra;
    rt<T, BR, BC, LB> rb;
    load(ra, sa);
    load(rb, sb);
    rt_fl<M, N> acc;
    if (accumulate) {
        load(acc, c, N);
        if constexpr (VARIANT == 0) mma_AB(acc, ra, rb, acc);
        if constexpr (VARIANT == 1) mma_ABt(acc, ra, rb, acc);
        if constexpr (VARIANT == 2) mma_AtB(acc, ra, rb, acc);
        if constexpr (VARIANT == 3) mma_AtBt(acc, ra, rb, acc);
    } else {
        fill(acc, __int_as_float(0x7fc00000));   // NaN: mm_ must not read the old accumulator
        if constexpr (VARIANT == 0) mm_AB(acc, ra, rb);
        if constexpr (VARIANT == 1) mm_ABt(acc, ra, rb);
        if constexpr (VARIANT == 2) mm_AtB(acc, ra, rb);
        if constexpr (VARIANT == 3) mm_AtBt(acc, ra, rb);
    }
    store(d, acc, N);
}

template <typename T, int M, int N, int K, int V>
int launch_mma(const void* a, const void* b, const float* c, float* d, int accumulate) {
    mma_kernel<T, M, N, K, V><<<1, 32>>>((const T*)a, (const T*)b, c, d, accumulate);
    return finish_launch();
}

TK_TEST_API int tk_mma(int dtype, int m, int n, int k, int variant, const void* a, const void* b,
                       const float* c, float* d, int accumulate) {
#define TK_MMA(DT, T, M, N, K)                                                     \
    if (dtype == DT && m == M && n == N && k == K) {                             \
        if (variant == 0) return launch_mma<T, M, N, K, 0>(a, b, c, d, accumulate); \
        if (variant == 1) return launch_mma<T, M, N, K, 1>(a, b, c, d, accumulate); \
        if (variant == 2) return launch_mma<T, M, N, K, 2>(a, b, c, d, accumulate); \
        if (variant == 3) return launch_mma<T, M, N, K, 3>(a, b, c, d, accumulate); \
    }
    TK_MMA(DT_BF16, bf16, 32, 48, 64)
    TK_MMA(DT_BF16, bf16, 16, 16, 16)
    TK_MMA(DT_F16, half, 16, 32, 32)
#undef TK_MMA
    return -1;
}

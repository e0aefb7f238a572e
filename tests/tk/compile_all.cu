// tests/tk/compile_all.cu: instantiates every tk type and op over several sizes, dtypes and both
// layouts, so that tests/test_tk_compile.py (nvcc for sm_90a and sm_80, no GPU needed) fails the
// moment any of them stops compiling. Nothing here is run. Read top to bottom: types, then
// memory ops, maps, reductions/broadcasts, conversions, masks, mma, then the kernels that
// instantiate it all. The warpgroup half (gl, mbarriers, TMA, wgmma, setmaxnreg) is
// instantiated in tests/tk/compile_group.cu.
#include "tk/tk.cuh"

using namespace tk;

// ---- every register-tile op for one (dtype, rows, cols, layout) ----
template <typename T, int R, int C, typename L>
__device__ void register_tile_ops(T* g, float* gf, int stride) {
    using RT = rt<T, R, C, L>;
    RT a, b, c;
    typename RT::col_vec cv;       // one value per row
    typename RT::row_vec rv_;      // one value per column
    rv<float, R, typename RT::col_vec::layout> cvf;
    load(a, g, stride);
    load(b, g, stride, R - 3);
    // maps
    zero(c); one(c); pos_infty(c); neg_infty(c); fill(c, 2.5f);
    copy(c, a); neg(c, a); abs(c, a); relu(c, a); exp(c, a); exp2(c, a); log(c, a); log2(c, a);
    sqrt(c, a); rsqrt(c, a);
    add(c, a, b); sub(c, a, b); mul(c, a, b); div(c, a, b); max(c, a, b); min(c, a, b);
    add(c, a, 1.0f); sub(c, a, 1.0f); mul(c, a, 1.0f); div(c, a, 1.0f); max(c, a, 1.0f); min(c, a, 1.0f);
    // reductions and broadcasts
    row_max(cv, a); row_min(cv, a); row_sum(cv, a); row_max(cv, a, cv); row_sum(cvf, a, cvf);
    col_max(rv_, a); col_min(rv_, a); col_sum(rv_, a); col_sum(rv_, a, rv_);
    add_row(c, c, cv); sub_row(c, c, cv); mul_row(c, c, cvf); div_row(c, c, cv); max_row(c, c, cv); min_row(c, c, cv);
    add_col(c, c, rv_); sub_col(c, c, rv_); mul_col(c, c, rv_); div_col(c, c, rv_); max_col(c, c, rv_); min_col(c, c, rv_);
    broadcast_row(b, cv); broadcast_col(b, rv_);
    // vector maps and moves
    exp(cv, cv); add(cv, cv, cv); mul(cv, cv, 0.5f); zero(rv_); neg_infty(cvf); copy(cv, cvf);
    load(cv, g); store(g, cv); store(gf, cvf);
    // conversions
    rt<float, R, C, L> af; copy(af, a); copy(a, af);
    rt<T, R, C, transpose_layout<L>> swapped; swap_layout(swapped, a); swap_layout(a, swapped);
    rt<T, C, R, transpose_layout<L>> tsep; transpose_sep(tsep, a);
    rt<T, C, R, L> tr; transpose(tr, a);
    // masks
    tril(c, c, 0); triu(c, c, -5, -INFINITY); right_fill(c, c, C - 1); left_fill(c, c, 1);
    lower_fill(c, c, R - 1, 1.0f); upper_fill(c, c, 2);
    mask_map(c, c, [](int r, int col) { return (r + col) % 2 == 0; }, 0.0f);
    store(g, c, stride); store(g, c, stride, R - 1); store(gf, af, stride);
    store(g + R * stride, tr, R); store(g, swapped, stride); store(g, tsep, R);
}

// ---- shared tile moves for one (dtype, rows, cols): each swizzle width, both layouts ----
template <typename T, int R, int C, scope G>
__device__ void shared_tile_ops(T* g, float* gf, int stride) {
    __shared__ st<T, R, C> s;
    __shared__ sv<T, C> v;
    load<G>(s, g, stride);
    load<G>(s, g, stride, R / 2);
    load_async<G>(s, g, stride, R - 1);
    cp_async_commit();
    cp_async_wait<0>();
    G::sync(1);
    rt<T, R / G::warps, C, row_l> a;
    rt<T, R / G::warps, C, col_l> b;
    rt<float, R / G::warps, C, row_l> af;
    rt<float, R / G::warps, C, col_l> bf;
    load<G>(a, s); load<G>(b, s); load<G>(af, s); load<G>(bf, s);
    rt<T, 16, 16, row_l> piece;
    load(piece, s, R - 16, C - 16);
    store(s, piece, 0, 0);
    store<G>(s, a); store<G>(s, b); store<G>(s, af); store<G>(s, bf);
    store<G>(g, s, stride); store<G>(g, s, stride, 5);
    load<G>(v, g); store<G>(g, v);
    typename rt<float, 16, C, row_l>::row_vec r;
    load(r, v); store(v, r);
    load<G>(af, g, stride); store<G>(gf, af, stride, 7);
    static_assert(st<T, R, C>::offset(0, 0) == 0);
}

// ---- mma over every operand layout combination ----
template <typename T, int M, int N, int K>
__device__ void mma_ops(float* out) {
    rt<T, M, K, row_l> a_row; rt<T, K, M, col_l> a_col;
    rt<T, K, N, col_l> b_col; rt<T, N, K, row_l> b_row;
    zero(a_row); zero(a_col); zero(b_col); zero(b_row);
    rt_fl<M, N> d;
    mm_AB(d, a_row, b_col); mma_AB(d, a_row, b_col, d);
    mm_ABt(d, a_row, b_row); mma_ABt(d, a_row, b_row, d);
    mm_AtB(d, a_col, b_col); mma_AtB(d, a_col, b_col, d);
    mm_AtBt(d, a_col, b_row); mma_AtBt(d, a_col, b_row, d);
    store(out, d, N);
}

// A misuse must not compile: the concepts reject a col_l tile as the A operand of mma_AB.
template <typename D, typename A, typename B>
concept can_mma_AB = requires(D& d, const A& a, const B& b) { mma_AB(d, a, b, d); };
static_assert(can_mma_AB<rt_fl<16, 16>, rt_bf<16, 16, row_l>, rt_bf<16, 16, col_l>>);
static_assert(!can_mma_AB<rt_fl<16, 16>, rt_bf<16, 16, col_l>, rt_bf<16, 16, col_l>>);
static_assert(!can_mma_AB<rt_bf<16, 16>, rt_bf<16, 16, row_l>, rt_bf<16, 16, col_l>>);
static_assert(!can_mma_AB<rt_fl<16, 16>, rt_fl<16, 16, row_l>, rt_fl<16, 16, col_l>>);
// The swizzle width follows the row width (hopper-facts §3).
static_assert(st_bf<64, 16>::swizzle_bytes == 32 && st_bf<64, 32>::swizzle_bytes == 64);
static_assert(st_bf<64, 64>::swizzle_bytes == 128 && st_bf<64, 192>::num_blocks == 3);
static_assert(st_fl<16, 16>::swizzle_bytes == 64 && st_fl<16, 32>::swizzle_bytes == 128);
static_assert(st_bf<64, 48>::swizzle_bytes == 32 && alignof(st_bf<64, 64>) == 1024);
static_assert(st_bf<8 * 2, 64>::offset(1, 0) == 128 + 16 && st_bf<16, 64>::offset(9, 8) == 9 * 128 + ((1 ^ 1) << 4));

// Every offset of a tile against hopper-facts §3.3 as the doc writes it (16-byte chunk index XOR
// row bits, per column block of the swizzle width), evaluated by the compiler: a wrong swizzle
// fails CI without a GPU. The GPU test checks the same table from device code.
template <typename ST> constexpr bool swizzle_matches_doc() {
    constexpr int esize = int(sizeof(typename ST::dtype)), span = ST::swizzle_bytes;
    constexpr int shift = span == 128 ? 0 : span == 64 ? 1 : 2, mask = span / 16 - 1;
    for (int r = 0; r < ST::rows; r++)
        for (int c = 0; c < ST::cols; c++) {
            const int b = c / (span / esize), cc = c % (span / esize);
            const int chunk = cc * esize / 16, inner = cc * esize % 16;
            const int doc = b * ST::rows * span + r * span + ((chunk ^ ((r >> shift) & mask)) << 4) + inner;
            if (int(ST::offset(r, c)) != doc) return false;
        }
    return true;
}
static_assert(swizzle_matches_doc<st_bf<16, 16>>() && swizzle_matches_doc<st_bf<32, 32>>());
static_assert(swizzle_matches_doc<st_bf<64, 64>>() && swizzle_matches_doc<st_bf<32, 128>>());
static_assert(swizzle_matches_doc<st_bf<16, 48>>() && swizzle_matches_doc<st_fl<32, 32>>());
static_assert(swizzle_matches_doc<st_fl<16, 16>>() && swizzle_matches_doc<st_hf<64, 192>>());

template <typename T, typename L> __global__ void k_register(T* g, float* gf, int stride) {
    register_tile_ops<T, 16, 16, L>(g, gf, stride);
    register_tile_ops<T, 32, 64, L>(g, gf, stride);
    register_tile_ops<T, 48, 16, L>(g, gf, stride);
}
template <typename T> __global__ void k_shared(T* g, float* gf, int stride) {
    shared_tile_ops<T, 16, 16, warp>(g, gf, stride);
    shared_tile_ops<T, 32, 32, warp>(g, gf, stride);
    shared_tile_ops<T, 64, 64, warpgroup>(g, gf, stride);
    if constexpr (sizeof(T) == 2) shared_tile_ops<T, 64, 128, warpgroup>(g, gf, stride);
    shared_tile_ops<T, 32, 48, group<2>>(g, gf, stride);
}
__global__ void k_mma(float* out) {
    mma_ops<bf16, 16, 16, 16>(out);
    mma_ops<bf16, 32, 48, 64>(out);
    mma_ops<half, 16, 32, 32>(out);
}
__global__ void k_warp_reduce(float* out) {
    float x = out[threadIdx.x];
    out[threadIdx.x] = warp_sum(x) + warp_max(x) + warp_min(x);
    extern __shared__ char smem[];
    shared_allocator al(smem);
    auto& t = al.allocate<st_bf<64, 64>>();
    auto(&ts)[2] = al.allocate<st_bf<64, 64>, 2>();
    t(0, 0) = ts[1](0, 0);
}

template __global__ void k_register<float, row_l>(float*, float*, int);
template __global__ void k_register<float, col_l>(float*, float*, int);
template __global__ void k_register<bf16, row_l>(bf16*, float*, int);
template __global__ void k_register<bf16, col_l>(bf16*, float*, int);
template __global__ void k_register<half, row_l>(half*, float*, int);
template __global__ void k_register<half, col_l>(half*, float*, int);
template __global__ void k_shared<bf16>(bf16*, float*, int);
template __global__ void k_shared<half>(half*, float*, int);
template __global__ void k_shared<float>(float*, float*, int);

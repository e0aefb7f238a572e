// tests/tk/compile_group.cu: instantiates every warpgroup-scope piece of tk (tk/types/global.cuh,
// tk/ops/group/sync.cuh, tma.cuh, wgmma.cuh and tma_4d.cuh) so that tests/test_tk_compile.py fails
// the moment one of them stops compiling. Built for sm_90a, where they are real instructions that
// ptxas checks, and for sm_80, where the headers' TK_SM90 / TK_HOPPER guards must still let them
// compile (to nothing). Nothing here runs: the kernels are never launched and host_side() is
// never called. compile_all.cu does the same for the warp-scope half.
// Read top to bottom: compile-time facts, sync (mbarriers, fences, named barriers, elect,
// setmaxnreg), TMA (tiles of every swizzle through several gl's, raw 3-D and 4-D boxes), wgmma
// (every N, A from shared or registers, both major-nesses), then host_side(): gl construction
// (which encodes the TMA descriptors), the 4-D map, and the launches that instantiate the kernels.
#include <string>
#include "tk/tk.cuh"

using namespace tk;
using wgmma::major;

// ---- compile-time facts the kernels rely on ----
static_assert(tma_tile<st_bf<64, 64>> && tma_tile<st_fl<16, 16>> && !tma_tile<int>);
static_assert(tma_box<st_bf<64, 128>>::blocks == 2 && tma_box<st_bf<64, 128>>::cols == 64 &&
              tma_box<st_bf<64, 128>>::block_bytes == 64 * 128);
static_assert(tma_box<st_bf<64, 48>>::blocks == 3 && tma_box<st_bf<128, 16>>::cols == 16);
static_assert(tma::bytes<st_bf<64, 128>> == 64 * 128 * 2 && tma::bytes<st_fl<16, 16>> == 1024);
static_assert(tma_dtype<bf16>() == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 &&
              tma_dtype<half>() == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 && tma_dtype<float>() == CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
static_assert(int(dim<64>()) == 64 && int(dim<runtime>(17)) == 17 && std::is_empty_v<dim<64>>);
static_assert(index_of<float, int, float, char>::value == 1);
static_assert(wgmma::swizzle_code(128) == 1 && wgmma::swizzle_code(64) == 2 && wgmma::swizzle_code(32) == 3 &&
              wgmma::swizzle_code(0) == 0);  // descriptor codes, not the TMA enum
static_assert(wgmma::accumulator<256>::cols == 256 && sizeof(wgmma::accumulator<32>) == 16 * sizeof(float));

// ---- sync: a producer warpgroup and two consumers, every mbarrier / fence / barrier call ----
template <int producer_regs, int consumer_regs>
__global__ void __launch_bounds__(384, 1) k_sync(int* out) {
    __shared__ mbarrier full, empty[2];
    if (threadIdx.x == 0) {
        mbar::init(full, 1);
        mbar::init(empty[0], 256);
        mbar::init(empty[1], 2);
        mbar::fence_init();
    }
    __syncthreads();
    const int wg = warpgroup::groupid();
    if (wg == 0) {
        warpgroup_decrease_registers<producer_regs>();
        mbar::wait(empty[0], 1);
        if (warpgroup::warpid() == 0 && elect_one()) {
            mbar::expect_bytes(full, 512);
            mbar::arrive_expect_bytes(full, 512);
        }
        named_arrive<256>(1);
    } else {
        warpgroup_increase_registers<consumer_regs>();
        mbar::wait(full, 0);
        out[threadIdx.x] = mbar::test(empty[1], 1);
        fence_proxy_async();
        named_sync<256>(1);
        named_sync<128>(1 + wg);
        warpgroup::sync(4 + wg);
        mbar::arrive(empty[0]);
        if (warpgroup::thread_rank() == 0) mbar::arrive(empty[1]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar::invalidate(full);
        mbar::invalidate(empty[0]);
        mbar::invalidate(empty[1]);
    }
}

// ---- TMA: every tile op for tile type S of view G (tile and batch coordinates at run time) ----
template <typename G, typename S>
__device__ void tma_tile_ops(const G& g, S& s, mbarrier& bar, int i) {
    tma::prefetch(g.template tma<S>());
    mbar::arrive_expect_bytes(bar, 2 * tma::bytes<S>);
    tma::load_async(s, g, i, 1, bar);
    tma::load_async(s, g, 0, i, bar, 2);
    mbar::wait(bar, 0);
    fence_proxy_async();
    tma::store_async(g, s, i, 0);
    tma::store_async(g, s, 1, i, 3);
    tma::store_add_async(g, s, i, 2);
    tma::store_add_async(g, s, 0, 0, i);
    tma::store_commit_group();
    tma::store_wait_read<1>();
    tma::store_wait_read();
    tma::store_wait<1>();
    tma::store_wait();
}

template <typename G, typename... S>
__global__ void k_tma(const __grid_constant__ G g, int i) {
    extern __shared__ char smem[];
    shared_allocator al(smem);
    __shared__ mbarrier bar;
    if (threadIdx.x == 0) {
        mbar::init(bar, 1);
        mbar::fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) (tma_tile_ops(g, al.allocate<S>(), bar, i), ...);
    g(0, i, threadIdx.x) = g(i, int(g.rows) - 1, int(g.cols) - 1);  // the view's own element access
}

// Raw boxes: a 3-D map from make_tensor_map and a 4-D (batch, heads, seq, dim) map.
__global__ void k_tma_boxes(const __grid_constant__ CUtensorMap map3, const __grid_constant__ CUtensorMap map4, int i) {
    __shared__ st_bf<64, 64> box;
    __shared__ mbarrier bar;
    if (threadIdx.x == 0) {
        mbar::init(bar, 1);
        mbar::fence_init();
        mbar::arrive_expect_bytes(bar, 2 * sizeof(box));
        tma::load_box(smem_addr(&box), &map3, 0, i, 0, bar);
        tma::load_box_4d(smem_addr(&box), &map4, 0, i, 1, 2, bar);
        mbar::wait(bar, 0);
        tma::store_box(&map3, smem_addr(&box), 64, i, 0);
        tma::store_add_box(&map3, smem_addr(&box), 0, 0, i);
        tma::store_commit_group();
        tma::store_wait();
    }
}

// ---- wgmma: one k-step of every operand combination the API offers, output width N ----
// A_K: A as rows = M (64) x cols = K, K-major; B_K: rows = N x cols = K. The MN-major tiles are
// the transposes (rows = K). A from registers is each warp's mma.sync A fragment of 16 rows.
// The tile widths pick the swizzle, so the instantiations below cover 32, 64 and 128 B.
template <int N, typename A_K, typename B_K>
__global__ void __launch_bounds__(128, 1) k_wgmma(float* out, int k_steps) {
    using A_MN = st_bf<A_K::cols, 64>;
    using B_MN = st_bf<B_K::cols, N>;
    extern __shared__ char smem[];
    shared_allocator al(smem);
    auto& a_k = al.allocate<A_K>();
    auto& a_mn = al.allocate<A_MN>();
    auto& b_k = al.allocate<B_K>();
    auto& b_mn = al.allocate<B_MN>();
    rt_bf<16, 16, row_l> a_reg;
    load(a_reg, a_k, 16 * warpgroup::warpid(), 0);
    const uint32_t(&a_frag)[4] = reinterpret_cast<const uint32_t(&)[4]>(a_reg.tiles[0][0].data);

    wgmma::accumulator<N> acc;
    wgmma::fence();
    for (int k = 0; k < k_steps; ++k) {
        wgmma::mma_ss<major::K, major::K>(acc, wgmma::desc<major::K>(a_k, 0, k), wgmma::desc<major::K>(b_k, 0, k), k > 0);
        wgmma::mma_ss<major::MN, major::K>(acc, wgmma::desc<major::MN>(a_mn, 0, k), wgmma::desc<major::K>(b_k, 0, k), 1);
        wgmma::mma_ss<major::K, major::MN>(acc, wgmma::desc<major::K>(a_k, 0, k), wgmma::desc<major::MN>(b_mn, 0, k), 1);
        wgmma::mma_ss<major::MN, major::MN>(acc, wgmma::desc<major::MN>(a_mn, 0, k), wgmma::desc<major::MN>(b_mn, 0, k), 1);
        wgmma::mma_rs<major::K>(acc, a_frag, wgmma::desc<major::K>(b_k, 0, k), 1);
        wgmma::mma_rs<major::MN>(acc, a_frag, wgmma::desc<major::MN>(b_mn, 0, k), 1);
        // The raw overload: an address, the tile's row count and a swizzle span given by hand.
        wgmma::mma_ss<major::K, major::K>(acc, wgmma::desc<major::K, 64, A_K::swizzle_bytes>(smem_addr(&a_k), 0, k),
                                          wgmma::desc<major::K, N, B_K::swizzle_bytes>(smem_addr(&b_k), 0, k), 1);
        wgmma::commit_group();
        wgmma::wait_group<1>();
    }
    wgmma::wait_group();
    wgmma::fence_operand(acc);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) out[acc.row(i) * N + acc.col(i)] = acc.d[i];
    // Descriptors of a bf16 tile from the tile overload (it refuses other dtypes: the
    // instructions are bf16) and make_desc directly.
    __shared__ st_bf<64, 64> h;
    out[N * 64] = float(wgmma::desc<major::K>(h, 0, 1) ^ wgmma::desc<major::MN>(h, 16, 1) ^
                        wgmma::make_desc(smem_addr(&h), 16, 1024, 128));
}

// ---- views: compile-time and run-time dimensions, every dtype, tiles of every swizzle ----
using gl_dyn = gl<bf16, runtime, runtime, st_bf<64, 64>, st_bf<128, 64>, st_bf<64, 128>>;  // 128 B; 2 boxes
using gl_fixed = gl<bf16, 1024, 768, st_bf<64, 32>, st_bf<128, 16>, st_bf<64, 48>>;       // 64 B, 32 B, 3 boxes
using gl_half = gl<half, runtime, 256, st_hf<64, 64>, st_hf<256, 32>>;                    // box of 256 rows
using gl_f32 = gl<float, 4096, runtime, st_fl<64, 32>, st_fl<16, 16>, st_fl<32, 64>>;     // 128 B, 64 B, 2 boxes
using gl_plain = gl<bf16, runtime, runtime>;                                              // no TMA map

// ---- host: never called (it would need a GPU). Building a gl encodes its TMA descriptors;
// launching passes it as a __grid_constant__ and instantiates each kernel above. ----
void host_side(bf16* xb, half* xh, float* xf, float* out, int* flags) {
    gl_dyn a(xb, 2, 1000, 768);
    gl_fixed b(xb, 1, 1024, 768);
    gl_half c(xh, 3, 77, 256);
    gl_f32 d(xf, 1, 4096, 96);
    gl_plain e(xb, 1, 5, 7);
    CUtensorMap map3 = make_tensor_map<bf16, st_bf<64, 64>>(xb, 1, 64, 64), map4{};
    std::string why = tma::make_bhtd_tensor_map(&map4, xb, 2, 12, 1023, 64, 12 * 1023 * 64, 1023 * 64, 64, 64);
    if (!why.empty() || a.tma<st_bf<64, 128>>() == d.tma<st_fl<16, 16>>() || !tensor_map_encoder())
        throw std::runtime_error(why);
    e(0, 4, 6) = a(1, 999, 767);

    k_sync<24, 240><<<1, 384>>>(flags);
    k_sync<40, 232><<<1, 384>>>(flags);
    k_tma<gl_dyn, st_bf<64, 64>, st_bf<128, 64>, st_bf<64, 128>><<<1, 128, 64 << 10>>>(a, 1);
    k_tma<gl_fixed, st_bf<64, 32>, st_bf<128, 16>, st_bf<64, 48>><<<1, 128, 32 << 10>>>(b, 1);
    k_tma<gl_half, st_hf<64, 64>, st_hf<256, 32>><<<1, 128, 48 << 10>>>(c, 1);
    k_tma<gl_f32, st_fl<64, 32>, st_fl<16, 16>, st_fl<32, 64>><<<1, 128, 32 << 10>>>(d, 1);
    k_tma<gl_plain><<<1, 32>>>(e, 1);
    k_tma_boxes<<<1, 32>>>(map3, map4, 1);
    k_wgmma<32, st_bf<64, 16>, st_bf<32, 16>><<<1, 128, 16 << 10>>>(out, 1);    // 32 B swizzles
    k_wgmma<64, st_bf<64, 32>, st_bf<64, 32>><<<1, 128, 32 << 10>>>(out, 2);    // 64 B
    k_wgmma<128, st_bf<64, 64>, st_bf<128, 64>><<<1, 128, 64 << 10>>>(out, 4);  // 128 B
    k_wgmma<256, st_bf<64, 64>, st_bf<256, 64>><<<1, 128, 96 << 10>>>(out, 4);  // 128 B, B_MN of 4 boxes
}

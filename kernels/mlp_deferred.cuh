// kernels/mlp_deferred.cuh — session 7: the MLP's fused epilogues run UNDER the next tile's math,
// in parts, on step 4's cooperative 128x256 tile. One kernel template (a variant of
// gemm4::gemm_ws_kernel, kernels/gemm_4_warp_specialized.cuh: same producer, same work order,
// same wgmmas; only the consumer's loop differs) and its launcher; the two policies that use it
// live in kernels/mlp_dgelu_deferred.cu (the backward's dGELU, "fast=3", opt-in) and
// kernels/mlp_fc_deferred.cu (c_fc's bias + GELU, "fcfast=4"; with gelu'(pre) for the backward "fcfast=5",
// session 8's default, whose dGELU is the deferred one here with one product per value; "fcfast=9", 5 on
// the lean k-step below; "fcfast=11", the default since session 10, runs the dGELU kernel on it too). Read kernels/gemm_4_warp_specialized.cuh
// and kernels/gemm_plain_epilogue.cuh (stmatrix staging, G's deferred plain stores, variant 8) first.
//
// Why: in the cooperative kernel both consumer warpgroups finish a tile together, so the tensor
// cores idle for the whole epilogue. G's variant 8 (session 6) packs the accumulators to bf16
// registers at the tile's end, starts the next tile's wgmmas at once, and stores box ch of the
// held tile right after k-step ch's wgmmas are issued: the plain product then beat cuBLAS at K =
// 768. The MLP's epilogues are heavier (a GELU or GELU' per value, two outputs for c_fc, pre to
// read for dGELU): a whole box's work after one k-step (~500-700 instructions per warp, two warps
// per scheduler) can outlast the ~1000 cycles of tensor work it should hide behind. So here a
// held tile's epilogue is cut into PARTS (half boxes: 8 for a 16 x 256 warp slab), each after one
// of the next tile's first k-steps (part_at_step says which), and anything the epilogue reads
// (dGELU's pre) arrives by TMA into shared memory many k-steps before it is needed: per-thread
// global loads inside the k-loop (session 6's fast=2) stalled the wgmma issue behind each load's
// trip to memory.
//
// The policy interface (besides gemm4's begin_tile/side_job, of which only side_job is used):
//   NBUF                       staging buffers per consumer warp (16 x 64 bf16 each), each with an
//                              mbarrier for an input box landing in it
//   PEEL_STEPS, part_at_step(s)   the first PEEL_STEPS k-steps are written out, and after
//                              k-step s the held tile's part part_at_step(s) runs (-1: none;
//                              every one of the policy's PARTS parts at exactly one s)
//   LEAN_KSTEP (optional)      true: the k-step's issue from stage addresses and descriptors computed
//                              once (lean_kstep below; c_fc's under fcfast=9, 10, 11; the dGELU
//                              GEMM's under fcfast=10 and 11, the default since session 10)
//   struct held                what a tile leaves in registers for its parts (e.g. bf16 pairs)
//   hold(held, acc, pos)       at a tile's end
//   run_part<P>(bufs, bars, held, sh, lane)   part P of the held tile (P a compile-time number)
//   INPUT_BOXES                input boxes the KERNEL requests per tile (0: none); input i is
//   input_step(i)              requested after k-step input_step(i) (or after the k-loop when K is
//                              short): load_input_box(bufs, bars, i, pos, sh), lane 0. (A policy
//                              may request more itself, from its parts.)
//
// The first PEEL_STEPS k-steps of a tile are written out one by one (a compile-time part index,
// so the held registers are addressed by constants; ~8 copies of a half box's code, each run once
// per tile in a straight line), then the rest of the k-loop. (Session 7's other form, one k-loop
// with the part picked at run time by selects, "fast=4", was no faster on the H200 and was
// removed: kernels/NOTES.md, session 7 M; code at 777f4c7.)
//
// Read in order: the shared memory, the kernel, the launcher.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include "mlp.h"
#include "mlp_epilogues.cuh"

namespace tk_mlp::detail::deferred {
using gemm4::BM;
using gemm4::BN;

// Shared memory: step 4's operand ring, NBUF staging buffers per consumer warp, a barrier per buffer.
template <typename Cfg, major MB, typename Epi> struct smem_t {
    using L = gemm4::layout<Cfg, major::K, MB, Epi>;
    typename L::a_tile a[Cfg::STAGES];
    typename L::b_tile b[Cfg::STAGES];
    gemm4::out_tile<bf16> c[gemm4::CONSUMERS][4][Epi::NBUF];   // [consumer][warp][buffer]
    mbarrier full[Cfg::STAGES], empty[Cfg::STAGES];
    mbarrier input_full[gemm4::CONSUMERS][4][Epi::NBUF];       // an input box has landed in c[..][..][b]
};

// lean_kstep (session 9, a policy's LEAN_KSTEP = true; c_fc's fcfast=9, the default's c_fc and dGELU since session 10): a k-step's issue without
// recomputing, every k-step, the shared-memory window of the stage's tiles and barrier and each
// wgmma's descriptor from scratch (call 2's ncu: ~100 instructions per k-step and warp here, ~98 in
// the k-loop; every instruction a consumer adds cost the tensor pipe ~1.3 cycles): the addresses
// of stage 0 are taken once, a stage's two descriptors are built once per k-step and stepped by a
// constant per k. SASS (sm_90a, fcfast=5's values): the k-loop's step 98 -> 58 instructions, a
// peeled step with its part ~30-40 fewer. On the H200 (session 10's first call, c_fc at M = 32768):
// 11 M fewer warp instructions, 364.7 -> 344.3 µs under ncu, the MLP 0.5-0.6% faster, outputs
// bit-identical. The MN-major B (the dGELU GEMM's W2) steps 16 rows of 128 bytes per k.
template <typename Epi>
constexpr bool lean_kstep = [] {
    if constexpr (requires { Epi::LEAN_KSTEP; }) return bool(Epi::LEAN_KSTEP);
    else return false;
}();

// try_wait on an mbarrier given by its shared address (mbar::wait converts a reference each call)
__device__ inline void wait_parity(uint32_t bar, uint32_t phase) {
#ifdef TK_SM90
    asm volatile("{\n .reg .pred p;\n"
                 "WAIT_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}" :: "r"(bar), "r"(phase) : "memory");
#endif
}

template <typename Cfg, major MB, typename Epi>
__global__ void __launch_bounds__(gemm4::THREADS, 1)
parts_kernel(const __grid_constant__ typename gemm4::layout<Cfg, major::K, MB, Epi>::params p) {
    constexpr int STAGES = Cfg::STAGES, NBUF = Epi::NBUF;
    using S = smem_t<Cfg, MB, Epi>;
    extern __shared__ char smem_raw[];
    shared_allocator alloc(smem_raw);
    auto& s = alloc.template allocate<S>();
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar::init(s.full[i], 1);
            mbar::init(s.empty[i], gemm4::CONSUMERS * 4);
        }
        for (int i = 0; i < gemm4::CONSUMERS * 4 * NBUF; ++i) mbar::init(s.input_full[i / (4 * NBUF)][(i / NBUF) % 4][i % NBUF], 1);
        mbar::fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        // ================= producer (step 4's) and the policy's side jobs =================
        warpgroup_decrease_registers<40>();
        if (threadIdx.x == 0) gemm4::produce<STAGES, major::K, MB>(s, p.A, p.B, p.sh);
        else if (threadIdx.x >= 32) p.epi.side_job(threadIdx.x - 32, 96, p.sh);
        return;
    }
    // ================= consumers =================
    warpgroup_increase_registers<232>();
    const int c = wg - 1, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    auto& bufs = s.c[c][warp];
    auto& bars = s.input_full[c][warp];
    wgmma::accumulator<BN> acc;
    // (lean_kstep only) shared addresses and descriptor steps computed once, not per k-step
    using L = gemm4::layout<Cfg, major::K, MB, Epi>;
    [[maybe_unused]] const uint32_t full0 = smem_addr(&s.full[0]), a0 = smem_addr(&s.a[0]), b0 = smem_addr(&s.b[0]);
    constexpr uint32_t A_BYTES = sizeof(typename L::a_tile), B_BYTES = sizeof(typename L::b_tile);
    constexpr int A_ROWS = L::a_tile::rows, B_ROWS = L::b_tile::rows;
    static_assert(!lean_kstep<Epi> || (L::a_tile::swizzle_bytes == 128 && L::b_tile::swizzle_bytes == 128 &&
                                       Cfg::BK * 2 <= 128), "lean_kstep: 128-byte swizzled operands, a stage's K in one column block");
    // one k-step of 16 along K moves a descriptor's start (in 16-byte units) by 32 bytes (K-major) or
    // by 16 swizzled rows (MN-major): what wgmma::desc gives for k against k = 0, without carries
    constexpr uint64_t DK_A = (16 * 2) >> 4, DK_B = MB == major::K ? (16 * 2) >> 4 : (16 * 128) >> 4;
    typename Epi::held held{};
    bool holding = false;
    int it = 0;                                        // k-steps run so far (the ring's position)
    // One pass per tile of this CTA, plus a last pass without a tile for the last held tile's parts.
    for (int unit = blockIdx.x;; unit += gridDim.x) {
        const bool tile = unit < p.sh.units;
        if (!tile && !holding) break;
        const gemm4::work w = tile ? gemm4::unit_work(p.sh, unit) : gemm4::work{0, 0, 0, 0};   // no tile: no k-steps
        const tile_pos pos{w.tm * BM + 64 * c + 16 * warp, w.tn * BN, lane / 4, lane % 4, BN};
        int requested = 0;                             // this tile's input boxes requested so far
        // one k-step's wgmmas (issued, not waited for)
        auto issue = [&](int kt) {
            if constexpr (lean_kstep<Epi>) {           // c_fc's fcfast=9-11, dGELU's 10-11: see lean_kstep
                const uint32_t stage = uint32_t(it) % STAGES;
                wait_parity(full0 + stage * uint32_t(sizeof(mbarrier)), (uint32_t(it) / STAGES) & 1);
                wgmma::fence();
                const uint64_t da = wgmma::desc<major::K, A_ROWS, 128>(a0 + stage * A_BYTES, 64 * c, 0),
                               db = wgmma::desc<MB, B_ROWS, 128>(b0 + stage * B_BYTES, 0, 0);
#pragma unroll
                for (int k = 0; k < Cfg::BK / 16; ++k)
                    wgmma::mma_ss<major::K, MB>(acc, da + k * DK_A, db + k * DK_B, kt > w.k_begin || k > 0);
                wgmma::commit_group();
            } else {
                const int stage = it % STAGES;
                mbar::wait(s.full[stage], (it / STAGES) & 1);
                wgmma::fence();
#pragma unroll
                for (int k = 0; k < Cfg::BK / 16; ++k)
                    wgmma::mma_ss<major::K, MB>(acc, wgmma::desc<major::K>(s.a[stage], 64 * c, k),
                                                wgmma::desc<MB>(s.b[stage], 0, k), kt > w.k_begin || k > 0);
                wgmma::commit_group();
            }
        };
        // after k-step kt's issue and its part: the input box due now (policy's choice of step), then,
        // once the previous k-step's wgmmas are done, free its stage. (Freeing it before the part was
        // considered: in steady state the stage is freed at the same time either way while a part is
        // shorter than a k-step, and the part would lose the slack of the previous k-step's tail.)
        auto after = [&](int kt) {
            if constexpr (Epi::INPUT_BOXES > 0) {
                const int step = kt - w.k_begin;
                if (requested < Epi::INPUT_BOXES && step == Epi::input_step(requested)) {
                    if (lane == 0) p.epi.load_input_box(bufs, bars, requested, pos, p.sh);
                    __syncwarp();                      // (wgmma's wait below is .aligned: the warp converged)
                    ++requested;
                }
            }
            if (kt > w.k_begin) {
                wgmma::wait_group<1>();
                if (lane == 0) mbar::arrive(s.empty[(it - 1) % STAGES]);
            }
        };
        int kt = w.k_begin;
        [&]<int... S>(std::integer_sequence<int, S...>) {
            ([&] {
                const bool step_here = kt < w.k_end;
                if (step_here) issue(kt);
                constexpr int P = Epi::part_at_step(S);
                if constexpr (P >= 0)                  // (no k-step when K is short: the part still runs)
                    if (holding) p.epi.template run_part<P>(bufs, bars, held, p.sh, lane);
                if (step_here) { after(kt); ++kt; ++it; }
            }(), ...);
        }(std::make_integer_sequence<int, Epi::PEEL_STEPS>{});
        for (; kt < w.k_end; ++kt, ++it) {
            issue(kt);
            after(kt);
        }
        wgmma::wait_group<0>();                        // (also on the pass without a tile: ptxas cannot tell it issued nothing)
        if (!tile) break;
        if (lane == 0) mbar::arrive(s.empty[(it - 1) % STAGES]);
        wgmma::fence_operand(acc);
        if constexpr (Epi::INPUT_BOXES > 0) {          // a short K loop: the input boxes not yet requested
            if (lane == 0)
                for (int b = requested; b < Epi::INPUT_BOXES; ++b) p.epi.load_input_box(bufs, bars, b, pos, p.sh);
            __syncwarp();
        }
        p.epi.hold(held, acc, pos);
        holding = true;
    }
    if (lane == 0) tma::store_wait<0>();
}

// C[M][N] = A·B through policy Epi on parts_kernel (no split-K). A is [M][K] K-major; B is [N][K]
// (MB = K) or [K][N] (MB = MN). Returns nullptr or a message.
template <typename Cfg, major MB, typename Epi>
const char* launch(const gemm_args& g) {
    using L = gemm4::layout<Cfg, major::K, MB, Epi>;
    using P = typename L::params;
    constexpr int smem_bytes = sizeof(smem_t<Cfg, MB, Epi>) + 1024;   // + alignment slack
    static_assert(smem_bytes <= 232448, "shared memory over the 227 KB a block may use");
    static thread_local std::string msg;
    static bool configured = false;
    if (g.M <= 0 || g.N <= 0 || g.K <= 0) return "tk_mlp: empty GEMM";
    if (g.splits > 1) return "tk_mlp: the deferred-epilogue kernels do not split K";
    auto kernel = parts_kernel<Cfg, MB, Epi>;
    if (!configured) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess)
            return "tk_mlp: could not reserve shared memory for a deferred-epilogue kernel (needs a Hopper GPU)";
        configured = true;
    }
    try {
        auto* a = static_cast<bf16*>(const_cast<void*>(g.a));
        auto* b = static_cast<bf16*>(const_cast<void*>(g.b));
        P p{typename L::a_gl(a, 1, g.M, g.K),
            typename L::b_gl(b, 1, MB == major::K ? g.N : g.K, MB == major::K ? g.K : g.N),
            {g.M, g.N, g.K, (g.M + BM - 1) / BM, (g.N + BN - 1) / BN, (g.K + Cfg::BK - 1) / Cfg::BK, 1, 0}, Epi::make(g)};
        p.sh.units = p.sh.tiles_m * p.sh.tiles_n;
        const int grid = std::min(p.sh.units, std::max(g.num_sms, 1));
        kernel<<<grid, gemm4::THREADS, smem_bytes, g.stream>>>(p);
    } catch (const std::exception& e) {
        msg = e.what();
        return msg.c_str();
    }
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace tk_mlp::detail::deferred

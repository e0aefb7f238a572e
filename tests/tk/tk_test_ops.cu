// tests/tk/tk_test_ops.cu: maps, reductions, broadcasts, masks, conversions and vector moves on
// a 32 x 64 register tile (fp32 or bf16, row_l or col_l), one op per launch, selected by `op`
// (the codes are listed in tests/test_tk_ops.py). Inputs and outputs are fp32 in global memory.
// Read after tk_test_mma.cu.
#include "tk_test.cuh"
using namespace tk;

constexpr int R = 32, C = 64;

template <typename T, typename L>
__global__ void tile_op_kernel(const float* a_in, const float* b_in, const float* per_row_in, const float* per_col_in,
                               float* out, float* vec_out, int op, float scalar, int iarg) {
    using RT = rt<T, R, C, L>;
    RT a, b, d;
    typename RT::col_vec pr, vr;   // one value per row
    typename RT::row_vec pc, vc;   // one value per column
    load(a, a_in, C);
    load(b, b_in, C);
    load(pr, per_row_in);
    load(pc, per_col_in);
    copy(d, a);
    switch (op) {
        // maps
        case 0: exp(d, a); break;
        case 1: exp2(d, a); break;
        case 2: log(d, a); break;
        case 3: add(d, a, b); break;
        case 4: sub(d, a, b); break;
        case 5: mul(d, a, b); break;
        case 6: div(d, a, b); break;
        case 7: max(d, a, b); break;
        case 8: min(d, a, b); break;
        case 9: add(d, a, scalar); break;
        case 10: mul(d, a, scalar); break;
        case 11: neg(d, a); break;
        case 12: abs(d, a); break;
        case 13: relu(d, a); break;
        case 14: sqrt(d, a); break;
        case 15: rsqrt(d, a); break;
        case 16: zero(d); break;
        case 17: one(d); break;
        case 18: neg_infty(d); break;
        case 19: pos_infty(d); break;
        case 20: fill(d, scalar); break;
        case 21: copy(d, a); break;
        case 22: log2(d, a); break;
        case 23: sub(d, a, scalar); break;
        case 24: div(d, a, scalar); break;
        case 25: max(d, a, scalar); break;
        case 26: min(d, a, scalar); break;
        // reductions -> vec_out (length R for row_*, C for col_*)
        case 30: row_max(vr, a); store(vec_out, vr); break;
        case 31: row_min(vr, a); store(vec_out, vr); break;
        case 32: row_sum(vr, a); store(vec_out, vr); break;
        case 33: row_max(vr, a, pr); store(vec_out, vr); break;
        case 34: row_sum(pr, a, pr); store(vec_out, pr); break;    // in place: dst == accumulator
        case 35: col_max(vc, a); store(vec_out, vc); break;
        case 36: col_min(vc, a); store(vec_out, vc); break;
        case 37: col_sum(vc, a); store(vec_out, vc); break;
        case 38: col_sum(vc, a, pc); store(vec_out, vc); break;
        case 39: col_max(pc, a, pc); store(vec_out, pc); break;
        // broadcasts
        case 40: add_row(d, a, pr); break;
        case 41: sub_row(d, a, pr); break;
        case 42: mul_row(d, a, pr); break;
        case 43: div_row(d, a, pr); break;
        case 44: max_row(d, a, pr); break;
        case 45: min_row(d, a, pr); break;
        case 46: broadcast_row(d, pr); break;
        case 47: add_col(d, a, pc); break;
        case 48: sub_col(d, a, pc); break;
        case 49: mul_col(d, a, pc); break;
        case 50: div_col(d, a, pc); break;
        case 51: max_col(d, a, pc); break;
        case 52: min_col(d, a, pc); break;
        case 53: broadcast_col(d, pc); break;
        // masks (iarg: diagonal or limit, scalar: fill)
        case 60: tril(d, a, iarg, scalar); break;
        case 61: triu(d, a, iarg, scalar); break;
        case 62: right_fill(d, a, iarg, scalar); break;
        case 63: left_fill(d, a, iarg, scalar); break;
        case 64: lower_fill(d, a, iarg, scalar); break;
        case 65: upper_fill(d, a, iarg, scalar); break;
        // conversions
        case 70: { rt<bf16, R, C, L> t; copy(t, a); copy(d, t); break; }          // round to bf16
        case 71: { rt<T, R, C, transpose_layout<L>> t; swap_layout(t, a); store(out, t, C); return; }
        case 72: { rt<T, C, R, transpose_layout<L>> t; transpose_sep(t, a); store(out, t, R); return; }
        case 73: { rt<T, C, R, L> t; transpose(t, a); store(out, t, R); return; }
        case 74: { rt<T, R, C, transpose_layout<L>> t; swap_layout(t, a); swap_layout(d, t); break; }
        // vectors
        case 80: exp(vr, pr); store(vec_out, vr); break;
        case 81: add(vc, pc, pc); mul(vc, vc, scalar); store(vec_out, vc); break;
        case 82: {   // register vector -> shared vector -> register vector of the other tile axis kind
            __shared__ sv<float, C> s;
            store(s, pc);
            __syncwarp();
            typename rt_fl<16, C, transpose_layout<L>>::row_vec other;
            load(other, s);
            store(vec_out, other);
            break;
        }
        case 83: {   // warp-wide reductions of one value per lane
            float x = a_in[laneid()];
            float s = warp_sum(x), m = warp_max(x), n = warp_min(x);
            if (laneid() == 0) { vec_out[0] = s; vec_out[1] = m; vec_out[2] = n; }
            break;
        }
        default: return;
    }
    store(out, d, C);
}

template <typename T, typename L>
int launch_tile_op(const float* a, const float* b, const float* pr, const float* pc, float* out, float* vec_out, int op,
                   float scalar, int iarg) {
    tile_op_kernel<T, L><<<1, 32>>>(a, b, pr, pc, out, vec_out, op, scalar, iarg);
    return finish_launch();
}

TK_TEST_API int tk_tile_op(int dtype, int layout, const float* a, const float* b, const float* per_row, const float* per_col,
                           float* out, float* vec_out, int op, float scalar, int iarg) {
    if (dtype == DT_F32 && layout == 0) return launch_tile_op<float, row_l>(a, b, per_row, per_col, out, vec_out, op, scalar, iarg);
    if (dtype == DT_F32 && layout == 1) return launch_tile_op<float, col_l>(a, b, per_row, per_col, out, vec_out, op, scalar, iarg);
    if (dtype == DT_BF16 && layout == 0) return launch_tile_op<bf16, row_l>(a, b, per_row, per_col, out, vec_out, op, scalar, iarg);
    if (dtype == DT_BF16 && layout == 1) return launch_tile_op<bf16, col_l>(a, b, per_row, per_col, out, vec_out, op, scalar, iarg);
    return -1;
}

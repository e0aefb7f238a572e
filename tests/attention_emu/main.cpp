// tests/attention_emu/main.cpp: runs kernels/attention_portable.cu's forward and backward on
// the CPU emulation and compares them with a float64 reference. Prints one line:
//   o=<rel err> lse=<..> dq=<..> dk=<..> dv=<..> dq_abs=<rms> dk_abs=<rms>
// (relative Frobenius-norm errors, nan if any output is not finite; then RMS errors).
// Built and run by tests/test_attention_emulated.py, which feeds it the .cu with its <<<>>>
// launches rewritten as emu::launch calls (attention_portable_emu.cpp). Built with nvcc instead
// (nvcc -x cu -std=c++20 -I. tests/attention_emu/main.cpp), it runs the real kernels on a GPU,
// without torch, which is what compute-sanitizer (memcheck, racecheck) is pointed at.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>
#ifdef __CUDACC__
#include "../../kernels/attention_portable.cu"
#else
#include "attention_portable_emu.cpp"
#endif

using bf16 = __nv_bfloat16;

static double rel_err(const std::vector<double>& ref, const std::vector<double>& got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return NAN;
        num += (ref[i] - got[i]) * (ref[i] - got[i]);
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}
static double rms(const std::vector<double>& a, const std::vector<double>& b) {
    double num = 0;
    for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]);
    return std::sqrt(num / a.size());
}

int main(int argc, char** argv) {
    if (argc < 6) { fprintf(stderr, "usage: main B H T D causal [seed]\n"); return 2; }
    const int B = atoi(argv[1]), H = atoi(argv[2]), T = atoi(argv[3]), D = atoi(argv[4]);
    const bool causal = atoi(argv[5]) != 0;
    std::mt19937 rng(argc > 6 ? atoi(argv[6]) : 1);
    std::normal_distribution<float> normal(0.f, 1.f);
    const float scale = 1.f / std::sqrt((float)D);

    // q, k, v as views of one (B, T, 3, H, D) buffer; gradients likewise; O as (B, T, H, D).
    const size_t n = (size_t)B * T * 3 * H * D;
    std::vector<bf16> qkv(n), dqkv(n, bf16{0xffff}), o((size_t)B * T * H * D, bf16{0xffff}), d_o((size_t)B * H * T * D);
    for (auto& x : qkv) x = __float2bfloat16(2.f * normal(rng));
    for (auto& x : d_o) x = __float2bfloat16(normal(rng));
    std::vector<float> lse((size_t)B * H * T, NAN), rowsum((size_t)B * H * T), dq_accum((size_t)B * H * T * D);
    auto view = [&](bf16* base, int which) {
        return AttentionTensor{base + which * H * D, (int64_t)T * 3 * H * D, D, 3 * H * D};
    };
    auto bthd = [&](bf16* base) { return AttentionTensor{base, (int64_t)T * H * D, D, H * D}; };
    auto bhtd = [&](bf16* base) { return AttentionTensor{base, (int64_t)H * T * D, (int64_t)T * D, D}; };
    AttentionShape shape{B, H, T, D, causal, scale};
#ifdef __CUDACC__
    // Built by nvcc: the same check on a real GPU, without torch (for compute-sanitizer).
    auto to_device = [](auto& host) {
        using E = typename std::decay_t<decltype(host)>::value_type;
        E* d = nullptr;
        cudaMalloc(&d, host.size() * sizeof(E));
        cudaMemcpy(d, host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice);
        return d;
    };
    auto to_host = [](auto& host, const auto* d) {
        cudaMemcpy(host.data(), d, host.size() * sizeof(host[0]), cudaMemcpyDeviceToHost);
    };
    bf16 *g_qkv = to_device(qkv), *g_dqkv = to_device(dqkv), *g_o = to_device(o), *g_do = to_device(d_o);
    float *g_lse = to_device(lse), *g_rowsum = to_device(rowsum), *g_acc = to_device(dq_accum);
#else
    bf16 *g_qkv = qkv.data(), *g_dqkv = dqkv.data(), *g_o = o.data(), *g_do = d_o.data();
    float *g_lse = lse.data(), *g_rowsum = rowsum.data(), *g_acc = dq_accum.data();
#endif
    AttentionForwardParams fp{shape, view(g_qkv, 0), view(g_qkv, 1), view(g_qkv, 2), bthd(g_o), g_lse};
    if (attention_portable_forward(fp, nullptr)) { fprintf(stderr, "forward launch failed\n"); return 1; }
    AttentionBackwardParams bp{shape, view(g_qkv, 0), view(g_qkv, 1), view(g_qkv, 2), bthd(g_o), bhtd(g_do),
                               view(g_dqkv, 0), view(g_dqkv, 1), view(g_dqkv, 2), g_lse, g_rowsum, g_acc};
    if (attention_portable_backward(bp, nullptr)) { fprintf(stderr, "backward launch failed\n"); return 1; }
#ifdef __CUDACC__
    if (cudaDeviceSynchronize() != cudaSuccess) { fprintf(stderr, "kernel failed\n"); return 1; }
    to_host(dqkv, g_dqkv);
    to_host(o, g_o);
    to_host(lse, g_lse);
#endif
    AttentionTensor q = view(qkv.data(), 0), k = view(qkv.data(), 1), v = view(qkv.data(), 2);
    AttentionTensor dq = view(dqkv.data(), 0), dk = view(dqkv.data(), 1), dv = view(dqkv.data(), 2);
    AttentionTensor ot = bthd(o.data()), dot = bhtd(d_o.data());

    // float64 reference on the same bf16 inputs.
    auto at = [&](const AttentionTensor& t, int b, int h, int i, int d) {
        return (double)__bfloat162float(static_cast<bf16*>(t.data)[b * t.stride_batch + h * t.stride_head + i * t.stride_seq + d]);
    };
    std::vector<double> ro, go, rl, gl, rdq, gdq, rdk, gdk, rdv, gdv;
    std::vector<double> P((size_t)T * T), dS((size_t)T * T), O((size_t)T * D);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
            for (int i = 0; i < T; ++i) {
                double mx = -INFINITY;
                for (int j = 0; j < T; ++j) {
                    double s = -INFINITY;
                    if (!causal || j <= i) {
                        s = 0;
                        for (int d = 0; d < D; ++d) s += at(q, b, h, i, d) * at(k, b, h, j, d);
                        s *= scale;
                    }
                    P[(size_t)i * T + j] = s;
                    mx = std::max(mx, s);
                }
                double sum = 0;
                for (int j = 0; j < T; ++j) sum += (P[(size_t)i * T + j] = std::exp(P[(size_t)i * T + j] - mx));
                for (int j = 0; j < T; ++j) P[(size_t)i * T + j] /= sum;
                rl.push_back(mx + std::log(sum));
                gl.push_back(lse[((size_t)b * H + h) * T + i]);
                for (int d = 0; d < D; ++d) {
                    double acc = 0;
                    for (int j = 0; j < T; ++j) acc += P[(size_t)i * T + j] * at(v, b, h, j, d);
                    O[(size_t)i * D + d] = acc;
                    ro.push_back(acc);
                    go.push_back(at(ot, b, h, i, d));
                }
            }
            for (int i = 0; i < T; ++i) {
                double Di = 0;
                for (int d = 0; d < D; ++d) Di += at(dot, b, h, i, d) * O[(size_t)i * D + d];
                for (int j = 0; j < T; ++j) {
                    double dp = 0;
                    for (int d = 0; d < D; ++d) dp += at(dot, b, h, i, d) * at(v, b, h, j, d);
                    dS[(size_t)i * T + j] = P[(size_t)i * T + j] * (dp - Di);
                }
            }
            for (int i = 0; i < T; ++i)
                for (int d = 0; d < D; ++d) {
                    double aq = 0, ak = 0, av = 0;
                    for (int j = 0; j < T; ++j) {
                        aq += dS[(size_t)i * T + j] * at(k, b, h, j, d);
                        ak += dS[(size_t)j * T + i] * at(q, b, h, j, d);
                        av += P[(size_t)j * T + i] * at(dot, b, h, j, d);
                    }
                    rdq.push_back(aq * scale); gdq.push_back(at(dq, b, h, i, d));
                    rdk.push_back(ak * scale); gdk.push_back(at(dk, b, h, i, d));
                    rdv.push_back(av); gdv.push_back(at(dv, b, h, i, d));
                }
        }
    // T = 1: dQ and dK are exactly zero (one key, softmax 1), so only their absolute size is shown.
    printf("o=%.3e lse=%.3e dq=%.3e dk=%.3e dv=%.3e dq_abs=%.3e dk_abs=%.3e\n", rel_err(ro, go), rel_err(rl, gl),
           rel_err(rdq, gdq), rel_err(rdk, gdk), rel_err(rdv, gdv), rms(rdq, gdq), rms(rdk, gdk));
    return 0;
}

"""Should the LM head's logits product run on the tk GEMM? (lead, session 7; a GPU-machine
measurement, not a test: pytest does not collect it)

    python tests/lm_head_logits_case.py [--trials 5] [--replays 20]

The LM head (kernels/lm_head_op.py) computes logits chunk by chunk, logits_c = x_c · Wᵀ with
x_c 4096 x 768 and W 50304 x 768 at GPT-2's training shape, by torch.mm (cuBLAS): 3.67 ms of a
55.7 ms step (8 chunks; session 7's probe). The tk GEMM's plain default (4v8) measured
1.04-1.11x cuBLAS on GPT-2's K = 768 forward shapes in session 6. This times the chunk's product
both ways, each replayed from a CUDA graph (replays per trial), trials interleaved, and checks
the tk result against cuBLAS's (relative error; both accumulate in fp32 and round to bf16)."""
import argparse
import statistics
import sys
import os

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernels import gemm   # noqa: E402


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def time_graph(g, replays):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--rows", type=int, default=4096)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    M, K, V = args.rows, 768, 50304
    x = torch.randn(M, K, device="cuda").bfloat16()
    w = (torch.randn(V, K, device="cuda") * K ** -0.5).bfloat16()
    out_cublas = torch.empty(M, V, device="cuda", dtype=torch.bfloat16)
    out_tk = torch.empty_like(out_cublas)
    torch.mm(x, w.t(), out=out_cublas)
    gemm.matmul(x, w.t(), step=0, out=out_tk)
    err = ((out_tk.float() - out_cublas.float()).norm() / out_cublas.float().norm()).item()
    print(f"logits {M}x{K}x{V}: tk vs cuBLAS relative error {err:.2e} (bf16 rounding of the same fp32 sums: ~1e-3 or less)")
    if not err < 4e-3:
        sys.exit("tk's logits differ from cuBLAS's: not timing")
    graphs = {"cublas": graph_of(lambda: torch.mm(x, w.t(), out=out_cublas)),
              "tk": graph_of(lambda: gemm.matmul(x, w.t(), step=0, out=out_tk))}
    times = {k: [] for k in graphs}
    for t in range(args.trials):
        order = list(graphs) if t % 2 == 0 else list(reversed(graphs))
        for k in order:
            times[k].append(time_graph(graphs[k], args.replays))
    flops = 2 * M * K * V
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:7s} median {med * 1e3:8.1f} us  {flops / med / 1e9:6.0f} TFLOP/s  trials(us) "
              + " ".join(f"{v * 1e3:.1f}" for v in ts))
    print(f"tk / cuBLAS speed: {statistics.median(times['cublas']) / statistics.median(times['tk']):.3f}x")


if __name__ == "__main__":
    main()

"""A/B of TK_MLP_DW_GEMM=planned (session 10, W) on the MLP's forward+backward, as GPT-2 trains it:
no biases, fp32 weights under bf16 autocast (mlp_op's fp32-weight path, dw_float), C = 768, H = 3072.

    python tests/mlp_dw_gemm_ab.py --M 32768,16384 --trials 7 --iters 10

Per token count, one CUDA graph per arm ("off": the extension's split-K weight_grad, the default;
"planned": the two weight gradients by kernels/gemm.py's matmul on step 4 variant 9) is captured
after an eager warm-up under its own setting (the flag is read at call time; a graph keeps the
kernels it was captured with), then each trial replays both arms `iters` times back to back, in a
fresh random order, after --settle-ms of idle. Prints every trial's us per fwd+bwd, each arm's median,
and the median of the per-trial ratios planned/off (below 1: the flag is faster). Also prints the
kernels each arm ran and their times (torch.profiler of one eager step, after one unprofiled) and
how far the two arms' gradients are apart.
Without CUDA it parses its arguments, prints the plan and exits 2 (nothing to time).
"""
import argparse
import os
import random
import re
import statistics
import sys
import time

import torch

ENV = "TK_MLP_DW_GEMM"
ARMS = ("off", "planned")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--M", default="32768,16384", help="token counts, comma-separated")
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10, help="graph replays per arm per trial")
    ap.add_argument("--settle-ms", type=float, default=25.0, help="idle before each arm's burst")
    a = ap.parse_args(argv)
    try:
        a.Ms = [int(m) for m in a.M.split(",") if m.strip()]
    except ValueError:
        ap.error(f"--M must be comma-separated integers, got {a.M!r}")
    if not a.Ms or min(a.Ms) < 1 or a.C % 64 or a.trials < 1 or a.iters < 1:
        ap.error("--M positive, --C a multiple of 64, --trials and --iters >= 1")
    return a


def set_arm(arm):
    if arm == "off":
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = arm


def make_inputs(M, C, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, C, device="cuda", generator=g).bfloat16().requires_grad_()
    w_fc = (torch.randn(4 * C, C, device="cuda", generator=g) * C ** -0.5).requires_grad_()
    w_proj = (torch.randn(C, 4 * C, device="cuda", generator=g) * (4 * C) ** -0.5).requires_grad_()
    dy = torch.randn(M, C, device="cuda", generator=g).bfloat16()
    return x, w_fc, w_proj, dy


def fwd_bwd(x, w_fc, w_proj, dy):
    from kernels import mlp_op
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        y = mlp_op.mlp(x, w_fc, None, w_proj, None)
    return torch.autograd.grad(y, (x, w_fc, w_proj), dy)


def capture(arm, inputs):
    """The arm's fwd+bwd in a CUDA graph (after 3 eager warm-up steps on a side stream, as torch's
    docs do: the planned path's workspace and schedule are made there) and its output gradients."""
    set_arm(arm)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fwd_bwd(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = fwd_bwd(*inputs)
    set_arm("off")
    return graph, grads


def kernel_names(arm, inputs):
    from torch.profiler import ProfilerActivity, profile
    set_arm(arm)
    fwd_bwd(*inputs)                                   # (first calls: workspace, schedule)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd_bwd(*inputs)
        torch.cuda.synchronize()
    set_arm("off")
    out = []
    for e in prof.key_averages():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        # each kernel by the names in it that say what it is (its epilogue policy, kernel function)
        name = "+".join(dict.fromkeys(re.findall(r"\w*(?:epilogue|kernel)\w*", e.key))) or e.key[:60]
        out.append(f"{name} x{e.count} {total / max(e.count, 1):.1f} us")
    return sorted(out)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main(argv=None):
    a = parse(argv)
    print(f"mlp_dw_gemm_ab: M={a.Ms} C={a.C} H={4 * a.C}, no biases, fp32 weights under bf16 autocast, "
          f"CUDA graphs, {a.trials} trials x {a.iters} replays per arm, arms {ARMS}")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 2
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(f"on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    summary = []
    for M in a.Ms:
        inputs = make_inputs(M, a.C, seed=M)
        for arm in ARMS:
            print(f"M={M} {arm:8s} ran: " + " | ".join(kernel_names(arm, inputs)))
        graphs = {arm: capture(arm, inputs) for arm in ARMS}
        for g, _ in graphs.values():
            g.replay()
        torch.cuda.synchronize()
        off, on = graphs["off"][1], graphs["planned"][1]
        print(f"M={M} gradients planned vs off (rel. norm): dx {rel(on[0], off[0]):.2e} dw_fc {rel(on[1], off[1]):.2e} "
              f"dw_proj {rel(on[2], off[2]):.2e}; dtypes {on[1].dtype}/{off[1].dtype}")
        times = {arm: [] for arm in ARMS}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for trial in range(a.trials):
            order = list(ARMS)
            random.Random(1000 * M + trial).shuffle(order)
            for arm in order:
                time.sleep(a.settle_ms / 1e3)
                graph = graphs[arm][0]
                start.record()
                for _ in range(a.iters):
                    graph.replay()
                end.record()
                end.synchronize()
                times[arm].append(1e3 * start.elapsed_time(end) / a.iters)
        ratios = [p / o for p, o in zip(times["planned"], times["off"])]
        for arm in ARMS:
            print(f"M={M} {arm:8s} median {statistics.median(times[arm]):8.1f} us  trials: " +
                  " ".join(f"{t:.1f}" for t in times[arm]))
        r = statistics.median(ratios)
        print(f"M={M} planned/off per trial: " + " ".join(f"{q:.4f}" for q in ratios) +
              f"  median {r:.4f} ({sum(q < 1 for q in ratios)} of {len(ratios)} trials faster)")
        summary.append(f"M={M}: off {statistics.median(times['off']):.1f} us, planned "
                       f"{statistics.median(times['planned']):.1f} us, median ratio planned/off {r:.4f}")
        del graphs
    print("RESULT " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The portable attention kernel's variants against FA2, interleaved in one process (issue 5's last
criterion: the portable version at least matches the FA2 SDPA backend at the GPT-2 shape).

    python -m kernels.attention_portable_bench --shapes gpt2,shakespeare-char,t4096-d128 \\
        --fwd 3/1,5/1,7/1 --fwdbwd 3/1,5/3,7/4 [--rounds 7] [--reps 20] [--json out.json]
        [--profile gpt2]

Implementations, named per row:
  sdpa-flash   SDPA forced to FLASH_ATTENTION (FA2), on the q, k, v views of qkv
  p-default    the portable kernel for both passes (attention_op pinned to 'portable'), its
               default variants (TK_ATTENTION_FWD_VARIANT / TK_ATTENTION_BWD_VARIANT unset)
  pF/B         the same with forward variant F and backward variant B (kernels/attention_portable.cu's
               launchers): the variables are set only while its CUDA graphs are captured, which is
               when the launcher reads them, so each graph holds its own variant's kernels
All go through kernels/attention_bench.py's steps and conventions (the packed entry model.py
trains through for the portable rows, qkv's views for SDPA, fwd+bwd differentiates y against qkv),
so the figures compare with bench.py's rows and with kernels/NOTES.md's history.

Timing: every implementation's CUDA graphs (one per input set; sets rotate, bigger than twice the
L2) are captured first; then each of --rounds rounds replays each implementation --reps times,
starting with a different implementation each round; the median of each round, then the median
and range over rounds. Before timing, each implementation's outputs are compared with FA2's (a
fast wrong answer is printed as MISMATCH, not hidden).

--ncu-once 3/1,5/2: one fwd+bwd per pair at the GPT-2 shape and nothing else (no warm-up, no FA2),
for ncu -k regex:attention_ -c <kernels>: the kernels come in the order of the pairs.

--profile SHAPE: one fwd+bwd of FA2 and of every --fwdbwd implementation under torch.profiler,
each kernel's GPU microseconds (where the time goes: the row sums, the memset, the main kernels,
the dQ conversion, SDPA's own copies).
"""
import argparse
import contextlib
import json
import math
import os
import sys

import torch

from kernels import attention_bench as AB

FA2 = "sdpa-flash"


@contextlib.contextmanager
def variant_env(fwd, bwd):
    """TK_ATTENTION_FWD_VARIANT / _BWD_VARIANT set to fwd / bwd (None: unset) inside the block."""
    names = ("TK_ATTENTION_FWD_VARIANT", "TK_ATTENTION_BWD_VARIANT")
    old = {n: os.environ.get(n) for n in names}
    try:
        for name, value in zip(names, (fwd, bwd)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(value)
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def parse_pairs(text, flag):
    """'3/1,5/3' -> [('3', '1'), ('5', '3')]; ValueError naming the flag for anything else."""
    pairs = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        parts = item.split("/")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{flag}: {item!r} is not FWD/BWD (two variant numbers, e.g. 5/3)")
        pairs.append(tuple(parts))
    return pairs


def implementations(pairs):
    """name -> (attend(qkv) -> y, (fwd, bwd) variants to set while capturing or None)."""
    table = AB.implementations()
    impls = {FA2: (table[FA2], None), "p-default": (table["tk-portable"], (None, None))}
    for fwd, bwd in pairs:
        impls[f"p{fwd}/{bwd}"] = (table["tk-portable"], (fwd, bwd))
    return impls


def run_with(variants, fn, *args):
    if variants is None:
        return fn(*args)
    with variant_env(*variants):
        return fn(*args)


def interleaved(shape, direction, impls, rounds, reps, device="cuda"):
    """{name: [round medians, ms]} and {name: rel err vs FA2} at one shape and direction."""
    import kernels
    B, H, T, D = AB.SHAPES[shape]
    step = AB.STEPS[direction]
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    saved = kernels.choice()
    kernels.configure("auto", attention="tk", layernorm=saved["layernorm"], mlp=saved["mlp"])
    try:
        first = AB.make_inputs(B, H, T, D, device)
        size = sum(t.numel() * t.element_size() for t in first)
        sets = [first] + [AB.make_inputs(B, H, T, D, device) for _ in range(max(2, math.ceil(2 * l2 / size)) - 1)]
        errors, graphs = {}, {}
        refs = AB.outputs(impls[FA2][0], first, direction) if FA2 in impls else None
        for name, (attend, variants) in impls.items():
            reason = run_with(variants, AB.why_not_run, step, attend, first)
            if reason is not None:
                print(f"  {shape} {direction}: {name} skipped: {reason}", flush=True)
                continue
            if refs is not None and name != FA2:
                errors[name] = AB.relative_error(run_with(variants, AB.outputs, attend, first, direction), refs)
                if not errors[name] <= AB.MISMATCH:
                    print(f"  {shape} {direction}: {name} MISMATCH vs {FA2}: rel err {errors[name]:.2e}", flush=True)
            graphs[name] = [run_with(variants, AB._graph_of, step, attend, inputs) for inputs in sets]
        order = list(graphs)
        times = {name: [] for name in order}
        for g in graphs.values():
            for graph in g:
                graph.replay()
        for r in range(rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                times[name].append(AB._replay_median_ms(graphs[name], reps))
        del graphs, sets, first
        torch.cuda.empty_cache()
    finally:
        kernels.configure("auto", **saved)
    return times, errors


def format_rows(shape, direction, times, errors):
    B, H, T, D = AB.SHAPES[shape]
    work = AB.flops(B, H, T, D, direction)
    med = {name: sorted(t)[len(t) // 2] for name, t in times.items() if t}
    rounds = len(next(iter(times.values()), []))
    out = [f"{direction} {shape} {B}x{H}x{T}x{D}, interleaved, {rounds} rounds (median of round medians; min..max)"]
    for name, ms in med.items():
        vs_fa2 = f"{med[FA2] / ms:6.3f}x FA2" if FA2 in med else ""
        vs_def = f"{med['p-default'] / ms:6.3f}x p-default" if "p-default" in med else ""
        err = f"err vs FA2 {errors[name]:.1e}" if name in errors else ""
        out.append(f"    {name:<11} {ms:8.4f} ms  ({min(times[name]):.4f}..{max(times[name]):.4f})"
                   f"  {work * 1e-12 / (ms * 1e-3):7.1f} TFLOP/s  {vs_fa2}  {vs_def}  {err}")
    return "\n".join(out)


def profile(shape, impls, device="cuda"):
    """Per-kernel GPU microseconds of one fwd+bwd (after a warm-up) for each implementation."""
    import kernels
    from torch.profiler import ProfilerActivity, profile as torch_profile
    B, H, T, D = AB.SHAPES[shape]
    saved = kernels.choice()
    kernels.configure("auto", attention="tk", layernorm=saved["layernorm"], mlp=saved["mlp"])
    lines = []
    try:
        inputs = AB.make_inputs(B, H, T, D, device)
        for name, (attend, variants) in impls.items():
            def step():
                run_with(variants, AB.forward_backward_step, attend, inputs)
            step()
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            rows = [(e.key, e.device_time_total / e.count, e.count // 3)
                    for e in prof.key_averages() if e.device_time_total > 0]
            total = sum(us * n for _, us, n in rows)
            lines.append(f"profile {shape} fwd+bwd {name}: {total:.1f} us of kernels per call")
            for key, us, n in sorted(rows, key=lambda r: -r[1] * r[2]):
                lines.append(f"    {us:8.1f} us x{n}  {key[:110]}")
    finally:
        kernels.configure("auto", **saved)
    return "\n".join(lines)


def ncu_once(pairs, shape="gpt2"):
    import kernels
    B, H, T, D = AB.SHAPES[shape]
    saved = kernels.choice()
    kernels.configure("auto", attention="tk", layernorm=saved["layernorm"], mlp=saved["mlp"])
    try:
        inputs = AB.make_inputs(B, H, T, D)
        attend = AB.implementations()["tk-portable"]
        for pair in pairs:
            run_with(pair, AB.forward_backward_step, attend, inputs)
        torch.cuda.synchronize()
    finally:
        kernels.configure("auto", **saved)
    print(f"ncu-once: {len(pairs)} fwd+bwd at {shape}: {', '.join('/'.join(p) for p in pairs)}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="gpt2", help=f"comma-separated, from {', '.join(AB.SHAPES)}")
    parser.add_argument("--fwd", default="3/1", help="forward rows: FWD/BWD variant pairs besides p-default")
    parser.add_argument("--fwdbwd", default="3/1", help="fwd+bwd rows: FWD/BWD variant pairs besides p-default")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", default="", help="write {direction: {shape: {name: [ms per round]}}} here")
    parser.add_argument("--profile", default="", help="a shape to profile fwd+bwd kernel by kernel (or '')")
    parser.add_argument("--ncu-once", default="", help="FWD/BWD pairs: one GPT-2 fwd+bwd each, for ncu")
    args = parser.parse_args(argv)
    if args.ncu_once:
        try:
            pairs = parse_pairs(args.ncu_once, "--ncu-once")
        except ValueError as e:
            parser.error(str(e))
        if not torch.cuda.is_available():
            print(f"attention_portable_bench: needs a CUDA GPU (--ncu-once {pairs})")
            return 0
        return ncu_once(pairs)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in shapes + ([args.profile] if args.profile else []) if s not in AB.SHAPES]
    if bad:
        parser.error(f"unknown shape(s) {', '.join(bad)}; choose from {', '.join(AB.SHAPES)}")
    if args.rounds < 1 or args.reps < 1:
        parser.error("--rounds and --reps must be at least 1")
    try:
        rows = {"fwd": parse_pairs(args.fwd, "--fwd"), "fwd+bwd": parse_pairs(args.fwdbwd, "--fwdbwd")}
    except ValueError as e:
        parser.error(str(e))
    if not torch.cuda.is_available():
        print("attention_portable_bench: needs a CUDA GPU (arguments parsed: "
              f"shapes {shapes}, rows {rows}, rounds {args.rounds}, reps {args.reps})")
        return 0
    result = {}
    for direction, pairs in rows.items():
        impls = implementations(pairs)
        for shape in shapes:
            times, errors = interleaved(shape, direction, impls, args.rounds, args.reps)
            print(format_rows(shape, direction, times, errors), flush=True)
            result.setdefault(direction, {})[shape] = {"ms": times, "err_vs_fa2": errors}
    if args.profile:
        print(profile(args.profile, implementations(rows["fwd+bwd"])), flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench.py's end-to-end modes: training tokens/s and MFU of whole optimizer steps (--e2e), and a
per-kernel profile of one training step (--profile). bench.py holds the flags; this file does
the work. Read `training_step` first (what one timed step is), then `time_steps` (how it is
timed), then `run_e2e` (which variants, each in its own process) and `profile`.

One timed step is what train.py does per iteration with gradient accumulation 1: forward under
autocast, backward, gradient clipping (train.py's default grad_clip), AdamW step (the
optimizer model.configure_optimizers builds: fused on CUDA), zero_grad. Inputs are random
tokens already on the device, so no data loading is timed. Warm-up steps (which include
torch.compile's compilation, any JIT build of the tk extensions and the optimizer's state
allocation) run first and are reported separately (warmup_s), never in the figures.

Each variant runs in a fresh Python process (`python -m kernels.e2e_bench --child SPEC`):
- a tk kernel that faults (illegal address) poisons the CUDA context of its process; the
  other variants' figures must survive it;
- the kernel switch, dynamo's caches and compiled graphs are process-wide state, and GPT-2 at
  B=32 leaves tens of GB in the caching allocator: every variant starts from the same clean
  state instead of inheriting the previous one's;
- a compile that hangs is cut off by a per-variant timeout and recorded as a failure.
The cost is a second or two of imports per variant (the tk extensions load from the build
cache; inductor's on-disk cache is shared).
"""
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import nullcontext

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The models timed. gpt2: config/gpt2.py's shapes at the issue's B=32, T=1024, gradient
# accumulation 1; shakespeare-char: config/shakespeare.py's (its vocabulary is 65 characters).
# Dropout is 0 for timing (the tk attention has no dropout; the other dropouts are cheap
# elementwise ops either way), biases off as both configs have them. tiny: the CPU test's model.
MODELS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, batch_size=32, block_size=1024),
    "shakespeare-char": dict(n_layer=6, n_head=6, n_embd=384, vocab_size=65, batch_size=64, block_size=256),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, vocab_size=65, batch_size=4, block_size=32),
}
# '+compile' runs once per compile mode; '+graphs' replays forward+backward from a CUDA graph
# (train.py's cuda_graphs=True; clipping and the optimizer step stay eager, as there)
VARIANTS = ("torch", "torch+compile", "torch+graphs", "tk", "tk+compile", "tk+graphs")
RESULT_MARK = "E2E_RESULT "   # the child's last stdout line: this mark, then the row as JSON


# ---- one training step -----------------------------------------------------------------------

def resolve_dtype(name, device_type):
    """train.py's rule for dtype='auto': bf16 on a GPU, float32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if device_type == "cuda" else torch.float32
    if name not in ("bfloat16", "float32"):
        raise ValueError(f"dtype={name!r}: the e2e bench takes auto, bfloat16 or float32 "
                         f"(float16 would need train.py's GradScaler)")
    return getattr(torch, name)


def training_step(spec):
    """The model, its optimizer and one training step for a variant spec. Returns (step, info):
    step(i) runs one optimizer step on the i-th random batch and returns the (detached) loss."""
    import kernels as switch
    import train
    from model import GPT, GPTConfig

    shape = MODELS[spec["model"]]
    dev = spec["device"]
    device_type = "cuda" if dev.startswith("cuda") else "cpu"
    dtype = resolve_dtype(spec["dtype"], device_type)
    B, T, V = shape["batch_size"], shape["block_size"], shape["vocab_size"]
    torch.backends.cuda.matmul.allow_tf32 = True   # as train.py
    torch.backends.cudnn.allow_tf32 = True
    # the per-op settings train.py runs with (e.g. kernels_linear), then the variant's overrides
    ops = {op: train.DEFAULTS.get(f"kernels_{op}", "") for op in switch.OPS}
    switch.configure(spec["kernels"], **{**ops, **spec.get("overrides", {})})
    switch.reset_used()
    torch.manual_seed(1337)
    model = GPT(GPTConfig(block_size=T, vocab_size=V, n_layer=shape["n_layer"], n_head=shape["n_head"],
                          n_embd=shape["n_embd"], dropout=spec.get("dropout", 0.0), attn_dropout=0.0,
                          bias=False)).to(dev)
    # kernels=tk raises KernelUnavailable here, naming the op, if a kernel cannot run these shapes
    plan = switch.preflight(B, T, shape["n_embd"], shape["n_head"], dtype, dev, attn_dropout=0.0, bias=False)
    d = train.DEFAULTS
    optimizer = model.configure_optimizers(d["weight_decay"], d["learning_rate"], (d["beta1"], d["beta2"]),
                                           device_type)
    mode = spec.get("compile")
    if mode:
        switch.prepare_for_compile()   # inductor's fallbacks for the tk ops (kernels/__init__.py)
    forward = torch.compile(model, mode=None if mode == "default" else mode) if mode else model
    graphs = bool(spec.get("graphs"))
    if graphs and device_type != "cuda":
        raise ValueError("a '+graphs' variant needs a GPU")
    autocast = (nullcontext() if dtype == torch.float32
                else torch.autocast(device_type, dtype=dtype, cache_enabled=not graphs))
    generator = torch.Generator(device=dev).manual_seed(0)
    batches = []
    for _ in range(4):   # a few different batches, rotated, all made before timing starts
        xy = torch.randint(V, (B, T + 1), device=dev, generator=generator)
        batches.append((xy[:, :-1].contiguous(), xy[:, 1:].contiguous()))

    def forward_backward(x, y):
        with autocast:
            _, loss = forward(x, y)
        loss.backward()
        return loss.detach()

    if graphs:
        forward_backward = train.Graphed(forward_backward, "training step")

    def step(i):
        loss = forward_backward(*batches[i % len(batches)])
        if d["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), d["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=not graphs)   # a graph keeps adding into its .grad tensors
        return loss

    peak = train.peak_flops(dev) if dtype != torch.float32 else None   # train.py's table
    info = {"batch_size": B, "block_size": T, "tokens_per_step": B * T, "params": model.num_params(),
            "flops_per_token": model.flops_per_token(), "dtype": str(dtype).replace("torch.", ""),
            "peak_flops": peak, "plan": plan}
    return step, info


# ---- the GPU's clocks and power while the steps run ---------------------------------------------
# Why: the same commit read 1.091-1.115x torch.compile on different machines (kernels/NOTES.md,
# session 12). Session 13's first readings: every GPT-2 variant runs at the H200's 700 W power cap,
# and tk's step, the faster one, at a ~5% lower SM clock than torch.compile's; the speed ratio
# followed the clock ratio between machines. So each row records what the GPU ran at.
# NVML's clock-limit reasons (nvmlClocksEventReason*), the ones that slow a busy GPU:
CLOCK_LIMITS = {0x4: "power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake"}


class ClockSampler:
    """Polls NVML (nvidia-ml-py, the pynvml module) from a thread every `period_s` while the timed
    steps run: SM clock, power draw, clock-limit reasons. summary() gives medians and the share of
    samples under each limit, and the energy the GPU used over the whole window (NVML's total-energy
    counter read on entry and exit, where the GPU has one: session 13 found every GPT-2 variant at
    the 700 W power cap, where energy per step, not time alone, sets the clock); without NVML (the
    CPU, a machine without the module) it is {}."""

    def __init__(self, device_index, period_s=0.1):
        self.samples, self.period_s, self._stop = [], period_s, threading.Event()
        self.energy_mj = [None, None]   # NVML's energy counter on entry and exit (mJ), where it has one
        try:
            import pynvml
            pynvml.nvmlInit()
            try:   # NVML counts every GPU; CUDA_VISIBLE_DEVICES renumbers them for torch
                index = torch.cuda._get_nvml_device_index(device_index)
            except Exception:
                index = device_index
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
            self.reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3
        except Exception:   # no NVML here: nothing to record
            self.nvml = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append((self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM),
                                     self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3,
                                     int(self.reasons(self.handle))))
            except Exception:
                return
            self._stop.wait(self.period_s)

    def _energy_mj(self):
        """NVML's count of the energy this GPU has used since the driver loaded (mJ), or None."""
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception:   # not every GPU or driver keeps the counter
            return None

    def __enter__(self):
        if self.nvml is not None:
            self.energy_mj[0] = self._energy_mj()
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.nvml is not None:
            self.energy_mj[1] = self._energy_mj()

    def summary(self):
        if not self.samples:
            return {}
        mhz, watts, reasons = zip(*self.samples)
        limited = {name: round(sum(1 for r in reasons if r & bit) / len(reasons), 3)
                   for bit, name in CLOCK_LIMITS.items() if any(r & bit for r in reasons)}
        out = {"sm_mhz": statistics.median(mhz), "sm_mhz_min": min(mhz), "power_w": round(statistics.median(watts), 1),
               "power_limit_w": round(self.limit_w, 1), "clock_limits": limited, "clock_samples": len(mhz)}
        start, end = self.energy_mj
        if start is not None and end is not None and end >= start:
            out["energy_j"] = (end - start) / 1e3
        return out


def clock_note(row):
    """'; SM 1980 MHz (min 1755), 612 W of 700, 37.9 J a step, limited by power cap 40% of samples'
    for the per-variant line (the energy where NVML counts it)."""
    if "sm_mhz" not in row:
        return ""
    limits = ", ".join(f"{name} {100 * share:.0f}%" for name, share in row["clock_limits"].items())
    energy = f", {row['energy_j_per_step']:.1f} J a step" if "energy_j_per_step" in row else ""
    return (f"; SM {row['sm_mhz']:.0f} MHz (min {row['sm_mhz_min']:.0f}), {row['power_w']:.0f} W of "
            f"{row['power_limit_w']:.0f}{energy}" + (f", limited by {limits} of samples" if limits else ""))


def time_steps(step, warmup, steps, device_type):
    """Warm up, then time `steps` steps one by one: CUDA events around each step on a GPU (the
    GPU's span for the step, including any wait for Python to launch it), the host clock on the
    CPU (where every op is synchronous). Also the host wall time of all timed steps together, as
    a cross-check of the median."""
    cuda = device_type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    sync()
    warmup_s = time.perf_counter() - t0
    ms, loss = [], None
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    sampler = ClockSampler(torch.cuda.current_device()) if cuda else None
    t0 = time.perf_counter()
    with sampler or nullcontext():
        for i in range(steps):
            if cuda:
                starts[i].record()
                loss = step(warmup + i)
                ends[i].record()
            else:
                t = time.perf_counter()
                loss = step(warmup + i)
                ms.append((time.perf_counter() - t) * 1e3)
        sync()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    if cuda:
        ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    out = {"ms": statistics.median(ms), "ms_steps": [round(t, 4) for t in ms],
           "ms_wall_mean": wall_ms, "warmup_s": round(warmup_s, 2), "loss": loss.item()}
    if cuda:
        out.update(sampler.summary())
        if "energy_j" in out:   # the window: the timed steps, from an idle GPU to the last step's end
            out["energy_j_per_step"] = out.pop("energy_j") / steps
        out["host_ms"] = host_issue_ms(step, warmup + steps)
    return out


HOLD_MS = 400   # how long host_issue_ms keeps the GPU busy while Python issues one step


def host_issue_ms(step, first, reps=3):
    """The host's time to issue one whole step while the GPU is held busy (torch.cuda._sleep):
    Python, autograd and the launches, without waiting for any kernel. Where it comes near the
    step's GPU time, the step is bound by the host, and faster kernels stop showing in tokens/s
    (CUDA graphs or torch.compile remove most of it). Median of `reps` steps. A figure near
    HOLD_MS means the step waited for the GPU after all (a sync, or a full launch queue): then it
    is a lower bound, and the table marks it."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(50_000_000)   # ~25 ms: the clock rate, to within the launch's and sync's few us
    torch.cuda.synchronize()
    cycles_per_ms = 50_000_000 / ((time.perf_counter() - t0) * 1e3)
    times = []
    for r in range(reps):
        torch.cuda._sleep(int(HOLD_MS * cycles_per_ms))
        t = time.perf_counter()
        step(first + r)
        times.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def measure(spec):
    """One variant, measured in this process: the row bench.py records."""
    import kernels as switch
    row = dict(spec)
    try:
        step, info = training_step(spec)
        row.update(info)
        row.update(time_steps(step, spec["warmup"], spec["steps"], "cuda" if spec["device"].startswith("cuda") else "cpu"))
        if not math.isfinite(row["loss"]):
            raise FloatingPointError(f"training loss is {row['loss']}")
        row["tokens_per_s"] = info["tokens_per_step"] / (row["ms"] * 1e-3)
        row["mfu"] = (info["flops_per_token"] * row["tokens_per_s"] / info["peak_flops"]
                      if info["peak_flops"] else None)
        row["used"] = switch.used()
    except Exception as e:   # recorded: one failing variant must not hide the others
        first_line = (str(e).strip().splitlines() or [""])[0]
        row["error"] = f"{type(e).__name__}: {first_line[:300]}"
    return row


# ---- the run: every variant of every model, each in its own process ---------------------------

def split_variant(v):
    """'tk+graphs/linear=tk/mlp=torch' -> ('tk+graphs', {'linear': 'tk', 'mlp': 'torch'}): a
    variant, then per-op overrides of the switch after '/' (to time one op's tk kernel on and off).
    A variant starts from train.py's per-op settings (kernels_linear='torch'); overrides replace them."""
    base, *parts = v.split("/")
    if base not in VARIANTS:
        raise ValueError(f"unknown variant {base!r} in --variants; choose from {', '.join(VARIANTS)}"
                         " (per-op overrides may follow, e.g. tk/linear=torch)")
    from kernels import OPS
    overrides = {}
    for part in parts:
        op, eq, value = part.partition("=")
        if not eq or value not in ("tk", "torch", "auto"):
            raise ValueError(f"variant {v!r}: {part!r} is not op=tk|torch|auto")
        if op not in OPS:
            raise ValueError(f"variant {v!r}: unknown op {op!r}; choose from {', '.join(OPS)}")
        overrides[op] = value
    return base, overrides


def variant_specs(models, variants, compile_modes, device, dtype, warmup, steps):
    for m in models:
        if m not in MODELS:
            raise ValueError(f"unknown model {m!r} in --models; choose from {', '.join(MODELS)}")
    for v in variants:
        split_variant(v)                        # refuses an unknown variant or override
    if steps < 1 or warmup < 0:
        raise ValueError(f"--reps={steps} --warmup={warmup}: time at least one step (--reps >= 1)")
    if any(split_variant(v)[0].endswith("+compile") for v in variants) and not compile_modes:
        raise ValueError("a '+compile' variant needs at least one --compile-modes entry")
    for m in models:
        for v in variants:
            base, overrides = split_variant(v)
            kernels, compiled = base.split("+")[0], base.endswith("+compile")
            for mode in (compile_modes if compiled else [None]):
                yield {"model": m, "variant": f"{v}:{mode}" if mode else v, "kernels": kernels, "overrides": overrides,
                       "compile": mode, "graphs": base.endswith("+graphs"), "device": device, "dtype": dtype,
                       "warmup": warmup, "steps": steps}


def run_child(spec, timeout):
    """Measure one variant in a fresh `python -m kernels.e2e_bench --child SPEC` process."""
    cmd = [sys.executable, "-m", "kernels.e2e_bench", "--child", json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.time()
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout} s (warm-up/compile included); raise --e2e-timeout"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if not lines:   # the process died before reporting (a crash in C++, out of memory, ...)
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {**spec, "error": f"process exited with code {done.returncode} without a result: "
                                 + " | ".join(tail)[-500:]}
    row = json.loads(lines[-1][len(RESULT_MARK):])
    row["process_s"] = round(time.time() - t0, 1)
    return row


def add_ratios(rows):
    """Per model: each row's speed over torch eager's and over torch.compile's best mode's."""
    for m in dict.fromkeys(r["model"] for r in rows):
        ok = [r for r in rows if r["model"] == m and "error" not in r]
        eager = [r["ms"] for r in ok if r["variant"] == "torch"]
        compiled = [r["ms"] for r in ok if r["kernels"] == "torch" and r["compile"]]
        for r in ok:
            r["vs_torch"] = eager[0] / r["ms"] if eager else None
            r["vs_torch_compile"] = min(compiled) / r["ms"] if compiled else None


def run_e2e(models, variants, compile_modes, device, dtype, warmup, steps, timeout):
    rows = []
    for spec in variant_specs(models, variants, compile_modes, device, dtype, warmup, steps):
        row = run_child(spec, timeout)
        rows.append(row)
        if "error" in row:
            print(f"  {row['model']} {row['variant']}: FAILED {row['error']}", flush=True)
        else:
            print(f"  {row['model']} {row['variant']}: {row['ms']:.2f} ms/step, {row['tokens_per_s']:,.0f} tok/s "
                  f"(warm-up {row['warmup_s']} s; host {row.get('host_ms', 0):.1f} ms to issue a step{clock_note(row)}; "
                  f"ops on {row['used']})",
                  flush=True)
    add_ratios(rows)
    return rows


def format_table(rows):
    def num(v, fmt):   # '1.23 x', or '-' where there is nothing to compare with
        return format(v, fmt.split()[0]) + "x" if v is not None else "-"
    lines = [f"{'model':<17}{'variant':<40}{'ms/step':>10}{'tok/s':>13}{'MFU':>7}{'x torch':>9}{'x compile':>11}"
             f"{'host ms':>9}"]
    for r in rows:
        name = f"{r['model']:<17}{r['variant']:<40}"
        if "error" in r:
            lines.append(f"{name}FAILED: {r['error'][:200]}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        host = r.get("host_ms")
        host = "-" if host is None else f"{host:.1f}" + ("+" if host >= 0.9 * HOLD_MS else "")
        lines.append(f"{name}{r['ms']:10.2f}{r['tokens_per_s']:13,.0f}{mfu:>7}"
                     f"{num(r.get('vs_torch'), '.2f x'):>9}{num(r.get('vs_torch_compile'), '.2f x'):>11}{host:>9}")
    lines.append("(ms/step: median over whole optimizer steps, CUDA events around each on a GPU, the host "
                 "clock on the CPU; x torch / x compile: speed over torch eager / over torch.compile's "
                 "best mode, same run; host ms: the host's time to issue one step while the GPU is held busy, '+' = a "
                 "lower bound, the step waited for the GPU)")
    return "\n".join(lines)


# ---- profile ---------------------------------------------------------------------------------

def kernel_table(kernels, steps, rows):
    """Per-kernel totals from (name, microseconds) pairs, one pair per kernel launch: the top
    `rows` by time, as text, with each kernel's time per step, launches per step and share."""
    total, count = {}, {}
    for name, us in kernels:
        total[name] = total.get(name, 0.0) + us
        count[name] = count.get(name, 0) + 1
    gpu_us = sum(total.values())
    lines = [f"GPU kernels: {gpu_us / steps / 1e3:.3f} ms per step in {sum(count.values()) / steps:.0f} launches "
             f"per step, {len(total)} distinct kernels; top {rows}:",
             f"{'ms/step':>9} {'share':>6} {'launches/step':>13}  kernel"]
    for name in sorted(total, key=total.get, reverse=True)[:rows]:
        lines.append(f"{total[name] / steps / 1e3:9.3f} {100 * total[name] / gpu_us:5.1f}% "
                     f"{count[name] / steps:13.1f}  {name[:150]}")
    return "\n".join(lines)


def profile(spec, steps, rows, path, env_line=""):
    """torch.profiler over `steps` training steps after warm-up. Writes to `path`: the GPU
    kernels by total time (kernel_table; a GPU run only), then torch's key_averages() table
    sorted by self CUDA time (self CPU time on the CPU), top `rows` rows. Returns the text."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile as torch_profile, record_function
    cuda = spec["device"].startswith("cuda")
    step, info = training_step(spec)
    for i in range(spec["warmup"]):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # input shapes: they tell which tensor each copy/cast kernel moves (session 3 found the two
    # copies of the logits this way)
    with torch_profile(activities=activities, record_shapes=True) as prof:
        for i in range(steps):
            with record_function("training_step"):
                step(spec["warmup"] + i)
        if cuda:
            torch.cuda.synchronize()
    # Kernels are the events on the device; an op's "self CUDA time" in key_averages repeats its
    # kernels' time, so the per-kernel totals come from the device events alone.
    # User annotations (record_function ranges such as training_step, Optimizer.step) are mirrored
    # on the GPU timeline as spans, not kernels: leave them out (the first H200 profile counted
    # the whole step span as a "kernel").
    launches = [(e.name, e.device_time_total) for e in prof.events()
                if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                and e.name != "training_step" and not e.name.startswith("Optimizer.")]
    sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    text = (f"bench.py --profile: {spec['model']} (B={info['batch_size']}, T={info['block_size']}, "
            f"dropout {spec.get('dropout', 0.0)}, {info['dtype']}), kernels={spec['kernels']}{''.join(f'/{k}={v}' for k, v in spec.get('overrides', {}).items())} (plan {info['plan']}), "
            f"compile={spec.get('compile') or 'off'}, {steps} steps profiled after {spec['warmup']} warm-up\n"
            f"{env_line}\n\n"
            + (kernel_table(launches, steps, rows) if launches else "GPU kernels: none (a CPU run)")
            + f"\n\ntorch.profiler key_averages(), sorted by {sort_by}, top {rows} rows:\n"
            + prof.key_averages().table(sort_by=sort_by, row_limit=rows) + "\n"
            + (copy_table(prof, steps, rows) if cuda else "")
            + (gap_table(prof, steps) if cuda else ""))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return text


def gap_table(prof, steps, top=12):
    """Where the GPU sits idle between kernels: the span from the first kernel's start to the last
    one's end, how much of it no kernel runs, and the longest idle gaps with the kernels on either
    side (a step whose kernels add up to less than its time loses the rest here)."""
    from torch.autograd import DeviceType
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                   and e.name != "training_step" and not e.name.startswith("Optimizer."))
    if not spans:
        return ""
    gaps, reach = [], spans[0][1]
    busy = spans[0][1] - spans[0][0]
    for (_, _, before), (start, end, name) in zip(spans, spans[1:]):
        if start > reach:
            gaps.append((start - reach, before, name))
            busy += end - start
        else:
            busy += max(0, end - reach)
        reach = max(reach, end)
    span = reach - spans[0][0]
    lines = [f"\nGPU idle between kernels: {(span - busy) / steps / 1000:.3f} ms per step of a "
             f"{span / steps / 1000:.3f} ms span ({len(gaps) / steps:.0f} gaps per step); the longest "
             f"{top} (us: the kernel before the gap -> the one after):"]
    for gap, before, name in sorted(gaps, reverse=True)[:top]:
        lines.append(f"  {gap:9.1f}  {before[:60]}  ->  {name[:60]}")
    return "\n".join(lines) + "\n"


def copy_table(prof, steps, rows):
    """The copy and cast ops (aten::copy_ under .to/.float/.contiguous) by CUDA time per step,
    with their input shapes."""
    lines = [f"\ncopies and casts by CUDA time per step, with their shapes (top {rows}):"]
    copies = [e for e in prof.key_averages(group_by_input_shape=True)
              if e.key == "aten::copy_" and e.device_time_total > 0]
    for e in sorted(copies, key=lambda e: -e.device_time_total)[:rows]:
        lines.append(f"  {e.device_time_total / steps / 1000:8.3f} ms  {e.count // steps:4d}x  {e.input_shapes}")
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) == 2 and argv[0] == "--child":
        row = measure(json.loads(argv[1]))
        print(RESULT_MARK + json.dumps(row), flush=True)
        return 0
    print("usage: this module is run by bench.py (python bench.py --e2e | --profile)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

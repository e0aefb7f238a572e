"""Do the tk and torch paths train alike? Their per-iteration loss curves, side by side.

Runs train.py's `train(config)` once per kernel path (`--paths torch,tk`), each in its own
process: a faulting kernel poisons its CUDA context and the kernel switch is process-wide, so
one path must not take the other down or leak its choice into it. Same seed, same batches,
dropout 0, a loss logged every iteration. Then it compares the 10-iteration running means of
the training loss (trailing window: the mean at iteration i covers iterations i-9..i) and
passes when the largest relative difference to the first path stays within --tolerance (1%).

    python tests/loss_curves.py --out OUT --text .gpu_carry/input.txt              # GPT-2 124M
    python tests/loss_curves.py --out OUT --paths torch,auto --gpu-per-path        # 2 GPUs
    python tests/loss_curves.py --out OUT --gpu-per-path \\
        --paths torch,auto,auto,auto@TK_MLP_SCHEDULE=fcfast=4                     # a bisect
    python tests/loss_curves.py --out OUT --iters 20 --paths torch,torch --device=cpu \\
        --n_layer=2 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4         # CPU smoke

Any other `--key=value` is a train.py setting (checked by config.load: unknown keys and
wrong types are refused). The model is GPT-2 124M (12 layers, 12 heads, 768 wide, block 1024,
batch 32, no gradient accumulation, no biases), with nanoGPT's GPT-2 optimizer settings
(AdamW lr 6e-4 -> 6e-5, betas 0.9/0.95, weight decay 0.1, clip 1.0) and the schedule scaled
to the run: warmup --iters/10 (50 for 500), cosine decay over --iters. Eager, no torch.compile
(the comparison is tk against torch, not against the compiler). On shakespeare_char (the
default, as the GPU machine has no GPT-2 BPE files) the vocabulary is 65 characters, not
GPT-2's 50304, so the LM head is tiny (85M parameters, not 124M); dataset=synthetic keeps
50304 but its random tokens teach nothing (the loss stays at ln 50304), a much weaker test.

Writes to --out: loss_curves.json (both loss lists, running means, relative differences,
max, pass/fail, wall time and tokens/s per path, what each op really ran on),
loss_curves.png (curves above, relative difference and the +-tolerance band below), one
<path>.log per run. The prepared data and train.py's out_dirs live in a temporary folder,
deleted at the end; no checkpoint is written (the child replaces train.save_checkpoint with a
no-op). Prints a one-line verdict; exit status 0 = PASS, 1 = FAIL or a run failed.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# GPT-2 124M as config/gpt2.py has it, with one 32x1024 micro-batch per step (the issue's
# shape) and the learning rate schedule set per run in build_config.
GPT2_124M = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, bias=False,
                 batch_size=32, gradient_accumulation_steps=1,
                 learning_rate=6e-4, min_lr=6e-5, weight_decay=1e-1, beta1=0.9, beta2=0.95,
                 grad_clip=1.0, decay_lr=True, dataset="shakespeare_char", compile=False)
# What makes the runs comparable iteration by iteration; a flag may not change these.
FIXED = dict(dropout=0.0, attn_dropout=0.0, log_interval=1, init_from="scratch",
             wandb_log=False, eval_only=False)
ITER_LINE = re.compile(r"^iter (\d+): loss ([-+0-9.eEnaif]+),")   # train.py's log line
PARAMS_LINE = re.compile(r"([0-9.]+)M parameters")


class CurvesError(ValueError):
    """Bad arguments: the message names the argument and what to do."""


# ----------------------------------------------------------------------------- arithmetic
def running_mean(values, window):
    """Trailing means: out[k] = mean(values[k : k + window]), for every full window."""
    if window < 1:
        raise CurvesError(f"--window={window}: it must be at least 1")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out


def compare(reference, other, window, tolerance):
    """Running means of two loss lists (index 0 = iteration 1) and their relative difference
    (other - reference) / reference, over the iterations both runs reached."""
    n = min(len(reference), len(other))
    ref_mean, other_mean = running_mean(reference[:n], window), running_mean(other[:n], window)
    rel = [(b - a) / a if a != 0 else math.inf for a, b in zip(ref_mean, other_mean)]
    finite = all(math.isfinite(x) for x in rel)
    worst = max(range(len(rel)), key=lambda k: abs(rel[k]) if math.isfinite(rel[k]) else math.inf) if rel else None
    return {
        "iters_compared": n,
        "running_mean_iters": list(range(window, n + 1)),   # iteration at each window's end
        "rel_diff": rel,
        "max_abs_rel_diff": abs(rel[worst]) if worst is not None else None,
        "max_abs_rel_diff_iter": worst + window if worst is not None else None,
        "first_iter_rel_diff": (other[0] - reference[0]) / reference[0] if n else None,
        # the drift a bisect reads: where the curves sit apart on average once both have settled
        "mean_rel_diff_second_half": sum(rel[len(rel) // 2:]) / len(rel[len(rel) // 2:]) if rel else None,
        "within_tolerance": bool(rel) and finite and max(abs(x) for x in rel) <= tolerance,
    }


# ----------------------------------------------------------------------------- configuration
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Other --key=value flags are train.py settings.")
    p.add_argument("--out", required=True, help="output folder (JSON, PNG, one log per path)")
    p.add_argument("--iters", type=int, default=500, help="training iterations per path")
    p.add_argument("--paths", default="torch,tk",
                   help="comma-separated kernel settings (torch, tk, auto), one run each; the first "
                        "is the reference; a setting may carry environment settings for its run "
                        "alone: auto@TK_MLP_SCHEDULE=fcfast=4")
    p.add_argument("--text", default="", help="Tiny Shakespeare text to prepare shakespeare_char from")
    p.add_argument("--data-dir", default="", help="a data_dir already holding <dataset>/train.bin, val.bin")
    p.add_argument("--gpu-per-path", action="store_true",
                   help="run the paths at once, one GPU each (round robin when there are more "
                        "paths than GPUs)")
    p.add_argument("--window", type=int, default=10, help="running-mean window, iterations")
    p.add_argument("--tolerance", type=float, default=0.01, help="allowed relative difference")
    p.add_argument("--timeout", type=float, default=600, help="seconds per path")
    p.add_argument("--_child", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args, extra = p.parse_known_args(argv)
    return args, extra


def build_config(args, extra):
    """train.DEFAULTS <- GPT-2 124M <- the run's schedule <- --key=value flags <- FIXED."""
    import train
    from config import ConfigError, load
    if args.iters < 1:
        raise CurvesError(f"--iters={args.iters}: it must be at least 1")
    for flag in extra:
        if not flag.startswith("--"):
            raise CurvesError(f"unexpected argument {flag!r}: train settings are written --key=value")
        key = flag[2:].partition("=")[0]
        if key == "kernels" or key.startswith("kernels_"):   # kernels and every per-op override
            raise CurvesError(f"{flag}: the kernel setting is per run; use --paths (e.g. --paths torch,tk)")
        if key == "max_iters":
            raise CurvesError(f"{flag}: use --iters")
    base = dict(train.DEFAULTS, **GPT2_124M)
    base.update(max_iters=args.iters, lr_decay_iters=args.iters,
                warmup_iters=max(1, args.iters // 10),
                eval_interval=10 * args.iters + 1,   # eval only at iteration 0 and at the end
                eval_iters=2, always_save_checkpoint=False)
    try:
        config = load(base, extra)
    except ConfigError as e:
        raise CurvesError(str(e)) from None
    for key, value in FIXED.items():
        if config[key] != value and key in {f[2:].partition("=")[0] for f in extra}:
            raise CurvesError(f"--{key}={config[key]!r}: the comparison needs {key}={value!r} (runs that "
                              f"draw different dropout masks or log differently cannot be compared)")
    config.update(FIXED)
    return config


def prepare_data(args, config, work):
    """Set config's data_dir. shakespeare_char is prepared once here, before any run starts
    (two runs preparing it at once would race)."""
    if config["dataset"] == "synthetic":
        return None
    if args.data_dir:
        folder = os.path.join(args.data_dir, config["dataset"])
        if not os.path.exists(os.path.join(folder, "train.bin")):
            raise CurvesError(f"--data-dir={args.data_dir}: {folder}/train.bin not found")
        config["data_dir"] = os.path.abspath(args.data_dir)
        return None
    if config["dataset"] != "shakespeare_char":
        raise CurvesError(f"--dataset={config['dataset']}: give --data-dir holding its train.bin and "
                          f"val.bin, or use shakespeare_char (with --text) or synthetic")
    candidates = [args.text] if args.text else [os.path.join(REPO, "data", "shakespeare_char", "input.txt"),
                                                os.path.join(REPO, ".gpu_carry", "input.txt")]
    text = next((c for c in candidates if os.path.isfile(c)), None)
    if text is None:
        raise CurvesError(f"--text: no Tiny Shakespeare text at {' or '.join(candidates)}; pass "
                          f"--text PATH, --data-dir DIR, or --dataset=synthetic")
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "char_prepare", os.path.join(REPO, "data", "shakespeare_char", "prepare.py"))
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    data_dir = os.path.join(work, "data")
    prepare.prepare(os.path.join(data_dir, "shakespeare_char"), input_path=os.path.abspath(text),
                    url="file:///nonexistent")   # the text exists: never downloads
    config["data_dir"] = data_dir
    return os.path.abspath(text)


def parse_path(path):
    """'auto@TK_MLP_SCHEDULE=fcfast=4' -> ('auto', {'TK_MLP_SCHEDULE': 'fcfast=4'}): a kernel
    setting, then any environment settings for that run alone, each after an '@' (how a default
    is bisected: the same tree with one kernel choice reverted by its environment variable)."""
    setting, *envs = path.split("@")
    env = {}
    for item in envs:
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise CurvesError(f"--paths: {item!r} in {path!r} is not an environment setting KEY=VALUE "
                              f"(e.g. auto@TK_MLP_SCHEDULE=fcfast=4)")
        env[key] = value
    if setting not in ("auto", "tk", "torch"):
        raise CurvesError(f"--paths: {path!r} starts with {setting!r}; each path is torch, tk or auto, "
                          f"optionally followed by @KEY=VALUE environment settings")
    return setting, env


def run_names(paths):
    """'torch,torch' -> ['torch', 'torch_2']: one distinct name (and log file) per run, also for
    two paths that differ only in characters a file name does not keep."""
    names, seen = [], {}
    for path in paths:
        name = re.sub(r"[^A-Za-z0-9_.=+-]+", "_", path.replace("@", "+"))   # a file name
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return names


# ----------------------------------------------------------------------------- one run (child)
def child(spec_path, result_path):
    """Runs in its own process: one train() call, its result written as JSON."""
    with open(spec_path) as f:
        spec = json.load(f)
    import torch
    import train
    import kernels
    # train() saves at the final eval whenever val loss improved; these runs need no
    # checkpoint, and a 124M one with AdamW state costs ~1.5 GB and seconds per path.
    train.save_checkpoint = lambda path, state: print(f"(loss_curves: checkpoint {path} not written)")
    started = time.time()
    summary = train.train(spec["config"])
    hist = summary["history"]
    result = {
        "train_iters": [i for i, kind, _ in hist if kind == "train"],
        "losses": [loss for _, kind, loss in hist if kind == "train"],
        "val": [[i, loss] for i, kind, loss in hist if kind == "val"],
        "wall_s": summary["wall_s"], "tokens_per_s": summary["tokens_per_s"],
        "process_s": time.time() - started,
        "choice": kernels.choice(), "used": kernels.used(),
        "device": (torch.cuda.get_device_name() if torch.cuda.is_available()
                   and not str(spec["config"]["device"]).startswith("cpu") else "cpu"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        # the run's own environment settings as this process saw them (a bisect's evidence)
        "env_seen": {k: os.environ.get(k) for k in spec.get("env", {})},
    }
    with open(result_path, "w") as f:
        json.dump(result, f)


def losses_from_log(log_path):
    """The 'iter N: loss X' lines of a run that died: its curve up to the fault (4 decimals)."""
    losses = []
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                m = ITER_LINE.match(line)
                if m and int(m.group(1)) == len(losses) + 1:
                    losses.append(float(m.group(2)))
    except OSError:
        pass
    return losses


def start_run(name, path, config, out, work, gpu):
    """Start one run in its own process: its log goes to out, everything else to work."""
    kernel_setting, path_env = parse_path(path)
    spec = {"config": dict(config, kernels=kernel_setting, out_dir=os.path.join(work, f"run_{name}")),
            "env": path_env}
    spec_path, result_path = os.path.join(work, f"{name}.spec.json"), os.path.join(work, f"{name}.result.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(path_env)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    log_path = os.path.join(out, f"{name}.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--out", out,
                             "--_child", spec_path, result_path],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)   # its own group: a timeout ends its builds too
    return {"name": name, "kernels": kernel_setting, "env": path_env, "gpu": gpu, "proc": proc, "log": log,
            "log_path": log_path, "result_path": result_path, "started": time.time()}


def finish_run(run, deadline):
    proc = run["proc"]
    try:
        proc.wait(timeout=max(1.0, deadline - time.time()))
        status = "ok" if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the group this script started for the run
        proc.wait()
        status = "timed out"
    run["log"].close()
    entry = {"name": run["name"], "kernels": run["kernels"], "env": run["env"], "gpu": run["gpu"],
             "status": status,
             "log": os.path.basename(run["log_path"]), "elapsed_s": time.time() - run["started"]}
    if status == "ok" and os.path.exists(run["result_path"]):
        with open(run["result_path"]) as f:
            entry.update(json.load(f))
        entry["losses_from"] = "train() history"
    else:
        if status == "ok":
            entry["status"] = "no result file"
        entry["losses"] = losses_from_log(run["log_path"])
        entry["losses_from"] = "log lines (the run did not finish; 4 decimals)"
    with open(run["log_path"], errors="replace") as f:
        log = f.read()
    found = PARAMS_LINE.search(log)
    entry["params_M"] = float(found.group(1)) if found else None
    if entry["status"] != "ok":
        entry["log_tail"] = log[-2000:]
    return entry


def gpu_slots(n_paths, wanted):
    """One CUDA_VISIBLE_DEVICES value per path for concurrent runs, or None (one after another).
    With more paths than GPUs the runs share them round robin, all at once (session 9's call 1 ran
    six 85M-parameter runs, three per H200; sharing slows each run, not its arithmetic)."""
    if not wanted:
        return None
    import torch
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in visible.split(",") if s.strip()] if visible else [str(i) for i in range(count)]
    ids = ids[:count]
    return [ids[k % len(ids)] for k in range(n_paths)] if ids else None


# ----------------------------------------------------------------------------- report
def plot(path, runs, cmp, args, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]
    for k, run in enumerate(runs):
        losses, color = run["losses"], colors[k % len(colors)]
        if not losses:
            continue
        label = f"{run['name']} ({', '.join(f'{op}={how}' for op, how in run.get('used', {}).items()) or run['status']})"
        top.plot(range(1, len(losses) + 1), losses, color=color, alpha=0.25, linewidth=0.8)
        mean = running_mean(losses, args.window)
        top.plot(range(args.window, args.window + len(mean)), mean, color=color, linewidth=2, label=label)
    top.set_ylabel("training loss")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    tol = 100 * args.tolerance
    bottom.axhspan(-tol, tol, color="tab:green", alpha=0.12, label=f"±{tol:g}%")
    for y in (-tol, tol):
        bottom.axhline(y, color="tab:green", linewidth=0.8)
    for k, c in enumerate(cmp):
        bottom.plot(c["running_mean_iters"], [100 * x for x in c["rel_diff"]],
                    color=colors[(k + 1) % len(colors)], linewidth=1.5, label=f"{c['other']} vs {c['reference']}")
    bottom.set_ylabel(f"relative difference of\n{args.window}-iter running means (%)")
    bottom.set_xlabel("iteration")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    args, extra = parse_args(argv)
    if args._child:
        child(*args._child)
        return 0
    out = os.path.abspath(args.out)
    # data, specs, results, train.py's out_dirs: the output folder gets only logs, JSON and PNG
    work = tempfile.mkdtemp(prefix="loss_curves_")
    try:
        return compare_paths(args, extra, out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare_paths(args, extra, out, work):
    try:
        os.makedirs(out, exist_ok=True)
        config = build_config(args, extra)
        paths = [p.strip() for p in args.paths.split(",") if p.strip()]
        if len(paths) < 2:
            raise CurvesError(f"--paths={args.paths}: give two or more of torch, tk, auto, comma-separated")
        for path in paths:
            parse_path(path)
        text = prepare_data(args, config, work)
    except CurvesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    names = run_names(paths)
    slots = gpu_slots(len(paths), args.gpu_per_path)
    t0 = time.time()
    if slots:   # at once, one GPU each
        started = [start_run(n, p, config, out, work, g)
                   for n, p, g in zip(names, paths, slots)]
        deadline = time.time() + args.timeout
        runs = [finish_run(r, deadline) for r in started]
    else:       # one after another, on the same device
        runs = []
        for n, p in zip(names, paths):
            r = start_run(n, p, config, out, work, None)
            runs.append(finish_run(r, time.time() + args.timeout))
    total_s = time.time() - t0

    passed, line = report(runs, config, args, out, text=text, gpus=slots, total_s=total_s)
    print(line)
    return 0 if passed else 1


def vocab_note(config):
    """The vocabulary the runs trained with, said plainly (shakespeare_char is not GPT-2's)."""
    if config["vocab_size"]:
        return f"{config['vocab_size']} (set by flag)"
    if config["dataset"] == "synthetic":
        return "50304 (GPT-2's, padded), random tokens: a weak test, the loss cannot fall below ln 50304"
    meta = os.path.join(config["data_dir"] or os.path.join(REPO, "data"), config["dataset"], "meta.pkl")
    if os.path.exists(meta):
        import pickle
        with open(meta, "rb") as f:
            return f"{pickle.load(f)['vocab_size']} characters ({config['dataset']}), not GPT-2's 50304"
    return "50304 (GPT-2's BPE, padded)"


def report(runs, config, args, out, text=None, gpus=None, total_s=None):
    """Compare every run with the first, write loss_curves.json and loss_curves.png.
    Returns (passed, the one-line verdict)."""
    ref = runs[0]
    cmp = []
    for other in runs[1:]:
        c = compare(ref["losses"], other["losses"], args.window, args.tolerance)
        c.update(reference=ref["name"], other=other["name"])
        cmp.append(c)
    complete = all(r["status"] == "ok" and len(r["losses"]) == args.iters
                   and all(math.isfinite(x) for x in r["losses"]) for r in runs)
    passed = complete and all(c["within_tolerance"] for c in cmp)

    params = next((r["params_M"] for r in runs if r.get("params_M")), None)
    model = (f"GPT n_layer {config['n_layer']}, n_head {config['n_head']}, n_embd {config['n_embd']}"
             + (f" ({params:g}M parameters)" if params else "")
             + f", block {config['block_size']}, batch {config['batch_size']}"
             f"x{config['gradient_accumulation_steps']}, vocab {vocab_note(config)}")
    not_all_tk = {r["name"]: {op: how for op, how in r.get("used", {}).items() if how != "tk"}
                  for r in runs if r["kernels"] in ("tk", "auto")}
    worst = max((c["max_abs_rel_diff"] for c in cmp if c["max_abs_rel_diff"] is not None), default=None)
    for r in runs:
        r["running_mean"] = running_mean(r["losses"], args.window)
    summary = {
        "verdict": "PASS" if passed else "FAIL",
        "passed": passed, "complete": complete, "max_abs_rel_diff": worst,
        "tolerance": args.tolerance, "window": args.window,
        "iters": args.iters, "model": model, "dataset": config["dataset"], "text": text,
        "running_mean": f"trailing: the value at iteration i is the mean of the losses of iterations "
                        f"i-{args.window - 1}..i; rel_diff = (other - reference) / reference",
        "schedule": {k: config[k] for k in ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters",
                                            "weight_decay", "beta1", "beta2", "grad_clip")},
        "config": config,
        "concurrent_gpus": gpus, "total_s": total_s,
        "tk_paths_not_all_tk": not_all_tk,   # ops a tk/auto run ran on torch (auto falls back)
        "tk_paths_all_tk": all(bool(r.get("used")) and not not_all_tk[r["name"]]
                               for r in runs if r["kernels"] in ("tk", "auto")),
        "comparisons": cmp,
        "runs": runs,
    }
    with open(os.path.join(out, "loss_curves.json"), "w") as f:
        json.dump(summary, f, indent=1)

    png = os.path.join(out, "loss_curves.png")
    plot(png, runs, cmp, args, f"{model}\nseed {config['seed']}, dropout 0, {args.iters} iters, "
                               f"lr {config['learning_rate']:g} (warmup {config['warmup_iters']}, cosine to "
                               f"{config['min_lr']:g} at {config['lr_decay_iters']}), dtype {config['dtype']}"
                               + (" (bf16 autocast on a GPU)" if config["dtype"] == "auto" else ""))

    parts = []
    for c in cmp:
        if c["max_abs_rel_diff"] is not None:
            parts.append(f"{c['other']} vs {c['reference']}: max |rel diff| of {args.window}-iter running "
                         f"means {100 * c['max_abs_rel_diff']:.3f}% at iter {c['max_abs_rel_diff_iter']} "
                         f"over {c['iters_compared']} iters, mean "
                         f"{100 * c['mean_rel_diff_second_half']:+.3f}% over the second half")
    speed = ", ".join(f"{r['name']} {r['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in r
                      else f"{r['name']} {r['status']}" for r in runs)
    partial = "; ".join(f"{n} ran {', '.join(f'{op}={how}' for op, how in d.items())}"
                        for n, d in not_all_tk.items() if d)
    return passed, (f"{summary['verdict']} (tolerance {100 * args.tolerance:g}%): "
                    + "; ".join(parts or ["nothing to compare"]) + f"; {speed}"
                    + (f"; NOT all-tk: {partial}" if partial else "")
                    + ("" if complete else "; a run did not complete, see loss_curves.json")
                    + f" [{png}]")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""PNG figures of a bench.py JSON file, drawn with matplotlib (Agg: no display needed).

    python bench.py --plot out/bench.json      redraw the figures of an existing JSON

- the op-level table ("results" in the JSON: bench.py's op rows) -> <json stem>_ops.png: the
  CUDA-graph table bench.py prints, as a picture;
- the end-to-end rows ("e2e": bench.py --e2e) -> <json stem>_e2e.png: training tokens/s per
  variant, one panel per model (their scales differ), each bar labelled with its tokens/s, MFU
  and speed over torch eager.
The title of each carries the GPU, torch version, commit and date of the run.
"""
import json
import os


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _title(env):
    return (f"{env.get('gpu', '?')}, torch {env.get('torch', '?')}, commit {str(env.get('git_commit', '?'))[:10]}"
            f"{' (dirty)' if env.get('git_dirty') else ''}, {env.get('date_utc', '')} UTC")


def plot_ops(data, path):
    """The op rows as a table image (CUDA-graph medians, throughput in each row's unit)."""
    plt = _pyplot()
    impls = ["tk", "eager", "compile"]
    header = ["op", "case", "unit"] + [f"{i} µs / rate" for i in impls] + ["tk/eager", "tk/compile"]
    cells = []
    for r in data["results"]:
        ms, rate = r.get("ms", {}), r.get("throughput", {})
        row = [r["op"], r["case"], r["unit"]]
        row += [f"{ms[i] * 1e3:.1f} / {rate[i]:.2f}" if i in ms else "-" for i in impls]
        row += [f"{ms[b] / ms['tk']:.2f}x" if "tk" in ms and b in ms else "-" for b in ("eager", "compile")]
        cells.append(row)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.3 * max(len(cells), 1)))
    ax.axis("off")
    if cells:
        table = ax.table(cellText=cells, colLabels=header, loc="center", cellLoc="left")
        table.auto_set_font_size(False)
        table.set_fontsize(9)
        table.auto_set_column_width(list(range(len(header))))
    ax.set_title("bench.py op level, CUDA-graph medians\n" + _title(data.get("environment", {})), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_e2e(data, path):
    """Bars of training tokens/s, one panel per model; failed variants drawn as an empty slot."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter
    rows = data["e2e"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(max(7.0, 5.5 * len(models)), 5.0), squeeze=False)
    for ax, m in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == m]
        names = [r["variant"].replace("+compile:", "\ncompile\n").replace("-no-cudagraphs", "-\nno-cudagraphs")
                 for r in mine]
        heights = [r.get("tokens_per_s", 0.0) if "error" not in r else 0.0 for r in mine]
        colors = ["tab:orange" if r["kernels"] == "tk" else "tab:blue" for r in mine]
        bars = ax.bar(range(len(mine)), heights, color=colors)
        top = max(heights) if any(heights) else 1.0
        for bar, r in zip(bars, mine):
            if "error" in r:
                label = "failed"
            else:
                label = f"{r['tokens_per_s'] / 1e3:,.0f}k"
                if r.get("mfu") is not None:
                    label += f"\nMFU {100 * r['mfu']:.0f}%"
                if r.get("vs_torch") is not None:
                    label += f"\n{r['vs_torch']:.2f}x eager"
                if r["kernels"] == "tk" and r.get("vs_torch_compile") is not None:
                    label += f"\n{r['vs_torch_compile']:.2f}x compile"
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.01 * top, label,
                    ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels(names, fontsize=7)
        ax.set_ylim(0, top * 1.3)
        first = next((r for r in mine if "batch_size" in r), {})
        ax.set_title(f"{m}" + (f" (B={first['batch_size']}, T={first['block_size']})" if first else ""), fontsize=10)
        ax.set_ylabel("training tokens/s")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e3:,.0f}k"))
    fig.suptitle("bench.py --e2e: training tokens/s, whole optimizer steps\n" + _title(data.get("environment", {})),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_json(json_path):
    """Every figure the JSON has data for, next to it. Returns the paths written."""
    with open(json_path) as f:
        data = json.load(f)
    stem = os.path.splitext(json_path)[0]
    written = []
    if data.get("results"):
        written.append(plot_ops(data, stem + "_ops.png"))
    if data.get("e2e"):
        written.append(plot_e2e(data, stem + "_e2e.png"))
    return written

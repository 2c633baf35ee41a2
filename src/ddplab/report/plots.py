"""PNG figures of a report: curves, scaling, time and memory, GPU utilization.

matplotlib draws off-screen (Agg), so a report builds on a machine without a display. Each
function returns the file it wrote, or None when the runs hold nothing for it to draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ddplab.errors import file_error  # noqa: E402
from ddplab.report.runs import Point, experiment_config, value_text  # noqa: E402

FIGSIZE = (8.0, 4.8)
DPI = 100
MAX_GPU_PANELS = 8


def make_plots(points: list[Point], rows: list[dict[str, Any]], curves: list[list[dict[str, Any]]],
               out_dir: Path) -> dict[str, Path]:
    """Every plot there is data for, by name; absent names had nothing to draw."""
    labels = [r["point"] for r in rows]
    made = {
        "loss_curves": plot_curves(labels, curves, "loss", out_dir / "loss_curves.png"),
        "accuracy_curves": plot_curves(labels, curves, "acc", out_dir / "accuracy_curves.png"),
        "step_loss": plot_step_loss(points, out_dir / "step_loss.png"),
        "batch_size": plot_batch_size(points, rows, out_dir / "batch_size.png"),
        "accuracy_vs_time": plot_accuracy_vs_time(rows, out_dir / "accuracy_vs_time.png"),
        "throughput": plot_throughput(points, rows, out_dir / "throughput.png"),
        "time_breakdown": plot_time_breakdown(rows, out_dir / "time_breakdown.png"),
        "gpu_utilization": plot_gpu_utilization(points, out_dir / "gpu_utilization.png"),
    }
    return {name: path for name, path in made.items() if path is not None}


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as exc:
        raise file_error(exc) from None
    finally:
        plt.close(fig)
    return path


def color(i: int, n: int) -> Any:
    return plt.get_cmap("tab10" if n <= 10 else "tab20")(i % 20)


def short(label: str, width: int = 40) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def plot_curves(labels: list[str], curves: list[list[dict[str, Any]]], metric: str, path: Path) -> Path | None:
    """Train (dashed) and test (solid) loss or accuracy per epoch, one colour per point, std shaded."""
    if not any(curves):
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    scale = 100.0 if metric == "acc" else 1.0
    for i, (label, curve) in enumerate(zip(labels, curves)):
        for split, style in (("train", "--"), ("test", "-")):
            key = f"{split}_{metric}"
            pts = [(r["epoch"], r[key] * scale, (r.get(f"{key}_std") or 0.0) * scale) for r in curve if r.get(key) is not None]
            if not pts:
                continue
            x, y, s = zip(*pts)
            ax.plot(x, y, style, marker="o", markersize=3, color=color(i, len(labels)),
                    label=short(label) if split == "test" else None)
            if any(s):
                ax.fill_between(x, [a - b for a, b in zip(y, s)], [a + b for a, b in zip(y, s)],
                                color=color(i, len(labels)), alpha=0.15)
    name = "accuracy (%)" if metric == "acc" else "cross-entropy loss"
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title=f"{'Accuracy' if metric == 'acc' else 'Loss'} per epoch (solid: test, dashed: train; mean over seeds)",
           xlabel="epoch", ylabel=name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title="point")
    return save(fig, path)


def step_positions(steps: list[dict[str, Any]], steps_per_epoch: int | None) -> list[tuple[float, float]]:
    """(epoch as a fraction, loss) per step record: x = step / steps per epoch when the step count is global."""
    out = []
    is_global = bool(steps_per_epoch) and any(r.get("step", 0) > steps_per_epoch for r in steps)
    for r in steps:
        if r.get("train_loss") is None or r.get("step") is None:
            continue
        if steps_per_epoch:
            x = r["step"] / steps_per_epoch if is_global else r.get("epoch", 1) - 1 + r["step"] / steps_per_epoch
        else:
            x = r["step"]
        out.append((x, r["train_loss"]))
    return out


def plot_step_loss(points: list[Point], path: Path) -> Path | None:
    """Training loss at each recorded step (steps.jsonl), mean over seeds, so short runs still show a curve."""
    series = []
    for p in points:
        per_x: dict[float, list[float]] = {}
        for run in p.runs:
            spe = (run.summary or {}).get("batch", {}).get("steps_per_epoch")
            for x, loss in step_positions(run.steps, spe):
                per_x.setdefault(round(x, 6), []).append(loss)
        if per_x:
            xs = sorted(per_x)
            series.append((p.label, xs, [sum(per_x[x]) / len(per_x[x]) for x in xs]))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for i, (label, xs, ys) in enumerate(series):
        ax.plot(xs, ys, color=color(i, len(series)), label=short(label), linewidth=1.2)
    ax.set(title="Training loss per step (mean over seeds)", xlabel="epoch (steps as fractions of an epoch)",
           ylabel="train loss (cross-entropy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title="point")
    return save(fig, path)


def groups_without(points: list[Point], rows: list[dict[str, Any]], prefixes: tuple[str, ...]) -> list[list[int]]:
    """Indexes of points whose configs are equal once the fields starting with `prefixes` are left out."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        config = {k: v for k, v in experiment_config(p.config).items() if not k.startswith(prefixes)}
        groups.setdefault(repr(sorted(config.items())) if config else rows[i]["point"], []).append(i)
    return list(groups.values())


def group_label(points: list[Point], members: list[int]) -> str:
    """What a group of points shares: the axis values equal across it, or its first point's label."""
    first = points[members[0]].axes
    same = {a: v for a, v in first.items() if all(points[i].axes.get(a) == v for i in members)}
    return ", ".join(f"{a.rsplit('.', 1)[-1]}={value_text(v)}" for a, v in same.items()) or points[members[0]].label


def plot_batch_size(points: list[Point], rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Time per epoch and peak memory against the local batch size, one line per other setting."""
    if len({r["local_batch"] for r in rows if isinstance(r.get("local_batch"), int)}) < 2:
        return None
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11.0, 4.6))
    groups = groups_without(points, rows, ("train.batch_size",))
    for g, members in enumerate(groups):
        sel = sorted((rows[i] for i in members if isinstance(rows[i].get("local_batch"), int)), key=lambda r: r["local_batch"])
        label = short(group_label(points, members) if len(groups) > 1 else "all points")
        for ax, key in ((ax_t, "epoch_s"), (ax_m, "peak_mib")):
            pts = [(r["local_batch"], r[key], r.get(f"{key}_std") or 0.0) for r in sel if r.get(key) is not None]
            if pts:
                x, y, s = zip(*pts)
                ax.errorbar(x, y, yerr=s, marker="o", capsize=3, color=color(g, len(groups)), label=label)
    labels = {r.get("memory_label") for r in rows if r.get("memory_label")}
    memory = labels.pop().removesuffix("_mib").replace("_", " ") if len(labels) == 1 else "peak memory"
    ax_t.set(title="Time per epoch vs batch size", xlabel="local batch size (images per rank)",
             ylabel="time per epoch (s, epochs after the first)")
    ax_m.set(title="Peak memory vs batch size", xlabel="local batch size (images per rank)",
             ylabel=f"{memory} per rank (MiB)")
    batches = sorted({r["local_batch"] for r in rows if isinstance(r.get("local_batch"), int)})
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return save(fig, path)


def plot_accuracy_vs_time(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Each point's final test accuracy against its total run time: the cost of each percent."""
    sel = [r for r in rows if r.get("final_test_acc") is not None and r.get("total_s") is not None]
    if not sel:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for i, r in enumerate(sel):
        ax.errorbar(r["total_s"], 100 * r["final_test_acc"], xerr=r.get("total_s_std") or 0.0,
                    yerr=100 * (r.get("final_test_acc_std") or 0.0), fmt="o", capsize=3, color=color(i, len(sel)),
                    label=short(r["point"]))
    ax.set(title="Final test accuracy vs total run time", xlabel="total time (s, start-up included)",
           ylabel="final test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title="point")
    return save(fig, path)


def plot_throughput(points: list[Point], rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Training images per second against world size, with the ideal (linear) line from 1 worker."""
    if len({r["world_size"] for r in rows if isinstance(r.get("world_size"), int)}) < 2:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    groups = groups_without(points, rows, ("dist.",))
    for g, members in enumerate(groups):
        sel = sorted((rows[i] for i in members if rows[i].get("images_per_s") and isinstance(rows[i]["world_size"], int)),
                     key=lambda r: r["world_size"])
        if not sel:
            continue
        x, y = [r["world_size"] for r in sel], [r["images_per_s"] for r in sel]
        s = [r.get("images_per_s_std") or 0.0 for r in sel]
        label = short(group_label(points, members)) if len(groups) > 1 else "measured"
        ax.errorbar(x, y, yerr=s, marker="o", capsize=3, color=color(g, len(groups)), label=label)
        base = next((r for r in sel if r["world_size"] == 1), None)
        if base is not None:
            ax.plot(x, [base["images_per_s"] * w for w in x], ":", color=color(g, len(groups)),
                    label="ideal (linear)" if g == 0 else None)
    ax.set(title="Throughput vs world size", xlabel="world size (processes, or GPUs under DataParallel)",
           ylabel="training images/s (epochs after the first)")
    ax.set_xticks(sorted({r["world_size"] for r in rows if isinstance(r.get("world_size"), int)}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, path)


def time_parts(row: dict[str, Any]) -> dict[str, float]:
    """Shares of training time that add up to 1: communication wait is taken out of forward+backward."""
    comm = row.get("comm_wait_share") or 0.0
    parts = {"data": row.get("data_share") or 0.0,
             "forward+backward": max((row.get("forward_backward_share") or 0.0) - comm, 0.0),
             "comm wait": comm, "optimizer": row.get("optimizer_share") or 0.0}
    parts["other"] = max(1.0 - sum(parts.values()), 0.0)
    return parts


def plot_time_breakdown(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Stacked bars: where each point's training time went (epochs after the first)."""
    sel = [r for r in rows if r.get("forward_backward_share") is not None]
    if not sel:
        return None
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], max(2.5, 1.0 + 0.45 * len(sel))))
    names = list(time_parts(sel[0]))
    left = [0.0] * len(sel)
    labels = [short(r["point"]) for r in sel]
    for k, name in enumerate(names):
        widths = [100 * time_parts(r)[name] for r in sel]
        ax.barh(labels, widths, left=left, color=color(k, len(names)), label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.set(title="Training time breakdown per point", xlabel="share of training time (%)", xlim=(0, max(100.0, *left)))
    ax.invert_yaxis()  # first point on top, as in the tables
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="x")
    return save(fig, path)


def plot_gpu_utilization(points: list[Point], path: Path) -> Path | None:
    """GPU utilization over time (gpu.jsonl), one panel per run, one line per GPU; None when not measured."""
    runs = [r for p in points for r in p.runs if r.gpu][:MAX_GPU_PANELS]
    if not runs:
        return None
    cols = 1 if len(runs) == 1 else 2
    nrows = (len(runs) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3.0 * nrows), squeeze=False)
    for ax, run in zip(axes.flat, runs):
        gpus = sorted({(r.get("rank", 0), r.get("gpu", 0)) for r in run.gpu})
        for k, (rank, gpu) in enumerate(gpus):
            pts = sorted((r["t_s"], r["util_pct"]) for r in run.gpu
                         if (r.get("rank", 0), r.get("gpu", 0)) == (rank, gpu) and r.get("util_pct") is not None)
            if pts:
                x, y = zip(*pts)
                ax.plot(x, y, color=color(k, len(gpus)), label=f"GPU {gpu} (rank {rank})", linewidth=1.2)
        ax.set(title=short(run.name, 50), xlabel="time since start (s)", ylabel="utilization (%)", ylim=(0, 105))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    fig.suptitle("GPU utilization over time")
    return save(fig, path)

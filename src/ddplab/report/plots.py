"""PNG figures of a report section: curves, speed, scaling, time and memory, GPU utilization.

matplotlib draws off-screen (Agg), so a report builds on a machine without a display. A
plot never holds more lines than a reader can tell apart: curves of more than
`MAX_POINTS_TOGETHER` points become small multiples, one panel per point. Legend entries
are the points' full labels, wrapped, never cut; text from runs is drawn as text, never as
mathtext. Each function returns the `Plot` it wrote (its file, its legend entries and the
most lines on one panel, which the tests check), or None when there is nothing to draw.
"""

from __future__ import annotations

import functools
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddplab.io import files
from ddplab.report.kinds import kind_of
from ddplab.report.records import Row, figure, setting
from ddplab.report.runs import Point, groups_without

DPI = 100
MAX_POINTS_TOGETHER = 4  # more points than this: one panel each
MAX_GPU_PANELS = 8
LEGEND_WIDTH = 28  # characters per legend line: long labels wrap, never truncate


@functools.cache
def pyplot() -> Any:
    """matplotlib.pyplot, set to draw off-screen, imported when the first figure is drawn: a command that ends
    before it draws (a sweep file's error, a report of no runs) does not pay its 0.5-0.8 s import."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # a label like "cost $x$" is text, not a formula
    import matplotlib.pyplot as plt

    return plt


@dataclass
class Plot:
    name: str
    path: Path
    caption: str
    legend: list[str] = field(default_factory=list)  # legend entries, unwrapped
    max_lines: int = 0  # the most lines drawn on one panel
    clipped: list[str] = field(default_factory=list)  # entries of legends that reach past the figure's edge


def make_plots(section: Any, out_dir: Path, prefix: str) -> list[Plot]:
    """Every plot a section has data for, named `prefix-NAME.png`, in reading order."""
    rows, points, curves = section.rows, section.points, section.curves
    labels = [r["point"] for r in rows]
    kind = kind_of(section)
    made = [
        plot_curves(labels, curves, rows if kind.marks_overfitting else None, out_dir / f"{prefix}-curves.png"),
        plot_speed(rows, out_dir / f"{prefix}-speed.png") if "speed" in kind.plots else None,
        plot_batch_size(points, rows, out_dir / f"{prefix}-batch-size.png"),
        plot_model(section.model_curves, out_dir / f"{prefix}-predicted.png") if section.model_curves else None,
        plot_time_breakdown(rows, out_dir / f"{prefix}-time-breakdown.png") if "time-breakdown" in kind.plots else None,
        plot_step_loss(points, out_dir / f"{prefix}-step-loss.png") if "step-loss" in kind.plots else None,
        plot_gpu_utilization(points, out_dir / f"{prefix}-gpu-utilization.png"),
    ]
    return [p for p in made if p is not None]


def save(fig: Any, path: Path, caption: str) -> Plot:
    legends = [leg for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if leg is not None]
    legend = [t.get_text().replace("\n", " ") for leg in legends for t in leg.get_texts()]
    lines = max((len(ax.get_lines()) for ax in fig.axes), default=0)
    fig.tight_layout()
    fig.canvas.draw()
    edge = fig.bbox.padded(1)  # a pixel of rounding
    clipped = [
        t.get_text().replace("\n", " ")
        for leg in legends
        if not edge.contains(*leg.get_window_extent().p0) or not edge.contains(*leg.get_window_extent().p1)
        for t in leg.get_texts()
    ]
    try:  # whole or absent: a full disk leaves no half-drawn PNG under the real name
        files.write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format=path.suffix.lstrip(".") or "png"))
    finally:
        pyplot().close(fig)
    return Plot(path.stem.split("-", 1)[-1], path, caption, legend, lines, clipped)


def color(i: int, n: int) -> Any:
    return pyplot().get_cmap("tab10" if n <= 10 else "tab20")(i % 20)


def wrap(label: str) -> str:
    return textwrap.fill(label, LEGEND_WIDTH, break_long_words=False, break_on_hyphens=False)


# ---- curves ----------------------------------------------------------------------------------------
def curve_series(curve: list[dict[str, Any]], metric: str) -> dict[str, tuple[list, ...]]:
    """(epochs, means, stds) of train and test `metric` ("loss" or "acc"); train on training images in
    eval mode when the runs measured it, else the running train figure."""
    scale = 100.0 if metric == "acc" else 1.0
    train_key = (
        f"train_eval_{metric}"
        if curve and all(r.get(f"train_eval_{metric}") is not None for r in curve)
        else f"train_{metric}"
    )
    out = {}
    for split, key in (("train", train_key), ("test", f"test_{metric}")):
        pts = [
            (r["epoch"], r[key] * scale, (r.get(f"{key}_std") or 0.0) * scale) for r in curve if r.get(key) is not None
        ]
        if pts:
            out[split] = tuple(map(list, zip(*pts, strict=True)))
    return out


def draw_curve(ax: Any, series: dict[str, tuple], c: Any, label: str | None) -> None:
    for split, style in (("train", "--"), ("test", "-")):
        if split not in series:
            continue
        x, y, s = series[split]
        ax.plot(x, y, style, marker="o", markersize=3, color=c, label=label if split == "test" else None)
        if any(s):
            ax.fill_between(
                x,
                [a - b for a, b in zip(y, s, strict=True)],
                [a + b for a, b in zip(y, s, strict=True)],
                color=c,
                alpha=0.15,
            )


def mark_overfitting(ax: Any, row: Row, c: Any) -> None:
    """The epoch of lowest test loss (a dotted line) and where early stopping would stop (dash-dot)."""
    o = row.get("overfit")
    if not o:
        return
    ax.axvline(o.min_epoch, color=c, linestyle=":", linewidth=1)
    if o.stop_epoch is not None and o.stop_epoch < o.epochs:
        ax.axvline(o.stop_epoch, color=c, linestyle="-.", linewidth=1)


def resizes(curve: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """Where a curve's workers changed: (between which epochs, "3 to 2 workers")."""
    return [
        (b["epoch"] - 0.5, f"{a['workers']} to {b['workers']} workers")
        for a, b in zip(curve, curve[1:], strict=False)
        if a.get("workers") is not None and b.get("workers") is not None and a["workers"] != b["workers"]
    ]


def mark_resizes(ax: Any, curve: list[dict[str, Any]]) -> None:
    """A grey dashed line where the workers changed, labelled with the change."""
    for x, text in resizes(curve):
        ax.axvline(x, color="0.5", linestyle="--", linewidth=1)
        ax.annotate(text, (x, 1.0), xycoords=("data", "axes fraction"), fontsize="x-small", color="0.4",
                    rotation=90, ha="right", va="top")  # fmt: skip


def plot_curves(
    labels: list[str], curves: list[list[dict[str, Any]]], rows: list[Row] | None, path: Path
) -> Plot | None:
    """Loss and accuracy per epoch, train dashed and test solid: together for a few points, else one panel each."""
    if not any(curves):
        return None
    eval_mode = all(r.get("train_eval_loss") is not None for c in curves for r in c)
    train = "train (training images, eval mode)" if eval_mode else "train (running, augmented)"
    caption = f"Loss and accuracy per epoch: solid test, dashed {train}; mean over seeds, shaded ± std."
    if rows is not None:
        caption += (
            " Dotted line: the epoch of lowest test loss; dash-dot: where early stopping (patience 2) would stop."
        )
    if any(resizes(curve) for curve in curves):
        caption += " Grey dashed line: the run's workers changed there (a resume on fewer, a host lost or joined)."
    if len(labels) <= MAX_POINTS_TOGETHER:
        fig, (ax_l, ax_a) = pyplot().subplots(1, 2, figsize=(12.0, 4.6))
        for i, (label, curve) in enumerate(zip(labels, curves, strict=True)):
            for ax, metric in ((ax_l, "loss"), (ax_a, "acc")):
                draw_curve(ax, curve_series(curve, metric), color(i, len(labels)), wrap(label))
                mark_resizes(ax, curve)
                if rows is not None and metric == "loss":
                    mark_overfitting(ax, rows[i], color(i, len(labels)))
        style_curve_axes(ax_l, "loss")
        style_curve_axes(ax_a, "acc")
        ax_a.legend(
            fontsize="small", title="point (solid test, dashed train)", loc="center left", bbox_to_anchor=(1.02, 0.5)
        )
        return save(fig, path, caption)
    cols = min(4, len(labels))
    nrows = math.ceil(len(labels) / cols)
    fig, axes = pyplot().subplots(2 * nrows, cols, figsize=(3.6 * cols, 3.0 * 2 * nrows), squeeze=False, sharex=True)
    for i, (label, curve) in enumerate(zip(labels, curves, strict=True)):
        r, col = divmod(i, cols)
        for k, metric in enumerate(("loss", "acc")):
            ax = axes[2 * r + k][col]
            draw_curve(ax, curve_series(curve, metric), color(0, 2), None)
            mark_resizes(ax, curve)
            if rows is not None and metric == "loss":
                mark_overfitting(ax, rows[i], "grey")
            style_curve_axes(ax, metric)
            ax.set_title(wrap(label), fontsize="small")
    for i in range(len(labels), nrows * cols):
        r, col = divmod(i, cols)
        axes[2 * r][col].set_visible(False)
        axes[2 * r + 1][col].set_visible(False)
    fig.suptitle("Loss (upper) and accuracy (lower) per epoch, one panel per point: solid test, dashed train")
    return save(fig, path, caption)


def style_curve_axes(ax: Any, metric: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel="accuracy (%)" if metric == "acc" else "cross-entropy loss")
    ax.grid(alpha=0.3)


# ---- speed -------------------------------------------------------------------------------------------
def plot_speed(rows: list[Row], path: Path) -> Plot | None:
    """Training throughput per point with its noise; hatched where the run competed with other work."""
    timed = [r for r in rows if r.get("images_per_s")]
    if len(timed) < 2:
        return None
    fig, ax = pyplot().subplots(figsize=(9.0, max(2.4, 0.9 + 0.5 * len(timed))))
    labels = [wrap(r["point"]) for r in timed]
    values = [r.get("images_per_s") or 0.0 for r in timed]
    errors = [v * (t.noise or 0.0) if (t := r.get("timing")) else 0.0 for v, r in zip(values, timed, strict=True)]
    bars = ax.barh(
        labels, values, xerr=errors, capsize=3, color=[color(1 if r.get("is_baseline") else 0, 10) for r in timed]
    )
    for bar, r in zip(bars, timed, strict=True):
        if r["load"].contended:
            bar.set_hatch("//")
    ax.invert_yaxis()  # first point on top, as in the tables
    ax.set(
        title="Training throughput (error bars: noise)",
        xlabel="training images per second (epochs after the first)",
        xlim=(0, max(v + e for v, e in zip(values, errors, strict=True)) * 1.1),
    )
    ax.grid(alpha=0.3, axis="x")
    return save(
        fig,
        path,
        "Training images per second of each point (orange: the baseline), with the noise of the "
        "timing; a hatched bar's runs shared the machine with other work, so its clock is unreliable.",
    )


def plot_batch_size(points: list[Point], rows: list[Row], path: Path) -> Plot | None:
    """Throughput and peak memory against the local batch size, one line per other setting; both axes from 0."""
    if len({r["local_batch"] for r in rows if isinstance(r.get("local_batch"), int)}) < 2:
        return None
    if not any(a.endswith("batch_size") for p in points for a in p.axes):
        return None  # the batch differs along with something else (a DDP point's share of one batch): not a batch sweep
    fig, (ax_t, ax_m) = pyplot().subplots(1, 2, figsize=(12.0, 4.6))
    groups = groups_without(points, ("train.batch_size",))
    for g, members in enumerate(groups):
        sel = sorted(
            (rows[i] for i in members if setting(rows[i], "local_batch")), key=lambda r: setting(r, "local_batch") or 0
        )
        label = wrap(group_label(points, members)) if len(groups) > 1 else "all points"
        for ax, key in ((ax_t, "images_per_s"), (ax_m, "peak_mib")):
            pts = [
                (r["local_batch"], figure(r, key), figure(r, f"{key}_std") or 0.0)
                for r in sel
                if figure(r, key) is not None
            ]
            if pts:
                x, y, s = zip(*pts, strict=True)
                ax.errorbar(x, y, yerr=s, marker="o", capsize=3, color=color(g, len(groups)), label=label)
    ax_t.set(
        title="Training throughput vs batch size",
        xlabel="local batch size (images per rank)",
        ylabel="training images/s (epochs after the first)",
    )
    ax_m.set(title="Peak memory vs batch size", xlabel="local batch size (images per rank)", ylabel=memory_axis(rows))
    batches: list[float] = sorted({b for r in rows if (b := setting(r, "local_batch"))})
    for ax in (ax_t, ax_m):
        powers_of_two_axis(ax, batches)
    ax_m.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save(fig, path, "Training throughput and peak memory per rank against the local batch size (axes from 0).")


def plot_model(curves: Any, path: Path) -> Plot:
    """The scaling model's lines (dashed) through the measured points (markers): speedup against workers, and
    the training epoch against the local batch where the points span batches."""
    panels = 2 if curves.batch else 1
    fig, axes = pyplot().subplots(1, panels, figsize=(6.0 * panels, 4.6), squeeze=False)
    ax_w = axes[0][0]
    draw_predicted(ax_w, curves.workers)
    first = curves.workers[0]
    ax_w.plot(first.x, first.ideal, ":", color="0.5", label="ideal (devices added)")
    ax_w.set(title="Speedup vs workers", xlabel="workers", ylabel="speedup over 1 worker (training throughput)")
    powers_of_two_axis(ax_w, first.x)
    ax_w.legend(fontsize="small")
    if curves.batch:
        ax_b = axes[0][1]
        draw_predicted(ax_b, curves.batch)
        ax_b.set(
            title="Training epoch vs local batch",
            xlabel="local batch size (images per rank)",
            ylabel="seconds a training epoch (epochs after the first)",
        )
        powers_of_two_axis(ax_b, sorted({x for c in curves.batch for x, _ in c.measured}))
        ax_b.legend(fontsize="small")
    return save(
        fig,
        path,
        f"The scaling model (ddplab plan), planned from {curves.source} over this machine's "
        "measured link (dashed), and the points measured (markers); on a CPU the ideal is the "
        "machines added, as processes on one share its cores.",
    )


def draw_predicted(ax: Any, curves: list[Any]) -> None:
    for g, c in enumerate(curves):
        col = color(g, len(curves))
        ax.plot(c.x, c.predicted, "--", color=col, label=f"{c.label}: predicted")
        if c.measured:
            ax.plot(*zip(*c.measured, strict=True), "o", color=col, label=f"{c.label}: measured")


def powers_of_two_axis(ax: Any, ticks: list[float]) -> None:
    """x on a log-2 scale ticked at the values measured; y from 0 (a change from 820 to 852 must look like what
    it is)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def memory_axis(rows: list[Row]) -> str:
    labels = {m for r in rows if (m := r.get("memory_label"))}
    label = labels.pop() if len(labels) == 1 else ""
    return {
        "peak_rss_mib": "peak RSS per rank (MiB; the whole process: data, torch)",
        "peak_alloc_mib": "peak allocated per rank (MiB)",
        "peak_reserved_mib": "peak reserved per rank (MiB)",
    }.get(label, "peak memory per rank (MiB)")


def group_label(points: list[Point], members: list[int]) -> str:
    """What a group of points shares: the axis values equal across it, or its first point's label."""
    from ddplab.report.runs import axis_text

    first = points[members[0]].axes
    same = {a: v for a, v in first.items() if all(points[i].axes.get(a) == v for i in members)}
    return ", ".join(axis_text(a, a.rsplit(".", 1)[-1], v) for a, v in same.items()) or points[members[0]].label


def time_parts(row: Row) -> dict[str, float]:
    """Shares of training time that add up to 1: communication wait is taken out of forward+backward."""
    comm = row.get("comm_wait_share") or 0.0
    parts = {
        "data": row.get("data_share") or 0.0,
        "forward+backward": max((row.get("forward_backward_share") or 0.0) - comm, 0.0),
        "comm wait": comm,
        "optimizer": row.get("optimizer_share") or 0.0,
    }
    parts["other"] = max(1.0 - sum(parts.values()), 0.0)
    return parts


def plot_time_breakdown(rows: list[Row], path: Path) -> Plot | None:
    """Stacked bars: where each point's training time went (epochs after the first)."""
    sel = [r for r in rows if r.get("forward_backward_share") is not None]
    if not sel:
        return None
    fig, ax = pyplot().subplots(figsize=(9.0, max(2.5, 1.0 + 0.5 * len(sel))))
    names = list(time_parts(sel[0]))
    left = [0.0] * len(sel)
    labels = [wrap(r["point"]) for r in sel]
    for k, name in enumerate(names):
        widths = [100 * time_parts(r)[name] for r in sel]
        ax.barh(labels, widths, left=left, color=color(k, len(names)), label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set(
        title="Where training time went (epochs after the first)",
        xlabel="share of training time (%)",
        xlim=(0, max(100.0, *left)),
    )
    ax.invert_yaxis()
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="x")
    return save(fig, path, "Where training time went; communication wait shown apart from forward+backward.")


def step_positions(steps: list[dict[str, Any]], steps_per_epoch: int | None) -> list[tuple[float, float]]:
    """(epoch as a fraction, loss) per step record: x = step / steps per epoch when the step count is global."""
    out = []
    is_global = bool(steps_per_epoch) and any(r.get("step", 0) > steps_per_epoch for r in steps)
    for r in steps:
        if not isinstance(r.get("train_loss"), (int, float)) or not isinstance(r.get("step"), (int, float)):
            continue
        if steps_per_epoch:
            x = r["step"] / steps_per_epoch if is_global else r.get("epoch", 1) - 1 + r["step"] / steps_per_epoch
        else:
            x = r["step"]
        out.append((x, r["train_loss"]))
    return out


def plot_step_loss(points: list[Point], path: Path) -> Plot | None:
    """Training loss at each recorded step, mean over seeds: a curve for runs too short for epoch curves."""
    if not points or len(points) > MAX_POINTS_TOGETHER or max(len(r.history) for p in points for r in p.runs) > 3:
        return None
    series = []
    for p in points:
        per_x: dict[float, list[float]] = {}
        for run in p.runs:
            spe = run.summary["batch"].get("steps_per_epoch") if run.summary else None
            for x, value in step_positions(run.steps, spe):
                per_x.setdefault(round(x, 6), []).append(value)
        if per_x:
            xs = sorted(per_x)
            series.append((p.label, xs, [sum(per_x[x]) / len(per_x[x]) for x in xs]))
    if not series:
        return None
    fig, ax = pyplot().subplots(figsize=(9.0, 4.6))
    for i, (label, xs, ys) in enumerate(series):
        ax.plot(xs, ys, color=color(i, len(series)), label=wrap(label), linewidth=1.2)
    ax.set(
        title="Training loss per step (mean over seeds)",
        xlabel="epoch (steps as fractions of an epoch)",
        ylabel="train loss (cross-entropy)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title="point", loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save(fig, path, "Training loss per recorded step (steps.jsonl): a curve for runs of a few epochs.")


def plot_gpu_utilization(points: list[Point], path: Path) -> Plot | None:
    """GPU utilization over time (gpu.jsonl), one panel per run, one line per GPU; None when not measured."""
    runs = [r for p in points for r in p.runs if r.gpu][:MAX_GPU_PANELS]
    if not runs:
        return None
    cols = 1 if len(runs) == 1 else 2
    nrows = (len(runs) + cols - 1) // cols
    fig, axes = pyplot().subplots(nrows, cols, figsize=(5.5 * cols, 3.0 * nrows), squeeze=False)
    for ax, run in zip(axes.flat, runs, strict=False):
        gpus = sorted({(r.get("rank", 0), r.get("gpu", 0)) for r in run.gpu})
        for k, (rank, gpu) in enumerate(gpus):
            pts = sorted(
                (r["t_s"], r["util_pct"])
                for r in run.gpu
                if (r.get("rank", 0), r.get("gpu", 0)) == (rank, gpu)
                and isinstance(r.get("util_pct"), (int, float))
                and isinstance(r.get("t_s"), (int, float))
            )
            if pts:
                x, y = zip(*pts, strict=True)
                ax.plot(x, y, color=color(k, len(gpus)), label=f"GPU {gpu} (rank {rank})", linewidth=1.2)
        ax.set(title=wrap(run.name), xlabel="time since start (s)", ylabel="utilization (%)", ylim=(0, 105))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in list(axes.flat)[len(runs) :]:
        ax.set_visible(False)
    fig.suptitle("GPU utilization over time")
    return save(fig, path, "GPU utilization sampled during training (gpu.jsonl).")

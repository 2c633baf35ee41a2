"""The report's numbers: one row per run, one per point (mean and std over seeds), as CSV and Markdown.

Times are steady-state where it matters: `epoch_s`, images/s and the time shares leave out
the first epoch, which still warms caches. Speedup is against the 1-worker point of the
same experiment (equal configs once `dist.*` is left out); efficiency is speedup per worker.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Callable
from typing import Any

from ddplab.errors import DataError
from ddplab.metrics.records import PHASES  # the file format's names, torch-free
from ddplab.report.runs import Point, Run, experiment_config, value_text

SHARES = tuple(p.removesuffix("_s") + "_share" for p in PHASES)
TEXT = ("strategy", "device", "precision", "backend", "memory_label")
SETTINGS = ("world_size", "local_batch", "global_batch", "accumulate")  # equal over a point's seeds
MEASURED = ("epochs", "final_test_acc", "best_test_acc", "final_train_acc", "acc_gap", "final_test_loss",
            "total_s", "train_s", "epoch_s", "images_per_s", "peak_mib", *SHARES)
MEMORY_LABELS = ("peak_alloc_mib", "peak_rss_mib", "peak_reserved_mib")  # first found is reported


# ---- per run -----------------------------------------------------------------------------
def run_row(run: Run, point: str = "") -> dict[str, Any]:
    """The figures of one run; a run that did not finish keeps only its status and error."""
    row = {"run": run.name, "point": point, "seed": run.seed, "status": run.status, "error": run.error or "",
           "dir": str(run.dir)}
    if not run.finished:
        return row
    try:
        return {**row, **run_figures(run)}
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        raise DataError(f"{run.dir}: summary.json / metrics.jsonl lack a field ddplab writes ({exc!r}); "
                        "written by another version, or edited?") from None


def run_figures(run: Run) -> dict[str, Any]:
    s, history = run.summary, run.history
    steady = history[1:] or history  # the first epoch carries warm-up
    train_s = sum(r["train_s"] for r in steady)
    label, peak = peak_memory(s)
    final = s["final"]
    return {
        "strategy": s["run"]["strategy"], "device": s["run"]["device"], "precision": s["run"]["precision"],
        "backend": backend(s["run"]["strategy"], run.config.get("dist.backend", "auto"), s["run"]["device"]),
        "memory_label": label,
        "world_size": world_size(s), "local_batch": s["batch"]["local"], "global_batch": s["batch"]["global"],
        "accumulate": s["batch"].get("accumulate", 1),
        "epochs": len(history),
        "final_test_acc": final["test_acc"], "best_test_acc": s["best"]["test_acc"],
        "final_train_acc": final["train_acc"], "acc_gap": difference(final["train_acc"], final["test_acc"]),
        "final_test_loss": final["test_loss"],
        "total_s": s["time"]["total_s"], "train_s": s["time"]["train_s"],
        "epoch_s": statistics.fmean(r["epoch_s"] for r in steady) if steady else None,
        "images_per_s": sum(r["train_samples"] for r in steady) / train_s if train_s else None,
        "peak_mib": peak,
        **{share: sum(r.get(phase, 0.0) for r in steady) / train_s if train_s and phase in steady[-1] else None
           for phase, share in zip(PHASES, SHARES)},
    }


def world_size(summary: dict[str, Any]) -> int:
    """Workers: processes under DDP, GPUs under DataParallel (one process driving several)."""
    gpus = summary.get("gpu_peak_alloc_mib")
    if summary["run"]["strategy"] == "dp" and isinstance(gpus, list) and gpus:
        return len(gpus)
    return summary["run"]["world_size"]


def backend(strategy: str, requested: str, device: str) -> str:
    """The collective backend a DDP run used ("auto" resolved as ddplab does); none without DDP."""
    if strategy != "ddp":
        return "none"
    if requested == "auto":
        return "nccl" if str(device).startswith("cuda") else "gloo"
    return requested


def peak_memory(summary: dict[str, Any]) -> tuple[str | None, float | None]:
    """The largest per-rank peak, named by what it measures (allocated on CUDA, RSS on CPU)."""
    ranks, memory = summary.get("ranks") or {}, summary.get("memory") or {}
    for label in MEMORY_LABELS:
        if isinstance(ranks.get(label), dict) and ranks[label].get("max") is not None:
            return label, ranks[label]["max"]
    for label in MEMORY_LABELS:
        if memory.get(label) is not None:
            return label, memory[label]
    return None, None


def difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


# ---- per point ---------------------------------------------------------------------------
def mean_std(values: list[Any]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the values given; std is None below two values."""
    xs = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def point_rows(points: list[Point], run_rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point: settings, then every measured figure as `name` (mean) and `name_std`."""
    rows = []
    for p in points:
        members = [run_rows[r.name] for r in p.runs]
        row: dict[str, Any] = {"point": p.label, "axes": dict(p.axes), "seeds": len(members),
                               "runs": " ".join(r.name for r in p.runs)}
        for key in (*TEXT, *SETTINGS):
            values = list(dict.fromkeys(m.get(key) for m in members))
            row[key] = values[0] if len(values) == 1 else "mixed"
        for key in MEASURED:
            row[key], row[f"{key}_std"] = mean_std([m.get(key) for m in members])
        rows.append(row)
    add_scaling(rows, points)
    return rows


def add_scaling(rows: list[dict[str, Any]], points: list[Point]) -> None:
    """Speedup and efficiency of each point against the 1-worker point of its group (None without one)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row, p in zip(rows, points):
        config = {k: v for k, v in experiment_config(p.config).items() if not k.startswith("dist.")}
        groups.setdefault(repr(sorted(config.items())) if config else row["point"], []).append(row)
    for members in groups.values():
        base = fewest_workers(members)
        scale(members, base if base is not None and base["world_size"] == 1 else None, "point")


def fewest_workers(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The timed row with the fewest workers, a single-process one first; None when no row was timed."""
    timed = [r for r in rows if r.get("epoch_s") and isinstance(r.get("world_size"), int)]
    if not timed:
        return None
    least = [r for r in timed if r["world_size"] == min(t["world_size"] for t in timed)]
    return next((r for r in least if r["strategy"] == "single"), least[0])


def scale(rows: list[dict[str, Any]], base: dict[str, Any] | None, name: str) -> None:
    """The one definition of scaling, for the report and for `ddplab compare`: speedup is the baseline's
    epoch time over this row's (epochs after the first), efficiency is speedup over the ideal
    (world size / the baseline's). `baseline` names the row compared against, by its `name` field."""
    for row in rows:
        fast = base is not None and bool(row.get("epoch_s")) and isinstance(row.get("world_size"), int)
        row["speedup"] = base["epoch_s"] / row["epoch_s"] if fast else None
        row["efficiency"] = row["speedup"] / (row["world_size"] / base["world_size"]) if fast else None
        row["baseline"] = base[name] if fast else None


# ---- CSV ---------------------------------------------------------------------------------
RUN_COLUMNS = ("run", "point", "seed", "status", *TEXT, *SETTINGS, *MEASURED, "error", "dir")


def point_columns(rows: list[dict[str, Any]]) -> list[str]:
    axes = list(dict.fromkeys(a for r in rows for a in r["axes"]))
    measured = [c for k in MEASURED for c in (k, f"{k}_std")]
    return ["point", *(axis_column(a) for a in axes), "seeds", *TEXT, *SETTINGS, *measured,
            "speedup", "efficiency", "baseline", "runs"]


def axis_column(axis: str) -> str:
    """An axis keeps its name as a column unless a figure has it ("world_size" -> "axis:world_size")."""
    return f"axis:{axis}" if axis in ("point", "seeds", "runs", *TEXT, *SETTINGS, *MEASURED) else axis


def csv_text(rows: list[dict[str, Any]], columns: list[str] | tuple[str, ...]) -> str:
    """Rows as CSV, axis values spread into their columns, missing figures left empty."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        flat = {**row, **{axis_column(a): value_text(v) for a, v in row.get("axes", {}).items()}}
        writer.writerow({c: "" if flat.get(c) is None else flat[c] for c in columns})
    return buffer.getvalue()


# ---- human-readable tables (Markdown and HTML share them) -------------------------------
Column = tuple[str, Callable[[dict[str, Any]], str]]


def point_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the points table: what was run, how well, how fast, how big."""
    axes = list(dict.fromkeys(a for r in rows for a in r["axes"]))
    columns: list[Column] = [("point", lambda r: r["point"])]
    columns += [(a, lambda r, a=a: value_text(r["axes"].get(a, ""))) for a in axes]
    columns += [("seeds", lambda r: str(r["seeds"])), *setting_columns(), *figure_columns(rows),
                ("speedup", lambda r: times(r["speedup"])), ("efficiency", lambda r: percent(r["efficiency"], digits=0))]
    return render(columns, rows)


def share_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Where training time went (epochs after the first); communication wait is part of forward+backward."""
    return render([("point", lambda r: r["point"]), *share_columns()], rows)


def share_columns() -> list[Column]:
    titles = {"data_share": "data %", "forward_backward_share": "forward+backward %", "optimizer_share": "optimizer %",
              "comm_wait_share": "comm wait %"}
    return [(title, lambda r, k=k: pm(r, k, percent_value)) for k, title in titles.items()]


def run_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the per-run table (finished runs)."""
    columns: list[Column] = [("run", lambda r: r["run"]), ("point", lambda r: r["point"]),
                             ("seed", lambda r: value_text(r["seed"])), ("status", lambda r: r["status"]),
                             *setting_columns(), *figure_columns(rows)]
    return render(columns, rows)


def setting_columns() -> list[Column]:
    return [("strategy", lambda r: str(r["strategy"])), ("world", lambda r: str(r["world_size"])),
            ("batch local/global", lambda r: f"{r['local_batch']}/{r['global_batch']}"),
            ("precision", lambda r: str(r["precision"])), ("backend", lambda r: str(r["backend"]))]


def figure_columns(rows: list[dict[str, Any]]) -> list[Column]:
    labels = {r.get("memory_label") for r in rows if r.get("memory_label")}
    memory = f"{labels.pop().removesuffix('_mib')} MiB/rank" if len(labels) == 1 else "peak MiB/rank"
    show_label = len(labels) > 1  # several kinds of memory: name each cell's

    def peak(r: dict[str, Any]) -> str:
        text = pm(r, "peak_mib", lambda v: f"{v:,.0f}")
        return f"{text} ({r['memory_label'].removesuffix('_mib')})" if show_label and r.get("memory_label") else text

    return [("final test acc %", lambda r: pm(r, "final_test_acc", percent_value)),
            ("best test acc %", lambda r: pm(r, "best_test_acc", percent_value)),
            ("train-test gap %", lambda r: pm(r, "acc_gap", percent_value)),
            ("total s", lambda r: pm(r, "total_s", seconds)), ("train s", lambda r: pm(r, "train_s", seconds)),
            ("epoch s", lambda r: pm(r, "epoch_s", seconds)),
            ("images/s", lambda r: pm(r, "images_per_s", lambda v: f"{v:,.0f}")), (memory, peak)]


def render(columns: list[Column], rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in columns], [[f(r) for _, f in columns] for r in rows]


def pm(row: dict[str, Any], key: str, fmt: Callable[[float], str]) -> str:
    """`mean ± std` when the point has repeats, the value alone otherwise, "-" when missing."""
    value, std = row.get(key), row.get(f"{key}_std")
    if value is None:
        return "-"
    return f"{fmt(value)} ± {fmt(std)}" if std is not None else fmt(value)


def percent_value(v: float) -> str:
    return f"{100 * v:.2f}"


def percent(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f}%"


def seconds(v: float) -> str:
    return f"{v:,.2f}" if v < 1000 else f"{v:,.0f}"


def times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def markdown_table(headers: list[str], cells: list[list[str]]) -> str:
    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    return "\n".join([line(headers), "|" + "---|" * len(headers), *(line(row) for row in cells)])


def sections(points: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[tuple[str, str, tuple[list[str], list[list[str]]]]]:
    """The report's tables as (heading, note, (headers, cells)), shared by report.md and index.html."""
    finished = [r for r in runs if "final_test_acc" in r]
    return [
        ("Points (mean ± std over seeds)", "Speedup: 1-worker epoch time / this point's (epochs after the first, "
         "same config apart from dist.*); efficiency = speedup / world size.", point_table(points)),
        ("Time shares (% of training time, epochs after the first)", "Communication wait is measured inside "
         "forward+backward, so the shares may add up to more than 100%.", share_table(points)),
        ("Runs", "", run_table(finished)),
    ]


def markdown_report(title: str, findings: list[str], points: list[dict[str, Any]], runs: list[dict[str, Any]],
                    problems: list[dict[str, Any]], plots: dict[str, str]) -> str:
    """report.md: findings, the tables, plot links, and the runs that did not finish."""
    parts = [f"# {title}", "## Findings", "\n".join(f"- {f}" for f in findings)]
    for heading, note, table in sections(points, runs):
        parts += [f"## {heading}", markdown_table(*table) if table[1] else "none"] + ([note] if note else [])
    if plots:
        parts += ["## Plots", "\n\n".join(f"![{name}]({path})" for name, path in plots.items())]
    if problems:
        parts += ["## Runs that did not finish",
                  "\n".join(f"- {p['run']} ({p['status']}): {p['error'] or 'no error recorded'}" for p in problems)]
    return "\n\n".join(parts) + "\n"


# ---- curves --------------------------------------------------------------------------------
CURVE_KEYS = ("train_loss", "test_loss", "train_acc", "test_acc")


def mean_curve(histories: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-epoch mean and std over a point's seeds, up to the epoch every seed reached."""
    curve = []
    for i in range(min((len(h) for h in histories), default=0)):
        record: dict[str, Any] = {"epoch": histories[0][i].get("epoch", i + 1)}
        for key in CURVE_KEYS:
            record[key], record[f"{key}_std"] = mean_std([h[i].get(key) for h in histories])
        curve.append(record)
    return curve

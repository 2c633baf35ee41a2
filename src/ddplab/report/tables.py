"""The report's tables, as (headers, cells) shared by report.md, index.html and `ddplab compare`, and its CSVs.

A finding restates cells of these tables: every number a finding gives is formatted here,
by the same function, so the page never says one figure in a sentence and another in a
table (tested).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import Any, TypeVar

from ddplab.report.figures import SHARES
from ddplab.report.records import MEASURED, SETTINGS, TEXT, Comparison, Gap, PairPrediction, Row, figure, judged
from ddplab.sweepdir.spec import point_text

T = TypeVar("T")  # a point's figures (a Row) or a Comparison
Column = tuple[str, Callable[[T], str]]  # a header, and the cell of a row


# ---- formats (one per kind of figure) --------------------------------------------------------
def percent_value(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def percent(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f}%"


def points_value(v: float | None) -> str:
    """A difference of accuracies, in percentage points, signed."""
    return "-" if v is None else f"{100 * v:+.1f}"


def seconds(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}" if v < 1000 else f"{v:,.0f}"


def seconds_signed(v: float) -> str:
    """A difference in seconds, signed; no "-0.00" from float error."""
    return f"{round(v, 2) + 0.0:+,.2f}"


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def faster(ratio: float | None) -> str:
    """A throughput ratio as people say it: 1.25x faster, 4.71x slower; "as fast" where it rounds to 1.00x (a
    "1.00x slower" reads as an effect that is not there)."""
    if ratio is None:
        return "-"
    if f"{ratio:.2f}" == "1.00" and f"{1 / ratio:.2f}" == "1.00":
        return "as fast"
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def mib(v: float) -> str:
    return f"{v:,.0f}"


def loss(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def pm(row: Row, key: str, fmt: Callable[[float], str]) -> str:
    """`mean ± std` when the point has repeats, the value alone otherwise, "-" when missing."""
    value, std = figure(row, key), figure(row, f"{key}_std")
    if value is None:
        return "-"
    return f"{fmt(value)} ± {fmt(std)}" if std is not None else fmt(value)


def noise_cell(row: Row) -> str:
    timing = row.get("timing")
    if timing is None or timing.noise is None:
        return "-"
    return f"±{timing.noise:.1%}" + (" (1 run)" if timing.basis == "within-run" else "")


def load_cell(row: Row) -> str:
    load = row.get("load")
    if load is None or not (load.measured or load.shared_device):
        return "not recorded"
    parts = [f"{load.other_cpu:.0%} CPU"] if load.other_cpu is not None else []
    if load.shared_device:
        parts.append("workers on one GPU: a check, not a speed")
    elif load.gpu_others:
        parts.append(f"{load.gpu_others} on GPU")
    return ", ".join(parts) + (" (contended)" if load.contended else "")


def memory_title(rows: list[Row]) -> str:
    labels = {m for r in rows if (m := r.get("memory_label"))}
    if len(labels) == 1:
        return {
            "peak_rss_mib": "peak RSS MiB/rank",
            "peak_alloc_mib": "peak alloc MiB/rank",
            "peak_reserved_mib": "peak reserved MiB/rank",
        }.get(labels.pop(), "peak MiB/rank")
    return "peak MiB/rank"


def render(columns: list[Column[T]], rows: list[T]) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in columns], [[f(r) for _, f in columns] for r in rows]


# ---- the section tables ----------------------------------------------------------------------
def results_table(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """How well each point learned: final accuracies, the train-test gap, test loss and its minimum."""
    eval_mode = all(r.get("gap_basis") == "eval mode" for r in rows)
    train = "train acc % (eval mode)" if eval_mode else "train acc %"
    return render(
        [
            ("point", lambda r: r["point"]),
            ("seeds", lambda r: str(r["seeds"])),
            ("test acc %", lambda r: pm(r, "final_test_acc", percent_value)),
            (
                train,
                lambda r: pm(
                    r, "train_eval_acc" if r.get("train_eval_acc") is not None else "final_train_acc", percent_value
                ),
            ),
            ("gap (points)", lambda r: points_value(r.get("acc_gap"))),
            ("test loss", lambda r: loss(r.get("final_test_loss"))),
            ("min test loss (epoch)", lowest_test_loss),
            ("acc noise (points)", lambda r: "-" if (n := r.get("acc_noise")) is None else f"{100 * n:.1f}"),
        ],
        rows,
    )


def lowest_test_loss(row: Row) -> str:
    """The lowest point of the mean test-loss curve, as the overfitting table and findings give it; a
    single run's lowest epoch where there is no curve (a mean of the seeds' epochs is no epoch)."""
    if o := row.get("overfit"):
        return f"{loss(o.min_test_loss)} ({o.min_epoch})"
    return f"{loss(row.get('min_test_loss'))} ({epoch_text(row.get('min_test_loss_epoch'))})"


def epoch_text(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def speed_table(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """How each point ran: workers, batch, training throughput with its noise, what else ran, memory."""
    return render(
        [
            ("point", lambda r: r["point"]),
            ("workers", lambda r: str(r["world_size"])),
            ("batch local/global", lambda r: f"{r['local_batch']}/{r['global_batch']}"),
            ("precision", lambda r: str(r["precision"])),
            ("backend", lambda r: str(r["backend"])),
            ("train images/s", lambda r: "-" if not r.get("images_per_s") else rate(r["images_per_s"])),
            ("noise", noise_cell),
            ("cores busy", lambda r: "-" if r.get("cores_busy") is None else f"{r['cores_busy']:.2f}"),
            ("other load", load_cell),
            (memory_title(rows), lambda r: pm(r, "peak_mib", mib)),
        ],
        rows,
    )


def band_range(p: PairPrediction) -> str:
    """The speedups the band around a prediction spans (a prediction with a band)."""
    assert p.band is not None
    lo, hi = p.band.around(p.speedup)
    return f"{lo:.2f}-{hi:.2f}x"


def predicted_cell(p: PairPrediction | None) -> str:
    """The model's speedup and the band its errors on checked cases give it."""
    if p is None:
        return "-"
    if p.band is None or not p.band.cases:
        return times(p.speedup)
    return f"{times(p.speedup)} ({band_range(p)}{', ' + p.band.mark if p.band.mark else ''})"


def comparison_table(pairs: list[Comparison], scaling: bool) -> tuple[list[str], list[list[str]]]:
    """Each point against its baseline: speed with its verdict, accuracy with its verdict."""
    speed: list[Column] = (
        [("speedup", lambda c: times(c.speedup)), ("of ideal", lambda c: efficiency_cell(c))]
        if scaling
        else [("speed", lambda c: faster(c.speedup))]
    )
    if scaling and any(c.predicted is not None for c in pairs):
        speed.append(("predicted (error band)", lambda c: predicted_cell(c.predicted)))
    return render(
        [
            ("point", lambda c: c.point),
            ("vs", lambda c: c.baseline),
            *speed,
            ("timing verdict", lambda c: c.timing_verdict.text()),
            ("test acc Δ (points)", lambda c: points_value(c.acc_diff)),
            ("accuracy verdict", lambda c: c.acc_verdict.text()),
        ],
        pairs,
    )


def gap_table(pairs: list[Comparison]) -> tuple[list[str], list[list[str]]]:
    """Scaling points short of the ideal: a training epoch against the ideal one, taken apart by phase."""
    with_gap = [(c, c.gap) for c in pairs if c.gap is not None]
    names = list(with_gap[0][1].parts) if with_gap else []

    def part(gap: Gap, name: str) -> str:
        value = gap.parts[name]
        return "-" if value is None else seconds_signed(value)

    return render(
        [
            ("point", lambda cg: cg[0].point),
            ("vs", lambda cg: cg[0].baseline),
            ("epoch s", lambda cg: seconds(cg[1].epoch_s)),
            ("ideal s", lambda cg: seconds(cg[1].ideal_epoch_s)),
            *[(f"{name} s", lambda cg, name=name: part(cg[1], name)) for name in names],
            ("the most", lambda cg: cg[1].biggest),
        ],
        with_gap,
    )


def communication_table(pairs: list[Comparison]) -> tuple[list[str], list[list[str]]]:
    """Scaling points' all-reduce per step measured two ways, the stragglers, and what the measured link predicts."""
    timed = [c for c in pairs if c.row.get("ddp_exposed_ms") is not None]
    link = (
        [("link predicts ms", lambda c: ms(c.predicted.link_ms if c.predicted else None))]
        if any(c.predicted and c.predicted.link_ms is not None for c in timed)
        else []
    )
    return render(
        [
            ("point", lambda c: c.point),
            ("probe wait ms", lambda c: ms(c.row.get("probe_comm_ms"))),
            ("DDP exposed ms", lambda c: ms(c.row["ddp_exposed_ms"])),
            ("DDP span ms", lambda c: ms(c.row["ddp_comm_ms"])),
            ("rank 0 waits for stragglers ms", lambda c: ms(c.row["straggler_ms"])),
            *link,
        ],
        timed,
    )


def efficiency_cell(c: Comparison) -> str:
    if c.efficiency is None:
        return "-"
    return f"{c.efficiency:.0%} (ideal {c.ideal:g}x)"


def overfitting_table(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Where each point's test loss bottomed out, how far it rose, and where early stopping would stop."""

    def stop(r: Row) -> str:
        o = judged(r)
        if o.stop_epoch is None or o.stop_epoch >= o.epochs:
            return "not before the end"
        return f"epoch {o.stop_epoch} ({percent_value(o.stop_test_acc)}%)"

    with_curve = [r for r in rows if r.get("overfit")]
    return render(
        [
            ("point", lambda r: r["point"]),
            (
                "lowest test loss",
                lambda r: f"{loss(judged(r).min_test_loss)} (epoch {judged(r).min_epoch})",
            ),
            ("final test loss", lambda r: f"{loss(judged(r).final_test_loss)} (epoch {judged(r).epochs})"),
            ("rise", lambda r: f"{judged(r).rise:+.0%}"),
            ("gap (points)", lambda r: points_value(r.get("acc_gap"))),
            ("overfits", lambda r: "yes" if judged(r).overfits else "no"),
            ("early stop (patience 2) after", stop),
        ],
        with_curve,
    )


def detail_table(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Clocks and where the training time went (epochs after the first); comm wait is part of forward+backward."""
    titles = {
        "data_share": "data %",
        "forward_backward_share": "fwd+bwd %",
        "comm_wait_share": "of which comm wait %",
        "optimizer_share": "optimizer %",
    }
    return render(
        [
            ("point", lambda r: r["point"]),
            ("epochs", lambda r: pm(r, "epochs", lambda v: f"{v:g}")),
            ("total s", lambda r: pm(r, "total_s", seconds)),
            ("train s", lambda r: pm(r, "train_s", seconds)),
            ("eval s", lambda r: pm(r, "eval_s", seconds)),
            ("epoch s", lambda r: pm(r, "epoch_s", seconds)),
            *[(title, lambda r, k=k: pm(r, k, percent_value)) for k, title in titles.items()],
        ],
        rows,
    )


def markdown_table(headers: list[str], cells: list[list[str]]) -> str:
    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    return "\n".join([line(headers), "|" + "---|" * len(headers), *(line(row) for row in cells)])


# ---- CSV -------------------------------------------------------------------------------------
RUN_COLUMNS = ("section", "run", "point", "seed", "status", *TEXT, *SETTINGS, *MEASURED, "other_cpu", "error", "dir")


def point_columns(rows: list[Row]) -> list[str]:
    axes = list(dict.fromkeys(a for r in rows for a in r["axes"]))
    measured = [c for k in MEASURED for c in (k, f"{k}_std")]
    return [
        "section",
        "point",
        *(axis_column(a) for a in axes),
        "seeds",
        *TEXT,
        *SETTINGS,
        *measured,
        "images_per_s_noise",
        "other_cpu",
        "speedup",
        "efficiency",
        "baseline",
        "runs",
    ]


def axis_column(axis: str) -> str:
    """An axis keeps its name as a column unless a figure has it ("world_size" -> "axis:world_size")."""
    taken = ("section", "point", "seeds", "runs", *TEXT, *SETTINGS, *MEASURED, *SHARES)
    return f"axis:{axis}" if axis in taken else axis


def csv_text(rows: list[Row], columns: list[str] | tuple[str, ...]) -> str:
    """Rows as CSV, axis values spread into their columns, missing figures left empty. A cell that a
    spreadsheet would read as a formula (=, +, -, @ first) is quoted with a leading apostrophe."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        flat: dict[str, Any] = {**row, **{axis_column(a): point_text(v) for a, v in row.get("axes", {}).items()}}
        writer.writerow({c: csv_cell(flat.get(c)) for c in columns})
    return buffer.getvalue()


def csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value

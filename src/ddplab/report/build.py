"""`build_report`: run and sweep folders in; index.html, report.md, CSVs and PNG plots out, a section per question.

The one entry point of `ddplab report`. It reads run folders only and never imports torch,
so a report can be made on a laptop from folders copied off a GPU machine. It prints
nothing: the caller decides what to show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddplab.io import files
from ddplab.report import figures, html, plots, tables
from ddplab.report.headline import headline
from ddplab.report.kinds import kind_of, section_findings
from ddplab.report.records import Row, Section
from ddplab.report.runs import load_runs
from ddplab.report.sections import architecture, build_sections, setup_text
from ddplab.rundir.runread import displayable

RESULTS_NOTE = (
    "Mean ± std over seeds. Train accuracy is measured on training images as the test set is (eval mode, "
    "no augmentation) where the runs did so; gap = train - test accuracy. Acc noise: the larger of the seed "
    "std and the test set's sampling noise."
)
SPEED_NOTE = (
    "Training images per second of training time (epochs after the first). Noise: over seeds, else "
    "within one run. Cores busy: CPU cores the run's processes kept busy. Other load: the share of the "
    "machine's CPUs that other processes used while it trained (worst epoch); contended runs' clocks are "
    "unreliable."
)
GAP_NOTE = (
    "Points below 90% of the ideal: one training epoch (epochs after the first) against the ideal one, "
    "the baseline's over the devices added, by cause: compute is forward+backward less the all-reduce wait "
    "(DDP's own timers where it kept them, else ddplab's probe) and rank 0's wait for the slowest rank "
    "(DDP's timers; '-' where not measured, and then inside compute). The stragglers' part is never "
    "negative, so a shared machine's jitter shows as a small one; when rank 0 is itself the slowest, it is "
    "0 and the others' wait is not in it."
)
COMM_NOTE = (
    "Per training step, epochs after the first. Probe wait: ddplab times one step with and without the "
    "gradient all-reduce, the ranks lined up. DDP exposed: DDP's own timers on the steps it timed (every step "
    "on a CPU, 1 in 20 on CUDA), from the end of backward to the last bucket's end, on the rank that waited "
    "least; span: from the first bucket's launch. Stragglers: how much longer rank 0's exposed wait was. "
    "Link: the all-reduce of these gradients over this machine's measured link (ddplab plan --measure)."
)
SCALING_NOTE = (
    "Speedup: training throughput over the baseline's; of ideal: speedup over the devices added "
    "(GPUs; on a CPU, processes on one machine share its cores: ideal 1x). A timing verdict is "
    "'beyond noise' only past 2 noises and 3%."
)


def build_and_say(out: Path, paths: list[Path], title: str | None = None, echo=print) -> dict[str, Any]:
    """The report of `paths` written under `out`, and said: each section's findings, then where its files are."""
    result = build_report(paths, out, title=title)
    echo(f"{result['num_runs']} runs ({result['num_finished']} finished), {len(result['sections'])} section(s):")
    for number, section in enumerate(result["sections"], 1):
        echo(f"{number}. {section['title']}")
        for line in section["findings"]:
            echo(f"  - {line}")
    echo(f"report: {result['index_html']} (tables: {result['report_md']}, {result['points_csv']})")
    return result


def build_report(paths: list[Path], out: Path, title: str | None = None) -> dict[str, Any]:
    """Write the report under `out`; return its files, counts, and findings (as text, by section). One report
    writes a folder at a time (two at once left one's page over the other's plots): the second is refused."""
    from ddplab.rundir.runlock import run_lock

    with run_lock(Path(out), "report"):
        return _build_report([Path(p) for p in paths], Path(out), title)


def _build_report(paths: list[Path], out: Path, title: str | None) -> dict[str, Any]:
    runs = load_runs(paths)
    run_rows = {r.name: figures.run_row(r) for r in runs}
    sections = build_sections(runs, run_rows)
    for section in reversed(sections):  # a run's point label is the one of the first section it is in
        for p in section.points:
            for r in p.runs:
                run_rows[r.name].update({"point": p.label, "section": section.title})
    files.make_dir(out / "plots")
    views = [section_view(s, out / "plots", f"s{i:02d}") for i, s in enumerate(sections, 1)]
    title = title or "ddplab report: " + ", ".join(p.name or str(p) for p in paths)
    finished = sum(r.finished for r in runs)
    meta = (
        f"{len(runs)} runs ({finished} finished) in {len(sections)} section{'s' * (len(sections) != 1)}, from "
        + ", ".join(str(p) for p in paths)
    )
    for s in sections:  # the CSV's speedup: against the point's first baseline (its 1-worker point first)
        for c in sorted(s.pairs, key=lambda c: not c.scaling):
            if c.row.get("baseline") is None:
                c.row.update({"speedup": c.speedup, "efficiency": c.efficiency, "baseline": c.baseline})
    point_rows: list[Row] = [{**row, "section": s.title} for s in sections for row in s.rows]
    result: dict[str, Any] = {
        "out": out,
        "report_md": out / "report.md",
        "runs_csv": out / "runs.csv",
        "points_csv": out / "points.csv",
        "index_html": out / "index.html",
        "plots": [p.path for v in views for p in v.plots],
        "num_runs": len(runs),
        "num_finished": finished,
        "num_points": len(point_rows),
        "num_not_finished": sum(not r.finished and r.status != "skipped" for r in runs),
        "sections": [
            {
                "title": v.title,
                "headline": v.headline,
                "findings": [f.text for f in v.findings],
                "tables": v.tables + v.details,
                "setup": v.setup,
                "plots": v.plots,
                "kind": s.kind,
            }
            for v, s in zip(views, sections, strict=True)
        ],
        "findings": [f.text for v in views for f in v.findings],
    }
    # Folder names need not be UTF-8 (runs.shown): what the pages and tables show of them is.
    files.write_text(result["runs_csv"], displayable(tables.csv_text(list(run_rows.values()), tables.RUN_COLUMNS)))
    files.write_text(result["points_csv"], displayable(tables.csv_text(point_rows, tables.point_columns(point_rows))))
    files.write_text(result["report_md"], displayable(html.markdown(title, meta, views, "plots")))
    anchors = [f"{i}-{s.slug}" for i, s in enumerate(sections, 1)]
    files.write_text(
        result["index_html"], displayable(html.page(title, meta, views, anchors, any(r.gpu for r in runs)))
    )
    return result


def section_view(section: Section, plot_dir: Path, prefix: str) -> html.SectionView:
    rows = section.rows
    shown: list[html.Table] = []
    if rows:
        shown += [
            ("Results", RESULTS_NOTE, tables.results_table(rows)),
            ("Speed", SPEED_NOTE, tables.speed_table(rows)),
        ]
    scaling = [c for c in section.pairs if c.scaling]
    others = [c for c in section.pairs if not c.scaling]
    if scaling:
        shown.append(("Scaling", SCALING_NOTE, tables.comparison_table(scaling, scaling=True)))
        if any(c.gap for c in scaling):
            shown.append(("Short of the ideal", GAP_NOTE, tables.gap_table(scaling)))
        if any(c.row.get("ddp_exposed_ms") is not None for c in scaling):
            shown.append(("Communication, measured two ways", COMM_NOTE, tables.communication_table(scaling)))
    if others:
        shown.append(
            (
                "Comparisons",
                "Each point against its baseline: speed (training throughput) and test accuracy, "
                "each with its verdict.",
                tables.comparison_table(others, scaling=False),
            )
        )
    overfits = any(o is not None and o.overfits for o in (r.get("overfit") for r in rows))
    if kind_of(section).overfitting == "always" or (kind_of(section).overfitting == "seen" and overfits):
        shown.append(
            (
                "Overfitting",
                "Overfits: the test loss ends more than 10% above its lowest while the training "
                "loss keeps falling. Early stopping: on test loss with patience 2, ddplab's own rule, applied to "
                "the mean curve.",
                tables.overfitting_table(rows),
            )
        )
    details = (
        [
            (
                "Clocks and where the training time went",
                "Epoch s and shares leave out the first epoch; communication wait is part of forward+backward.",
                tables.detail_table(rows),
            )
        ]
        if rows
        else []
    )
    return html.SectionView(
        title=section.title,
        source=section.source,
        question=section.question,
        note=section.note,
        setup=setup_text(section),
        architecture=architecture(section),
        findings=section_findings(section),
        tables=shown,
        details=details,
        plots=plots.make_plots(section, plot_dir, prefix) if rows else [],
        not_measured=section.not_measured,
        problems=section.problems,
        headline=headline(section),
    )

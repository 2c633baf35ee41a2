"""`build_report`: run and sweep folders in, report.md, CSVs, PNG plots and index.html out.

The one entry point of `ddplab report`. It reads run folders only and never imports torch,
so a report can be made on a laptop from folders copied off a GPU machine. It prints
nothing: the caller decides what to show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddplab import files
from ddplab.report import html, plots, tables
from ddplab.report.findings import build_findings
from ddplab.report.runs import group_points, load_runs


def build_report(paths: list[Path], out: Path, title: str | None = None) -> dict[str, Any]:
    """Write the report under `out`; return its file paths, run/point counts and findings."""
    paths, out = [Path(p) for p in paths], Path(out)
    runs = load_runs(paths)
    points = group_points(runs)
    label_of = {r.name: p.label for p in points for r in p.runs}
    run_rows = [tables.run_row(r, label_of.get(r.name, "")) for r in runs]
    point_rows = tables.point_rows(points, {row["run"]: row for row in run_rows})
    curves = [tables.mean_curve([r.history for r in p.runs]) for p in points]
    findings = build_findings(point_rows, [p.config for p in points], curves, run_rows)
    problems = [row for row, run in zip(run_rows, runs) if not run.finished]
    title = title or "ddplab report: " + ", ".join(p.name or str(p) for p in paths)

    files.make_dir(out / "plots")
    made = plots.make_plots(points, point_rows, curves, out / "plots")
    result = {"out": out, "report_md": out / "report.md", "runs_csv": out / "runs.csv",
              "points_csv": out / "points.csv", "index_html": out / "index.html", "plots": list(made.values()),
              "num_runs": len(runs), "num_finished": len(runs) - len(problems), "num_points": len(points),
              "num_not_finished": len(problems), "findings": findings}
    files.write_text(result["runs_csv"], tables.csv_text(run_rows, tables.RUN_COLUMNS))
    files.write_text(result["points_csv"], tables.csv_text(point_rows, tables.point_columns(point_rows)))
    relative = {name: f"plots/{path.name}" for name, path in made.items()}
    files.write_text(result["report_md"], tables.markdown_report(title, findings, point_rows, run_rows, problems, relative))
    files.write_text(result["index_html"], html.page(title, meta(runs, points, paths), findings,
                                                     tables.sections(point_rows, run_rows), made, problems))
    return result


def meta(runs: list[Any], points: list[Any], paths: list[Path]) -> str:
    finished = sum(r.finished for r in runs)
    return (f"{len(runs)} runs ({finished} finished) in {len(points)} points, from "
            + ", ".join(str(p) for p in paths))

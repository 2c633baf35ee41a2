"""A run's figures for its MLflow run: its one-run report (`ddplab report RUN`), made in the process that
started the run once the run has ended. The MLflow sink (metrics/mlflow_sink.py) logs the rest from the main
rank, inside the engine, which sits below the report; a point of a tracked sweep has its figures in the sweep's
report, on the parent run, instead."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ddplab import tracking

if TYPE_CHECKING:
    from ddplab.engine.worker import RunResult

log = logging.getLogger("ddplab")


def report_to_tracker(result: RunResult) -> None:
    """Attach the run's report to the MLflow run its sink logged to (none: nothing to do). A report that
    cannot be made costs the finished run nothing: one line says so."""
    state = result.summary.get("tracking", {}).get("mlflow") if isinstance(result.summary, dict) else None
    ids = tracking.RunIds.read(result.run_dir)
    if not (isinstance(state, dict) and state.get("logged") and ids is not None and ids.uri == state.get("uri")):
        return  # not tracked, not reached, or a server that failed once: no second try for the figures
    link = tracking.PointLink.from_env()
    if link is not None and link.uri == ids.uri:
        return
    from ddplab.report.build import build_report

    with tempfile.TemporaryDirectory(prefix="ddplab-report-") as tmp:
        out = Path(tmp) / "report"
        try:
            build_report([result.run_dir], out)
        except Exception as exc:  # noqa: BLE001  (the run is done and kept; its figures are a copy)
            log.warning(f"the run's report for MLflow was not made: {type(exc).__name__}: {exc}")
            return
        tracking.Tracker(ids.uri).artifacts(ids.run_id, [out], under="report")

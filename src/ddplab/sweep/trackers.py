"""Where a sweep is tracked as a whole: a parent run that its points' runs hang under, started before they run
and ended (with the report attached) once they have, or stopped with the sweep.

The sweep-level side of the run-level sinks (metrics/sinks.py): a tracker is a class keeping SweepTracker,
here or in a module of its own, and one line in TRACKERS: a function of (sweep, folder) that returns one, or
None where it is not asked for. MLflow's is tracking.SweepTracking (each point's run reads the parent's ids
from the sweep folder: tracking.PointLink, through sweep/point.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from ddplab import tracking
from ddplab.sweepdir.folder import SweepFolder
from ddplab.sweepdir.spec import Sweep


class SweepTracker(Protocol):
    def start(self, name: str, params: dict[str, str]) -> None:
        """The sweep's run made, or the earlier one continued (a re-run resumes the same sweep)."""

    def end(self, paths: Iterable[Path], finished: bool) -> None:
        """Every point ended: `paths` attached (the report, the manifest); finished when every point did."""

    def stopped(self, error: BaseException) -> None:
        """The sweep command ended before its points did (Ctrl-C, a refusal): a re-run continues the run."""


TrackerMaker = Callable[[Sweep, SweepFolder], "SweepTracker | None"]


def mlflow_tracker(sweep: Sweep, folder: SweepFolder) -> tracking.SweepTracking | None:
    """MLflow, when the sweep's points log there (output.mlflow, or $MLFLOW_TRACKING_URI)."""
    uri = tracking.tracking_uri(sweep.runs[0].config.output.mlflow) if sweep.runs else None
    if uri is None or not tracking.installed():
        return None
    if sweep.runs[0].config.output.mlflow is None:  # from the variable: the points read it, as an absolute path
        os.environ[tracking.URI_ENV] = uri
    return tracking.SweepTracking(uri, folder.root)


TRACKERS: tuple[TrackerMaker, ...] = (mlflow_tracker,)


class Tracked:
    """The trackers a sweep is tracked by (none, or each of TRACKERS that is asked for), told alike."""

    def __init__(self, trackers: list[SweepTracker]):
        self.trackers = trackers

    def stopped(self, error: BaseException) -> None:
        for t in self.trackers:
            t.stopped(error)

    def end(self, paths: Iterable[Path], finished: bool) -> None:
        paths = list(paths)
        for t in self.trackers:
            t.end(paths, finished)


def track(sweep: Sweep, folder: SweepFolder) -> Tracked:
    """Start each tracker the sweep asks for, with the sweep's name, profile, points, axes and settings."""
    trackers = [t for make in TRACKERS if (t := make(sweep, folder)) is not None]
    params = {
        "sweep": sweep.name,
        "profile": str(sweep.profile),
        "points": str(len(sweep.runs)),
        "axes": ", ".join(sweep.axes),
        "overrides": " ".join(sweep.overrides),
    }
    for t in trackers:
        t.start(f"sweep {sweep.name}", params)
    return Tracked(trackers)

"""A run in MLflow, from the main rank (registered in metrics/sinks.SINKS; ddplab.tracking holds the
client and its rules: where to, failing once, which run is whose).

At the start the run's MLflow run is made, or continued when the folder's mlflow.json names one in
the same store (a resume: no second run): the config flattened as params, tags saying what ran where,
config.toml as an artifact. A point of a sweep is a child of the sweep's run, with its label and axis
values as params. Every epoch: its scalar fields as metrics with the epoch as step, and what else used
the machine (metrics/contention.py) as system metrics (MLflow's `system/` names, shown in their own
tab). At the end: summary.json as an artifact (the run's figures are attached by the process that started it,
launch/tracked.py: the report sits above this layer). A run that fails or is stopped ends as FAILED or KILLED; a
resume marks it running again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddplab.config import RunConfig, flatten
from ddplab.rundir import runfiles
from ddplab.rundir.epochs import EpochRecord
from ddplab.rundir.summary import CONTENTION_KEYS
from ddplab.tracking import PARENT_TAG, PointLink, RunIds, Tracker, redacted

if TYPE_CHECKING:
    from ddplab.rundir.summary import Summary

log = logging.getLogger("ddplab")

NOT_METRICS = ("epoch", "step", "schema")


class MlflowSink:
    """A metrics sink (metrics/sinks.MetricSink); not a NullSink, which lives in the module that registers it."""

    def __init__(self, config: RunConfig, run_dir: Path, uri: str, link: PointLink | None = None):
        self.tracker = Tracker(uri)
        self.run_dir = run_dir
        self.link = link
        self.finished = False
        earlier = RunIds.read(run_dir)
        self.ids = self.tracker.start(
            earlier, link.experiment_id if link else None, link.label if link else run_dir.name, self.tags()
        )
        if self.ids is None:
            return
        self.ids.write(run_dir)
        log.info(
            f"MLflow: {'continuing' if self.ids == earlier else 'logging to'} run {self.ids.run_id} at "
            f"{redacted(uri)}" + (f", a child of the sweep's run {link.parent_run_id}" if link else "")
        )
        if self.ids != earlier:  # a resumed run has its params (and a resumable setting may have changed since)
            params = {**flat(config.to_dict()), **(link.params() if link else {})}
            self.tracker.log(self.ids.run_id, params=params)
        self.tracker.artifacts(self.ids.run_id, [run_dir / runfiles.CONFIG])

    def tags(self) -> dict[str, str]:
        try:
            env = json.loads((self.run_dir / runfiles.ENV).read_text())
        except (OSError, ValueError):
            env = {}
        if not isinstance(env, dict):  # an edited env.json: tags are a copy, never worth the run
            env = {}
        tags = {
            "ddplab.version": env.get("ddplab"),
            "ddplab.torch": env.get("torch"),
            "ddplab.device": env.get("device_name") or env.get("device"),
            "ddplab.world_size": env.get("world_size"),
            "ddplab.host": env.get("host"),
            "ddplab.run_dir": str(self.run_dir.absolute()),
            "mlflow.source.git.commit": env.get("git_sha"),
            PARENT_TAG: self.link.parent_run_id if self.link else None,
        }
        return {k: str(v) for k, v in tags.items() if v is not None}

    def epoch_start(self, epoch: int, num_steps: int) -> None:
        pass

    def step(self, images: int, loss: float | None) -> None:
        pass

    def samples(self, name: str, rows: list[dict[str, Any]]) -> None:
        pass

    def epoch_end(self, record: EpochRecord) -> None:
        if self.ids is None:
            return
        self.tracker.log(self.ids.run_id, metrics=epoch_metrics(record))

    def run_end(self, summary: Summary) -> None:
        if self.ids is None:
            return
        run = summary.get("run", {})
        self.tracker.log(
            self.ids.run_id,
            tags={"ddplab.strategy": str(run.get("strategy")), "ddplab.status": str(summary.get("status"))},
        )
        self.tracker.artifacts(self.ids.run_id, [self.run_dir / runfiles.SUMMARY])
        self.tracker.end(self.ids.run_id, "FINISHED")
        self.finished = True

    def tracking(self) -> dict[str, Any]:
        return {"mlflow": self.tracker.state(self.ids)}

    def close(self, error: BaseException | None = None) -> None:
        if self.ids is not None and not self.finished:
            stopped = error is None or isinstance(error, (KeyboardInterrupt, SystemExit))
            self.tracker.end(self.ids.run_id, "KILLED" if stopped else "FAILED")
            self.finished = True


def epoch_metrics(record: EpochRecord) -> list[tuple[str, float, int]]:
    """(name, value, step) for each scalar of the epoch; the contention readings under system/."""
    return [
        (f"system/{key}" if key in CONTENTION_KEYS else key, value, record.epoch)
        for key, value in record.to_json().items()
        if key not in NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


def flat(values: dict[str, Any]) -> dict[str, str]:
    """A nested config as MLflow params: section.field -> the value as text (JSON for all but strings)."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in flatten(values).items()}

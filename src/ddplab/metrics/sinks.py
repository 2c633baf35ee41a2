"""Where metrics go: a JSONL file, TensorBoard, a progress bar, or nowhere.

Sinks are built once; non-main ranks get a `NullSink`, so the loop never asks which rank it
is on (contract 6, STYLE rule 7). Hook points, in order, are the only ones there are:
`epoch_start(epoch, num_steps)`, `step(images, loss)` after every optimizer step (`loss` is
None between progress refreshes), `epoch_end(record)`, then `samples(name, rows)` once per
kind of reading taken within the epoch ("steps": the training loss at each progress
refresh; "gpu": utilization samples); once the run finished, `tracking()` (what summary.json
records of a tracker: where it logged, and whether everything reached it) and `run_end(summary)`
after summary.json is written; last `close(error)`, with the exception that ended the run, if one
did. A sink is built when the run starts, from its config. A new sink (W&B, after MLflow's in
mlflow_sink.py) is a class here or in a module of its own, and one line in `SINKS`: a function of
(config, run folder, earlier epochs) that returns it, or None when the run does not ask for it.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ddplab import tracking
from ddplab.io import borders, files
from ddplab.rundir import runfiles
from ddplab.rundir.epochs import EpochRecord

if TYPE_CHECKING:
    from ddplab.config import RunConfig
    from ddplab.rundir.summary import Summary

log = logging.getLogger("ddplab")


class MetricSink(Protocol):
    def epoch_start(self, epoch: int, num_steps: int) -> None: ...
    def step(self, images: int, loss: float | None) -> None: ...
    def epoch_end(self, record: EpochRecord) -> None: ...
    def samples(self, name: str, rows: list[dict[str, Any]]) -> None: ...
    def tracking(self) -> dict[str, Any]: ...
    def run_end(self, summary: Summary) -> None: ...
    def close(self, error: BaseException | None = None) -> None: ...


class NullSink:
    def epoch_start(self, epoch: int, num_steps: int) -> None:
        pass

    def step(self, images: int, loss: float | None) -> None:
        pass

    def epoch_end(self, record: EpochRecord) -> None:
        pass

    def samples(self, name: str, rows: list[dict[str, Any]]) -> None:
        pass

    def tracking(self) -> dict[str, Any]:
        return {}

    def run_end(self, summary: Summary) -> None:
        pass

    def close(self, error: BaseException | None = None) -> None:
        pass


class JsonlSink(NullSink):
    """One JSON object per epoch, flushed at once so a crash loses nothing already done."""

    def __init__(self, path: Path, history: list[EpochRecord] | None = None):
        self.path = path
        # Rewrite from the checkpoint's history: epochs after the checkpoint never happened.
        files.write_text(path, "".join(files.dumps(record.to_json()) + "\n" for record in history or []))

    def epoch_end(self, record: EpochRecord) -> None:
        files.append_line(self.path, files.dumps(record.to_json()))


class SamplesSink(NullSink):
    """Readings taken within epochs, one JSON line each, in RUN/<name>.jsonl (steps.jsonl, gpu.jsonl).

    Each row carries its epoch; on resume, rows of epochs after the checkpoint are dropped,
    as metrics.jsonl drops their records.
    """

    NAMES = ("steps", "gpu")

    def __init__(self, run_dir: Path, keep_through_epoch: int = 0):
        self.run_dir = run_dir
        for name in self.NAMES:
            path = run_dir / f"{name}.jsonl"
            if path.exists():
                kept = [line for line in path.read_text().splitlines() if _epoch_of(line) <= keep_through_epoch]
                files.write_text(path, "".join(line + "\n" for line in kept))

    def samples(self, name: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            files.append_line(self.run_dir / f"{name}.jsonl", "\n".join(files.dumps(row) for row in rows))


def _epoch_of(line: str) -> float:
    try:
        epoch = json.loads(line)["epoch"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a torn line from a crash: dropped
    # An edited one (an epoch that is not a number): dropped too, never a TypeError in a resume.
    return epoch if borders.number(0).accepts(epoch) else math.inf


class LogSink(NullSink):
    """One log line per epoch, so a run without a terminal still shows where it is."""

    def __init__(self, epochs: int):
        self.epochs = epochs

    def epoch_end(self, record: EpochRecord) -> None:
        log.info(
            "epoch %d/%d: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.1f s, %.0f img/s, lr %.3g",
            record.epoch,
            self.epochs,
            record.train_loss,
            100 * record.train_acc,
            record.test_loss,
            100 * record.test_acc,
            record.epoch_s,
            record.images_per_s,
            record.lr,
        )


class TensorBoardSink(NullSink):
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def epoch_end(self, record: EpochRecord) -> None:
        epoch = record.epoch
        for key, value in record.to_json().items():
            if key not in ("epoch", "schema") and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(
                    key.replace("_", "/", 1) if key.startswith(("train_", "test_")) else key, value, epoch
                )
        self.writer.flush()

    def close(self, error: BaseException | None = None) -> None:
        self.writer.close()


def tensorboard_sink(log_dir: Path) -> MetricSink:
    """TensorBoard events when the optional package is there, else nothing (and say so once)."""
    try:
        str(log_dir).encode("utf-8")
    except UnicodeEncodeError:  # TensorBoard's writer encodes its path as UTF-8, strictly: a name of other bytes fails
        log.warning(
            f"no TensorBoard events: its writer cannot take the folder name {str(log_dir)!r} (bytes that are not "
            "UTF-8); everything else of the run is written"
        )
        return NullSink()
    try:
        return TensorBoardSink(log_dir)
    except ImportError:
        log.info("tensorboard is not installed: no event files (pip install 'ddplab[tensorboard]')")
        return NullSink()


class ProgressBar(NullSink):
    """A tqdm bar per epoch with live loss and throughput; silent when not on a terminal."""

    def __init__(self, epochs: int, enabled: bool | None = None):
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self.epochs = epochs
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None
        self.images = 0

    def epoch_start(self, epoch: int, num_steps: int) -> None:
        if self.enabled:
            self.bar = self._tqdm(
                total=num_steps, desc=f"epoch {epoch}/{self.epochs}", unit="step", leave=False, dynamic_ncols=True
            )
            self.images = 0

    def step(self, images: int, loss: float | None) -> None:
        if self.bar is None:
            return
        self.images += images
        self.bar.update(1)
        if loss is not None:
            elapsed = self.bar.format_dict.get("elapsed") or 0.0
            rate = self.images / elapsed if elapsed > 0 else math.nan
            self.bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{rate:,.0f}")  # redraws: at most ~50 per epoch

    def epoch_end(self, record: EpochRecord) -> None:
        self.close()

    def close(self, error: BaseException | None = None) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class SinkGroup(NullSink):
    def __init__(self, sinks: list[MetricSink]):
        self.sinks = sinks

    def epoch_start(self, epoch: int, num_steps: int) -> None:
        for s in self.sinks:
            s.epoch_start(epoch, num_steps)

    def step(self, images: int, loss: float | None) -> None:
        for s in self.sinks:
            s.step(images, loss)

    def epoch_end(self, record: EpochRecord) -> None:
        for s in self.sinks:
            s.epoch_end(record)

    def samples(self, name: str, rows: list[dict[str, Any]]) -> None:
        for s in self.sinks:
            s.samples(name, rows)

    def tracking(self) -> dict[str, Any]:
        return {name: state for s in self.sinks for name, state in s.tracking().items()}

    def run_end(self, summary: Summary) -> None:
        for s in self.sinks:
            s.run_end(summary)

    def close(self, error: BaseException | None = None) -> None:
        for s in self.sinks:
            s.close(error)


SinkMaker = Callable[["RunConfig", Path, list[EpochRecord]], MetricSink | None]
# The main rank's sinks, in order (the bar closes before the epoch's log line is written, so the two never interleave).
SINKS: tuple[SinkMaker, ...] = (
    lambda config, run_dir, history: JsonlSink(run_dir / runfiles.METRICS, history),
    lambda config, run_dir, history: SamplesSink(run_dir, keep_through_epoch=len(history)),
    lambda config, run_dir, history: ProgressBar(
        config.train.epochs, enabled=None if config.output.progress else False
    ),
    lambda config, run_dir, history: LogSink(config.train.epochs),
    lambda config, run_dir, history: (
        tensorboard_sink(run_dir / runfiles.TENSORBOARD) if config.output.tensorboard else None
    ),
    lambda config, run_dir, history: mlflow_sink(config, run_dir),
)


def mlflow_sink(config: RunConfig, run_dir: Path) -> MetricSink | None:
    """The run in MLflow when it asks for it (--output.mlflow, $MLFLOW_TRACKING_URI) and MLflow is there."""
    uri = tracking.tracking_uri(config.output.mlflow)
    if uri is None or not tracking.installed():  # without MLflow: refused or warned about before spawning
        return None
    from ddplab.metrics.mlflow_sink import MlflowSink

    link = tracking.PointLink.from_env()
    return MlflowSink(config, run_dir, uri, link if link is not None and link.uri == uri else None)


def run_sinks(config: RunConfig, run_dir: Path, history: list[EpochRecord]) -> SinkGroup:
    """Every sink the run asks for (the main rank's: the others get a NullSink)."""
    return SinkGroup([sink for make in SINKS if (sink := make(config, run_dir, history)) is not None])

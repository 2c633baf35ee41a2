"""A sweep run from Python as `ddplab sweep FILE` runs it: the file's points through an executor into a sweep
folder, then TensorBoard's HParams view, the report and the end of the sweep's MLflow parent run.

    from ddplab.sweep import run_sweep

    result = run_sweep("optimizers", out="runs/opt", overrides=["train.epochs=3"])
    result.unfinished          # [] when every point finished (the manifest says why each other did not)
    result.report              # runs/opt/report: index.html, report.md, points.csv

A second call with the same `out` resumes what did not finish, as running the command again does. The CLI
checks its options, calls this and turns unfinished points into its exit code. Above the report (it writes
one) and below the CLI; the report reads only the sweep's file formats (spec.py, folder.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddplab import tracking
from ddplab.errors import ConfigError
from ddplab.report.build import build_and_say
from ddplab.sweep import executor as executors
from ddplab.sweep import hparams, trackers
from ddplab.sweep.executor import Echo, Executor
from ddplab.sweep.local import LocalExecutor, default_out
from ddplab.sweepdir.folder import Entry, Manifest, SweepFolder
from ddplab.sweepdir.spec import Sweep, load_sweep, sweep_file


def say(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class SweepResult:
    """Where a sweep ran and how it stands: the manifest as the executor left it."""

    folder: Path
    manifest: Manifest
    report: Path | None = None  # the report's folder (None: not written, or the points still in a queue)
    queued: bool = False  # handed to a queue (Slurm) and not waited for: run_sweep(..., submit=False) waits later
    hparams: Path | None = field(default=None, repr=False)  # TensorBoard's HParams view of the finished runs

    @property
    def unfinished(self) -> list[Entry]:
        return [] if self.queued else self.manifest.unfinished()


def executor_named(name: str, report: bool = True) -> Executor:
    """An executor by name with its defaults (the local one timing the link for the report, and estimating)."""
    if name == LocalExecutor.name:
        return LocalExecutor(measure_link=report, estimate=True)
    chosen = executors.named(name)
    try:
        return chosen()  # an executor whose options all have defaults
    except TypeError as exc:
        raise ConfigError(f"the {name} executor needs options: pass one built with them ({exc})") from None


def load(
    sweep: str | Path,
    runner: Executor,
    *,
    out: str | Path | None = None,
    profile: str | None = None,
    overrides: Sequence[str] = (),
    mlflow: str | None = None,
    echo: Echo = say,
) -> tuple[Sweep, SweepFolder]:
    """The sweep's points for `runner` (where they run picks the default profile: under Slurm, the nodes its tasks
    ask for, not this login node) and its folder; every setting checked, nothing written."""
    on_gpus = runner.runs_on_gpus()
    tracking.check_available(mlflow)
    settings = [*overrides, *([f"output.mlflow={tracking.absolute(mlflow)}"] if mlflow else [])]
    loaded = load_sweep(sweep_file(str(sweep)), profile=profile, overrides=settings, on_gpus=on_gpus)
    if on_gpus is not None and profile is None and loaded.profile is not None:
        echo(
            f"sweep {loaded.name}: profile {loaded.profile}, as its points ask {runner.name} for "
            + ("GPUs" if on_gpus else f"no GPU (its --{runner.name}.* options)")
            + "; --profile picks another"
        )
    return loaded, SweepFolder(Path(out) if out is not None else default_out(loaded))


def run_sweep(
    sweep: str | Path,
    *,
    out: str | Path | None = None,
    profile: str | None = None,
    overrides: Sequence[str] = (),
    executor: Executor | str = LocalExecutor.name,
    mlflow: str | None = None,
    report: bool = True,
    wait: bool = True,
    submit: bool = True,
    echo: Echo = say,
) -> SweepResult:
    """Run `sweep` (a sweep file, or a bundled sweep's name) and report it.

    `out`: the sweep folder (default runs/<name>); `profile`: a [profiles.NAME] of the file (default: gpu where
    the points run on CUDA, else cpu); `overrides`: SECTION.FIELD=VALUE settings for every point; `executor`:
    where the points run (an executor, or a name: local, slurm, ray); `mlflow`: a tracking URI (the sweep a
    parent run, each point a child); `wait`: with an executor that queues the points (Slurm), wait for them and
    report; `submit=False`: submit nothing, only wait for what an earlier call queued in `out`."""
    runner = executor_named(executor, report) if isinstance(executor, str) else executors.check_executor(executor)
    loaded, folder = load(sweep, runner, out=out, profile=profile, overrides=overrides, mlflow=mlflow, echo=echo)
    folder.refuse_run_folder()  # before the sweep's MLflow file is written into it
    tracked = trackers.track(loaded, folder)
    try:
        if not submit:
            manifest = runner.wait(folder, echo)
        else:
            manifest = runner.submit(loaded, folder, echo)
            if runner.waits:
                if not wait:
                    return SweepResult(folder.root, manifest, queued=True)
                manifest = runner.wait(folder, echo)
    except BaseException as exc:
        tracked.stopped(exc)
        raise
    return after_the_runs(loaded, folder, manifest, tracked, report, echo)


def after_the_runs(
    sweep: Sweep,
    folder: SweepFolder,
    manifest: Manifest,
    tracked: trackers.Tracked,
    report: bool,
    echo: Echo,
) -> SweepResult:
    """The finished runs in TensorBoard's HParams view, the report, the sweep trackers' end (sweep/trackers.py)."""
    try:
        board = hparams.write(folder, manifest)
    except (OSError, TypeError, ValueError) as exc:  # an optional view: it never keeps the report from being made
        board = None
        echo(f"warning: the TensorBoard HParams view was not written: {exc}")
    if board is not None:
        echo(f"TensorBoard HParams view of the finished runs: tensorboard --logdir {shlex.quote(str(board))}")
    report_dir = folder.root / "report"
    if report:
        title = f"ddplab sweep {sweep.name}: {sweep.description}" if sweep.description else None
        build_and_say(report_dir, [folder.root], title=title, echo=echo)
    skipped = len(manifest.skipped())
    if skipped:
        echo(f"{skipped} of {len(manifest.runs)} runs not run on this machine (the report lists them as not measured)")
    tracked.end([report_dir, folder.manifest_path], finished=not manifest.unfinished())
    return SweepResult(folder.root, manifest, report_dir if report else None, hparams=board)

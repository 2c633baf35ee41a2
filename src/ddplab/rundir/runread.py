"""A run folder read back: its config, summary, epochs, readings and machine, as one `Run`.

The one reader of a run folder for whatever looks at finished runs (the report, compare, the
planner); `finished_run` is the one rule for a command that needs a finished one. Reading never
stops at a run that did not finish: it comes back with its status and what it left. Torch-free.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddplab.config import flatten
from ddplab.errors import ConfigError, DataError
from ddplab.io.borders import COUNT, TABLE, TEXT, kept
from ddplab.rundir import runfiles
from ddplab.rundir.epochs import EpochRecord, read_epochs
from ddplab.rundir.runfiles import read_json
from ddplab.rundir.summary import Summary, read_summary

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FINISHED = ("finished", "stopped_early")  # summary.json statuses of a run that ran to its end
# What the report shows of env.json (engine/makedir.environment writes it): a field of another kind is left
# out and said, the rest of the run drawn.
ENV = {"device_name": TEXT, "torch": TEXT, "cpus": COUNT, "network": TABLE | None}


@dataclass
class SweepShown:
    """A sweep as its manifest describes it: the report makes one section per entry of `sections`."""

    dir: Path
    name: str
    description: str = ""
    axes: list[str] = field(default_factory=list)
    sections: list[dict[str, Any]] = field(default_factory=list)  # version 2; [] means one over every run


@dataclass
class Run:
    """One run folder as read from disk; `summary` is None unless it finished."""

    dir: Path
    name: str
    status: str  # finished | stopped_early | unfinished | failed | pending | running
    config: dict[str, Any] = field(default_factory=dict)  # flattened: {"train.batch_size": 32, ...}
    summary: Summary | None = None
    history: list[EpochRecord] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    point: dict[str, Any] = field(default_factory=dict)  # sweep axis values, from the manifest
    axes: list[str] = field(default_factory=list)  # the manifest's axes; empty outside sweeps
    error: str | None = None
    sweep: SweepShown | None = None  # the sweep it belongs to; None for a run given on its own
    env: dict[str, Any] = field(default_factory=dict)  # env.json: versions, device name, host
    skipped: list[str] = field(default_factory=list)  # what of its files the report could not use, said in its findings

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def seed(self) -> Any:
        return self.config.get("train.seed", self.summary["run"].get("seed") if self.summary else None)


def is_run_dir(path: Path) -> bool:
    """A folder ddplab trained into: finished, or started (config.toml and env.json written)."""
    return any((path / f).is_file() for f in (runfiles.SUMMARY, runfiles.METRICS)) or all(
        (path / f).is_file() for f in (runfiles.CONFIG, runfiles.ENV)
    )


def readable_run(run_dir: Path, status: str | None = None) -> Run:
    """`read_run` for a report over many runs: a run whose files cannot be read (truncated, edited)
    comes back "unreadable", with the reason, so the report draws the others and lists it."""
    try:
        return read_run(run_dir, status)
    except DataError as exc:
        return Run(
            dir=run_dir, name=displayable(run_dir.name), status="unreadable", config={}, error=displayable(str(exc))
        )


def read_run(run_dir: Path, status: str | None = None) -> Run:
    """A run with its records; one without summary.json comes back unfinished, with what it left."""
    run = Run(dir=run_dir, name=displayable(run_dir.name), status=status or "unfinished", config=read_config(run_dir))
    if not (run_dir / runfiles.SUMMARY).is_file():
        run.error = unfinished_reason(run_dir)
        return run
    run.summary, run.history = read_summary(run_dir), read_epochs(run_dir / runfiles.METRICS, run_dir)
    run.status = str(run.summary.get("status", "finished"))
    run.steps = side_records(run_dir / runfiles.STEPS, run.skipped)
    run.gpu = side_records(run_dir / runfiles.GPU, run.skipped)
    if (run_dir / runfiles.ENV).is_file():
        try:  # a side record too: not JSON, not UTF-8, or unreadable, it is left out and said, the run drawn
            env = read_json(run_dir / runfiles.ENV, run_dir)
        except (ConfigError, DataError) as exc:
            run.skipped.append(f"{exc}: left out")
            env = {}
        run.env, skipped = kept(env, ENV, str(run_dir / runfiles.ENV))
        run.skipped += skipped
    return run


def unfinished_reason(run_dir: Path) -> str:
    """What a run without summary.json left: epochs recorded and the last error in its log."""
    try:
        epochs = len(read_epochs(run_dir / runfiles.METRICS, run_dir, growing=True))
    except (ConfigError, DataError):
        epochs = 0
    reason = f"no summary.json: stopped or still running after {epochs} epoch{'s' * (epochs != 1)}"
    try:
        lines = (run_dir / runfiles.LOG).read_text(errors="replace").splitlines()
    except OSError:
        return reason
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return f"{reason}; log: {errors[-1][:300]}" if errors else reason


def side_records(path: Path, skipped: list[str]) -> list[dict[str, Any]]:
    """The records of a per-step or per-sample file (steps.jsonl, gpu.jsonl), none where it is absent. They only
    add to what a report shows, so each line stands alone: one that is not UTF-8, not JSON, not an object or
    holds values that are not numbers (or lists of them, or null) is left out and counted in `skipped`; the
    run is still drawn (docs/contracts.md, "Borders"). An unreadable file is left out whole, said the same way."""

    def number(v: Any) -> bool:
        return (
            v is None
            or (isinstance(v, (int, float)) and not isinstance(v, bool))
            or (isinstance(v, list) and all(number(x) for x in v))
        )

    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        skipped.append(f"{path.name} left out: it cannot be read ({type(exc).__name__})")
        return []
    kept, total = [], 0
    for line in lines:
        if not line.strip():
            continue
        total += 1
        try:
            record = runfiles.json_line(line.decode())
        except ValueError:  # UnicodeDecodeError is one too
            continue
        if isinstance(record, dict) and all(number(v) for v in record.values()):
            kept.append(record)
    if len(kept) < total:
        skipped.append(
            f"{total - len(kept)} of {total} records of {path.name} left out (lines that are not UTF-8 JSON "
            "objects of numbers: truncated or edited?)"
        )
    return kept


def read_config(run_dir: Path) -> dict[str, Any]:
    """config.toml flattened to dotted names; empty when the run wrote none."""
    path = run_dir / runfiles.CONFIG
    try:
        with path.open("rb") as f:
            return flatten(tomllib.load(f))
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"{path} is not valid TOML: {str(exc).splitlines()[0]}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} cannot be read ({type(exc).__name__})") from None


def displayable(text: str) -> str:
    """A name from the file system as text that can be shown and written: bytes that are not UTF-8 (Python keeps
    them as lone surrogates) become U+FFFD, which pages, CSVs, JSON and plot labels all take."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def finished_run(run_dir: str | Path) -> Run:
    """A finished run, for a command that needs one (compare, plan); anything else is one line naming the folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a folder: give run folders (each holding summary.json and metrics.jsonl)")
    if not is_run_dir(run_dir):
        raise ConfigError(f"{run_dir} is not a finished ddplab run (no summary.json): give the folders runs wrote")
    run = read_run(run_dir)
    if not run.finished:
        raise ConfigError(f"{run_dir} is not a finished ddplab run ({run.error})")
    return run

"""The seam between a sweep and where its points run: what every executor does, and the list of them.

An executor takes a prepared sweep folder (folder.py) and runs its unfinished points, each through
point.py, recording each outcome in the manifest: `local` runs them here, a few at once on their
own cores and GPUs (local.py); `slurm` submits them as job arrays and returns (slurm.py). It says
where the points will run (which picks a sweep's default profile), brings the manifest's entries
up to date for --status, and waits for points it only submitted (--wait). Its options are its own
(`--slurm.partition`); `ddplab sweep` offers each registered executor's. A new executor is a module
with a class that keeps this protocol, and one line in `registered`. Torch-free.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import ClassVar, Protocol

from ddplab.errors import ConfigError
from ddplab.io.borders import shown
from ddplab.rundir import runfiles
from ddplab.rundir.epochs import read_epochs
from ddplab.sweepdir.folder import Manifest, Status, SweepFolder
from ddplab.sweepdir.spec import Sweep

Echo = Callable[[str], object]


class Executor(Protocol):
    name: ClassVar[str]  # --executor NAME, and the manifest's "executor"
    waits: ClassVar[bool]  # submit returns before the points end: --wait waits for them
    summary: ClassVar[str]  # where it runs the points, in `ddplab sweep --help`'s words

    @classmethod
    def add_options(cls, parser: argparse.ArgumentParser) -> None:
        """Its own options of `ddplab sweep`, each named --NAME.OPTION."""

    @classmethod
    def options_given(cls, args: argparse.Namespace) -> list[str]:
        """Its own options the command line gives (refused with another executor)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Executor:
        """The executor for `ddplab sweep`'s arguments; an option it cannot honour is a ConfigError."""

    @classmethod
    def reading(cls) -> Executor:
        """The executor that reads a folder it ran (--status, --wait): no options needed."""

    def runs_on_gpus(self) -> bool | None:
        """Whether the points run where there are GPUs (None: this machine's CUDA says): the default profile."""

    def dry_run(self, sweep: Sweep, folder: SweepFolder) -> str:
        """What submitting would do, writing nothing."""

    def submit(self, sweep: Sweep, folder: SweepFolder, echo: Echo) -> Manifest:
        """Run, or hand over, every unfinished point (the folder made ready by `folder.prepare(..., executor=name)`,
        which names this executor in the manifest); the manifest as it stands when this returns."""

    def refresh(self, folder: SweepFolder, manifest: Manifest) -> list[str]:
        """Each entry's status as it stands now (not written); notes worth a line in --status."""

    def wait(self, folder: SweepFolder, echo: Echo) -> Manifest:
        """Wait until none of the points it handed over is queued or running; the manifest, written."""


def check_executor(value: object) -> Executor:
    """run_sweep's `executor` when it is not a name: an object that keeps the Executor protocol."""
    missing = [m for m in ("name", "waits", "runs_on_gpus", "submit", "wait") if not hasattr(value, m)]
    if missing:
        raise ConfigError(
            f"executor={shown(value)} is neither an executor's name ({', '.join(registered())}) nor an executor "
            f"(it has no {', '.join(missing)}): pass a name, or one built with its options, e.g. "
            "ddplab.sweep.LocalExecutor(parallel=2)"
        )
    return value  # type: ignore[return-value]


def registered() -> dict[str, type[Executor]]:
    """Every executor, by name; the first is the default."""
    from ddplab.sweep.local import LocalExecutor
    from ddplab.sweep.ray_executor import RayExecutor
    from ddplab.sweep.slurm import SlurmExecutor

    return {e.name: e for e in (LocalExecutor, SlurmExecutor, RayExecutor)}


def named(name: str) -> type[Executor]:
    found = registered()
    if name not in found:
        raise ConfigError(f"no executor {name!r} (this ddplab has {', '.join(found)}): written by a newer ddplab?")
    return found[name]


def from_args(args: argparse.Namespace) -> Executor:
    """The executor `ddplab sweep` asks for; another executor's option is one line."""
    chosen = named(args.executor)
    for other in registered().values():
        if other is not chosen and (given := other.options_given(args)):
            raise ConfigError(f"{given[0]} is for --executor {other.name}")
    return chosen.from_args(args)


def status(folder: SweepFolder) -> list[str]:
    """One line per point, what it is doing, from its executor and its run folder (the manifest is only read:
    the executors write it), after a line of counts and the executor's notes."""
    manifest = folder.load()
    notes = named(manifest.executor).reading().refresh(folder, manifest)
    lines = []
    for entry in manifest.runs:
        epochs = len(read_epochs(folder.root / entry.dir / runfiles.METRICS, growing=True))
        where = f" (job {entry.job})" if entry.job else ""
        error = f": {entry.error}" if entry.error and entry.status is not Status.FINISHED else ""
        lines.append(f"  {entry.name:<40} {entry.status.value:<12} {epochs} epoch(s) recorded{where}{error}")
    counts: dict[str, int] = {}
    for entry in manifest.runs:
        counts[entry.status.value] = counts.get(entry.status.value, 0) + 1
    return [f"sweep {manifest.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()), *notes, *lines]

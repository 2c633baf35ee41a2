"""One point of a sweep, as every executor runs it: the local slots and a Slurm array task alike.

A point is `ddplab train` (or torchrun) on its config in the sweep folder, its own process tree,
its output appended to its log. The executor skips one that finished (`Point.finished`: `ddplab
train` would refuse its folder); one with a checkpoint resumes; its exit code and run folder say
what became of it (`folder.ended_as`). An executor decides only where and when a point runs (its
cores and GPUs, an allocation's srun) and records the outcome.
Torch-free.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddplab import tracking
from ddplab.config import RunConfig
from ddplab.launch.process import STOP_GRACE_S, Child, Finished, ddplab_command, supervise
from ddplab.rundir import runfiles
from ddplab.sweepdir.folder import Status, SweepFolder, ended_as
from ddplab.sweepdir.spec import point_text

IMPORTS = ("ddplab.cli", "ddplab.launch.elastic", "ddplab.engine.worker")  # what `ddplab train` imports: warm, once


@dataclass(frozen=True)
class Outcome:
    """What became of a point that ran: its status, exit code and error line, and how long it took."""

    status: Status
    exit_code: int | None
    error: str | None
    wall_s: float | None  # None: it never ran (an executor cancelled it before it started)


@dataclass(frozen=True)
class Node:
    """One node's part of a point across nodes started by an executor (not by srun, whose variables say it): the
    rendezvous every node is given, this node's rank, and whether the run resumes, decided once for all nodes."""

    rank: int
    endpoint: str  # host:port of the rendezvous store, on the first node
    resume: bool

    def arguments(self) -> list[str]:
        return ["--node-rank", str(self.rank), "--rdzv-endpoint", self.endpoint]


@dataclass(frozen=True)
class Point:
    folder: SweepFolder
    name: str
    config: RunConfig
    launch: str = "ddplab"  # or "torchrun": the launcher starts the workers

    @property
    def run_dir(self) -> Path:
        return self.folder.run_dir(self.name)

    @property
    def config_file(self) -> Path:
        return self.folder.config_file(self.name)

    @property
    def log(self) -> Path:
        return self.folder.log(self.name)

    def finished(self) -> bool:
        return runfiles.run_state(self.run_dir) == "finished"

    def resumes(self) -> bool:
        """Whether it continues from a checkpoint (an interrupted, preempted or timed-out attempt's)."""
        return runfiles.checkpoint_path(self.run_dir).is_file()

    def command(self, node: Node | None = None) -> list[str]:
        """Its `ddplab train`; `node`: one node's of a point across nodes, every node given the same resume."""
        resume = self.resumes() if node is None else node.resume
        args = [
            "train",
            "--config",
            str(self.config_file),
            "--out",
            str(self.run_dir),
            "--output.progress",
            "false",
            *(["--resume"] if resume else []),
            *([] if node is None else node.arguments()),
        ]
        if self.launch == "torchrun":
            return [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(self.config.dist.nproc),
                "-m",
                "ddplab",
                *args,
            ]
        return ddplab_command(*args)

    def start(
        self,
        env: Mapping[str, str],
        *,
        cpus: Sequence[int] = (),
        timeout_s: float | None = None,
        timeout_from: str = "",
    ) -> Child:
        """Started as its own process tree, polled by the caller (a local executor runs several at once)."""
        return Child(
            self.command(),
            self.log,
            timeout_s=timeout_s,
            env=self.env(env),
            cpus=cpus,
            timeout_from=timeout_from,
            imports=IMPORTS,
        )

    def run(
        self,
        env: Mapping[str, str],
        *,
        wrap: Sequence[str] = (),
        stop_signal: int = signal.SIGINT,
        grace_s: float = STOP_GRACE_S,
        warm: bool = False,
        node: Node | None = None,
    ) -> Finished:
        """Run to its end here (a remote task): `wrap` goes before the command (srun for several workers); a
        KeyboardInterrupt (SIGTERM made one) stops it with `stop_signal`, resumable. `warm`: forked from this
        process's warm server (a process that runs many points, as a Ray worker does); else cold, as one command
        a Slurm task starts. `node`: this node's part of a point across nodes."""
        return supervise(
            [*wrap, *self.command(node)],
            self.log,
            env=self.env(env),
            stop_signal=stop_signal,
            grace_s=grace_s,
            warm_start=warm,
            imports=IMPORTS,
        )

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env`, and when the sweep is tracked in MLflow, which run is the point's parent and its axis values."""
        parent = tracking.RunIds.read(self.folder.root)
        if parent is None:
            return dict(env)
        entry = next((e for e in self.folder.load().runs if e.name == self.name), None)
        axes = {axis: point_text(value) for axis, value in (entry.point if entry else {}).items()}
        return {**env, **tracking.PointLink.under(parent, self.name, axes).env()}

    def outcome(self, exit_code: int | None, error: str | None, wall_s: float) -> Outcome:
        status = ended_as(exit_code, (self.run_dir / runfiles.SUMMARY).is_file())
        if exit_code == 0 and status is not Status.FINISHED:
            error = "the run exited 0 but left no summary.json"
        return Outcome(status, exit_code, error, round(wall_s, 1))

    def ended(self, done: Finished) -> Outcome:
        return self.outcome(done.code, done.error, done.wall_s)

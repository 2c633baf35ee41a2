"""Prepare a run once, at the root of its process tree: the one step between a validated config and
any process that trains.

`prepared(config)` decides everything a run needs to know before it starts, once: where this
process sits (topology.py), the shape the launcher made, the folder's name, the machine's
checks, whether this process holds the folder, and what a resumed folder holds (config.toml
and last.pt, read once each). The CLI, the Python API and torchrun's or srun's workers go
through it; the workers of ddplab's own launcher take their launcher's plan (`as_worker`)
and check nothing again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ddplab.config import RunConfig
from ddplab.errors import ConfigError
from ddplab.io import files
from ddplab.machine import check_environment
from ddplab.rundir import runfiles
from ddplab.rundir.runfolder import Resume, check_run_dir, refuse_by_state
from ddplab.rundir.runlock import run_lock, should_hold
from ddplab.topology import ProcessPlace, as_launched, group_attempt, placement


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig  # as it runs: the launcher's shape, the folder named, resume set after a restart
    place: ProcessPlace | None  # this process's place in a launcher's group; None: the root of the tree
    holds_lock: bool  # this process holds the run folder for the whole run
    resume: Resume | None  # what the folder held when this run continues it (None: a new run)

    @property
    def run_dir(self) -> Path:
        assert self.config.output.out is not None  # named by with_out_folder before any plan
        return Path(self.config.output.out)

    def nothing_to_do(self) -> str | None:
        """Why this run trains nothing (a resume of a run already trained that far), or None."""
        return self.resume.nothing_left(self.run_dir, self.config.train.epochs) if self.resume else None

    def launches_workers(self) -> bool:
        """Whether this process starts the run's workers (ddplab's own launcher) instead of training."""
        c = self.config
        return self.place is None and c.dist.strategy == "ddp" and c.world_size() > 1 and self.nothing_to_do() is None

    def for_workers(self) -> RunPlan:
        """What the launcher hands its workers: the facts, not the checkpoint it read for them."""
        resume = self.resume.without_checkpoint() if self.resume else None
        return dataclasses.replace(self, resume=resume)


@contextlib.contextmanager
def prepared(config: RunConfig, *, saved: RunConfig | None = None) -> Iterator[RunPlan]:
    """The plan of a run started here (the CLI, a Python caller, a torchrun or srun worker), its folder
    held for as long as the block runs by the process that holds it. `saved`: the resumed folder's
    config.toml as the caller read it (the CLI's `--resume` starts from it), so it is not read twice."""
    where = placement(config.dist.strategy)  # refuses a worker asked for one process, before anything else
    if where.ignored:
        print(f"ddplab: note: {where.ignored}", file=sys.stderr, flush=True)
    place = where.place
    if place is None and config.dist.nnodes > 1 and config.dist.rdzv_endpoint is None:
        # Only ddplab's own launcher needs it: under srun or torchrun the launcher says where the group meets.
        raise ConfigError(
            "dist.rdzv_endpoint=None is not valid: a multi-node run started by ddplab's launcher needs "
            "host:port of a node every node can reach (under srun or torchrun the launcher gives it)"
        )
    if place is not None and config.dist.elastic():
        raise ConfigError(
            f"dist.min_nodes={config.dist.min_nodes} is ddplab's launcher's (--nnodes MIN:MAX): this process was "
            "started by another launcher; under torchrun give it --nnodes MIN:MAX, and an srun step's tasks are fixed"
        )
    if place is not None:
        config = resumed_after_restart(as_launched(config, place))
    config = config.with_out_folder()
    check_environment(config)
    holds = should_hold(place.rank if place else None, launching_nodes=config.dist.nnodes)
    with _folder_checked(config, place, holds, saved) as plan:
        yield plan


@contextlib.contextmanager
def as_worker(plan: RunPlan) -> Iterator[RunPlan]:
    """The plan of one worker that ddplab's launcher started from `plan`.

    Nothing is checked again, with two exceptions that read the folder anew: the worker
    that takes the folder's lock (rank 0 of a multi-node run, whose launchers hold nothing)
    checks it now that it holds it, and a restarted group (`--max-restarts`) continues from
    the checkpoint the failed one left.
    """
    place = placement(plan.config.dist.strategy).place
    config = resumed_after_restart(plan.config)
    holds = should_hold(place.rank if place else None, launcher_holds=plan.holds_lock)
    if config is plan.config and not holds:
        yield dataclasses.replace(plan, place=place, holds_lock=False)
        return
    with _folder_checked(config, place, holds) as worker_plan:
        yield worker_plan


@contextlib.contextmanager
def _folder_checked(
    config: RunConfig, place: ProcessPlace | None, holds: bool, saved: RunConfig | None = None
) -> Iterator[RunPlan]:
    """Check the folder (every process, before any group forms: a refusal stops all ranks at once);
    the holder checks it under the lock, after a first look that needs no lock."""
    if not holds:
        yield RunPlan(config, place, False, check_run_dir(config, saved))
        return
    refuse_by_state(config)  # a refused run leaves no lock file behind in a folder that is not its own
    assert config.output.out is not None
    with run_lock(Path(config.output.out)):
        out = Path(config.output.out)
        files.remove_dead_writers_files(out, out / runfiles.CHECKPOINTS)  # a writer killed before its rename
        yield RunPlan(config, place, True, check_run_dir(config, saved))


def resumed_after_restart(config: RunConfig) -> RunConfig:
    """A restarted worker group (elastic agent or torchrun) continues from the last checkpoint, in the folder
    the group's first start named (without --out, after the launcher's job: the same at every restart)."""
    if group_attempt() == 0:
        return config
    config = config.with_out_folder()
    out = config.output.out
    if out is not None and runfiles.checkpoint_path(out).exists():
        return dataclasses.replace(config, output=dataclasses.replace(config.output, resume=True))
    return config

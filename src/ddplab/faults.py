"""Deliberate failures, for testing that recovery really recovers.

`DDPLAB_FAULT="kill:rank=1:epoch=2:step=3"` makes rank 1 SIGKILL itself before optimizer
step 3 of epoch 2; `raise:...` raises instead, `hang:...` sleeps forever (a stuck rank), `stall:...` sleeps forever
inside the data loader, making the step's batch (a rank stuck in its data path: a hung read; step S is the S-th batch
its loader makes in the epoch in this session, the step's where there is no accumulation nor resume), `stop:...`
stops itself
(SIGSTOP: a rank frozen by a debugger or the OS, deaf to everything but SIGKILL and SIGCONT), `slow:rank=1:ms=30`
sleeps 30 ms before each step it matches (a straggler: no step given, every step), `slowsave:epoch=2:ms=4000` holds the
writing of that epoch's last.pt for 4 s between its temporary file and the rename (a fault during a checkpoint
write). The fault fires while the elastic restart
count is below `attempts` (default 1: the first attempt only, so a restarted group runs
clean). Unset, this costs a call and a comparison per step.

`DDPLAB_RECORD_SAMPLES=FOLDER` (a test hook, beside the faults): each rank appends the dataset indices each of its
optimizer steps trained to FOLDER/rank-R.round-A.jsonl, so a test can check that every sample was trained once
an epoch across restarts and membership changes. It reads indices back to the host every step: never for speed.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator

from ddplab.errors import ConfigError, TrainingError
from ddplab.topology import group_attempt

ENV = "DDPLAB_FAULT"


ACTIONS = ("kill", "raise", "hang", "stall", "stop", "slow", "slowsave")
LEAST = {"rank": 0, "epoch": 1, "step": 1, "attempts": 1, "ms": 0}  # each field's smallest meaningful value
GRAMMAR = (
    "kill|raise|hang|stall|stop[:rank=R][:epoch=E][:step=S][:attempts=N], slow:ms=M[...] or "
    "slowsave:ms=M[:epoch=E] (R >= 0, E, S, N >= 1, M >= 0)"
)


def parse(spec: str) -> tuple[str, dict[str, int]]:
    """`spec` as (action, {field: value}); a malformed one is a ConfigError naming the variable and the part
    that is wrong (a hook obeys the contract of a flag: one line, exit 2, before any worker starts)."""
    action, *fields = spec.strip().split(":")
    where: dict[str, int] = {}
    for part in fields:
        key, eq, value = part.partition("=")
        if not eq or key not in LEAST or not value.strip().lstrip("-").isdigit():
            raise ConfigError(
                f"{ENV}={spec!r}: {part!r} is not FIELD=INTEGER with a field of {', '.join(LEAST)}; expected {GRAMMAR}"
            )
        if key in where:
            raise ConfigError(f"{ENV}={spec!r}: {key} is given twice; expected {GRAMMAR}")
        where[key] = int(value)
        if where[key] < LEAST[key]:
            raise ConfigError(
                f"{ENV}={spec!r}: {key}={where[key]} would never fire (the least {key} is "
                f"{LEAST[key]}); expected {GRAMMAR}"
            )
    if (
        action not in ACTIONS
        or ("ms" in where) != (action in ("slow", "slowsave"))
        or (action == "slowsave" and ("step" in where or "rank" in where))
    ):
        raise ConfigError(f"{ENV}={spec!r}: expected {GRAMMAR}")
    return action, where


def check_env(world_size: int | None = None, epochs: int | None = None, steps: int | None = None) -> None:
    """A fault set in the environment, checked before anything starts: its grammar always, and, given the run's
    shape, a rank or an epoch the run does not have (a fault that would never fire is a test that cannot fail)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    action, where = parse(spec)
    if world_size is not None and where.get("rank", 0) >= world_size:
        raise ConfigError(
            f"{ENV}={spec!r}: rank={where['rank']} would never fire: this run has ranks 0 to {world_size - 1}"
        )
    if epochs is not None and where.get("epoch", 1) > epochs:
        raise ConfigError(
            f"{ENV}={spec!r}: epoch={where['epoch']} would never fire: "
            f"this run trains {epochs} epoch{'s' if epochs != 1 else ''}"
        )
    if steps is not None and action != "stall" and where.get("step", 1) > steps:  # stall counts batches, not steps
        raise ConfigError(
            f"{ENV}={spec!r}: step={where['step']} would never fire: this run's epochs take at most "
            f"{steps} optimizer step{'s' if steps != 1 else ''}"
        )


_UNREAD: tuple[str, dict[str, int]] = ("", {})
_FAULT: tuple[str, dict[str, int]] | None = _UNREAD  # read on first use: importing this module never fails


def current() -> tuple[str, dict[str, int]] | None:
    """This process's fault, parsed once (the CLI has refused a malformed one before anything started)."""
    global _FAULT
    if _FAULT is _UNREAD:
        _FAULT = parse(os.environ[ENV]) if os.environ.get(ENV) else None
    return _FAULT


RECORD_ENV = "DDPLAB_RECORD_SAMPLES"


def recording_samples() -> bool:
    return bool(os.environ.get(RECORD_ENV))


def record_samples(rank: int, epoch: int, step: int, indices: list[int]) -> None:
    """One optimizer step's dataset indices, appended to this rank's record for this rendezvous round."""
    import json

    folder = os.environ[RECORD_ENV]
    os.makedirs(folder, exist_ok=True)
    row = {"epoch": epoch, "step": step, "rank": rank, "round": group_attempt(), "ids": indices, "t": time.time()}
    line = json.dumps(row)
    with open(os.path.join(folder, f"rank-{rank}.round-{group_attempt()}.jsonl"), "a") as f:
        f.write(line + "\n")


def _recorded(folder: str | os.PathLike) -> Iterator[dict]:
    """Every row `record_samples` wrote to `folder`, rank by rank, round by round."""
    import json
    from pathlib import Path

    for file in sorted(Path(folder).glob("rank-*.round-*.jsonl")):
        for line in file.read_text().splitlines():
            yield json.loads(line)


def recorded_samples(folder: str | os.PathLike) -> dict[tuple[int, int, int], list[int]]:
    """What `record_samples` wrote to `folder`: (epoch, step, round) -> the indices every rank trained then."""
    steps: dict[tuple[int, int, int], list[int]] = {}
    for row in _recorded(folder):
        steps.setdefault((row["epoch"], row["step"], row["round"]), []).extend(row["ids"])
    return steps


def rounds_started(folder: str | os.PathLike) -> dict[int, float]:
    """From what `record_samples` wrote: when each rendezvous round ended its first step (time.time())."""
    first: dict[int, float] = {}
    for row in _recorded(folder):
        first[row["round"]] = min(first.get(row["round"], math.inf), row["t"])
    return first


def steps_trained_again(folder: str | os.PathLike) -> int:
    """The optimizer steps a later round trained again (its restart from a checkpoint older than the step reached):
    the work a membership change lost."""
    rounds: dict[tuple[int, int], set[int]] = {}
    for epoch, step, round_ in recorded_samples(folder):
        rounds.setdefault((epoch, step), set()).add(round_)
    return sum(len(r) - 1 for r in rounds.values())


def maybe_slow_save(epoch: int) -> None:
    """Between a checkpoint's temporary file and its rename (rank 0 writes checkpoints)."""
    fault = current()
    if fault is None or fault[0] != "slowsave":
        return
    where = fault[1]
    if group_attempt() < where.get("attempts", 1) and where.get("epoch", epoch) == epoch:
        time.sleep(where["ms"] / 1000)


def _fires(actions: tuple[str, ...], rank: int, epoch: int, step: int) -> tuple[str, dict[str, int]] | None:
    """The fault where its action is one of `actions` and it matches this rank, epoch and step in an attempt it
    fires in; None otherwise."""
    fault = current()
    if fault is None or fault[0] not in actions:
        return None
    action, where = fault
    if group_attempt() >= where.get("attempts", 1):
        return None
    here = {"rank": rank, "epoch": epoch, "step": step}
    return fault if all(here[k] == v for k, v in where.items() if k not in ("attempts", "ms")) else None


def _forever() -> None:
    while True:
        time.sleep(3600)


def maybe_stall(rank: int, epoch: int, batch: int) -> None:
    """In the data loader, before it makes the epoch's `batch`-th batch (counted from 1)."""
    if _fires(("stall",), rank, epoch, batch):
        _forever()


def maybe_inject(rank: int, epoch: int, step: int) -> None:
    """At the start of an optimizer step."""
    fault = _fires(("kill", "raise", "hang", "stop", "slow"), rank, epoch, step)
    if fault is None:
        return
    action, where = fault
    if action == "slow":
        time.sleep(where["ms"] / 1000)
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # continued: train on, as a rank that was frozen for a while does
    if action == "hang":
        _forever()
    raise TrainingError(f"injected fault ({ENV}) at epoch {epoch} step {step}")

"""Deliberate failures, for testing that recovery really recovers.

`DDPLAB_FAULT="kill:rank=1:epoch=2:step=3"` makes rank 1 SIGKILL itself before optimizer
step 3 of epoch 2; `raise:...` raises instead, `hang:...` sleeps forever (a stuck rank), `stop:...` stops itself
(SIGSTOP: a rank frozen by a debugger or the OS, deaf to everything but SIGKILL and SIGCONT), `slow:rank=1:ms=30`
sleeps 30 ms before each step it matches (a straggler: no step given, every step), `slowsave:epoch=2:ms=4000` holds the
writing of that epoch's last.pt for 4 s between its temporary file and the rename (a fault during a checkpoint
write). The fault fires while the elastic restart
count is below `attempts` (default 1: the first attempt only, so a restarted group runs
clean). Unset, this costs one comparison per step.
"""

from __future__ import annotations

import os
import signal
import time

from ddplab.errors import TrainingError

ENV = "DDPLAB_FAULT"


def parse(spec: str) -> tuple[str, dict[str, int]]:
    action, *fields = spec.split(":")
    where = {k: int(v) for k, v in (f.split("=") for f in fields)}
    if (action not in ("kill", "raise", "hang", "stop", "slow", "slowsave")
            or not set(where) <= {"rank", "epoch", "step", "attempts", "ms"}
            or ("ms" in where) != (action in ("slow", "slowsave")) or (action == "slowsave" and "step" in where)):
        raise ValueError(f"{ENV}={spec!r}: expected kill|raise|hang|stop[:rank=R][:epoch=E][:step=S][:attempts=N], "
                         "slow:ms=M[...] or slowsave:ms=M[:epoch=E]")
    return action, where


_FAULT = parse(os.environ[ENV]) if os.environ.get(ENV) else None


def maybe_slow_save(epoch: int) -> None:
    """Between a checkpoint's temporary file and its rename (rank 0 writes checkpoints)."""
    if _FAULT is None or _FAULT[0] != "slowsave":
        return
    where = _FAULT[1]
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) < where.get("attempts", 1) and where.get("epoch", epoch) == epoch:
        time.sleep(where["ms"] / 1000)


def maybe_inject(rank: int, epoch: int, step: int) -> None:
    if _FAULT is None or _FAULT[0] == "slowsave":
        return
    action, where = _FAULT
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) >= where.get("attempts", 1):
        return
    here = {"rank": rank, "epoch": epoch, "step": step}
    if all(here[k] == v for k, v in where.items() if k not in ("attempts", "ms")):
        if action == "slow":
            time.sleep(where["ms"] / 1000)
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            return  # continued: train on, as a rank that was frozen for a while does
        if action == "hang":
            while True:
                time.sleep(3600)
        raise TrainingError(f"injected fault ({ENV}) at epoch {epoch} step {step}")

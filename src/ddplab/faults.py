"""Deliberate failures, for testing that recovery really recovers.

`DDPLAB_FAULT="kill:rank=1:epoch=2:step=3"` makes rank 1 SIGKILL itself before optimizer
step 3 of epoch 2; `raise:...` raises instead. The fault fires on the first attempt only
(elastic restart count 0), so a restarted group runs clean. Unset, this costs one dict
lookup per step.
"""

from __future__ import annotations

import os
import signal

from ddplab.errors import TrainingError

ENV = "DDPLAB_FAULT"


def parse(spec: str) -> tuple[str, dict[str, int]]:
    action, *fields = spec.split(":")
    where = {k: int(v) for k, v in (f.split("=") for f in fields)}
    if action not in ("kill", "raise") or not set(where) <= {"rank", "epoch", "step"}:
        raise ValueError(f"{ENV}={spec!r}: expected kill|raise[:rank=R][:epoch=E][:step=S]")
    return action, where


_FAULT = parse(os.environ[ENV]) if os.environ.get(ENV) else None


def maybe_inject(rank: int, epoch: int, step: int) -> None:
    if _FAULT is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    action, where = _FAULT
    here = {"rank": rank, "epoch": epoch, "step": step}
    if all(here[k] == v for k, v in where.items()):
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise TrainingError(f"injected fault ({ENV}) at epoch {epoch} step {step}")

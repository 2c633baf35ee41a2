"""What tests read back: a run's records as two runs of one config must agree on them, the processes a test left,
where CIFAR-10 is."""

from __future__ import annotations

import os
from pathlib import Path

from support.settings import REPO

SHARED_CIFAR = REPO.parent / "shared" / "data" / "cifar10-jpeg"


def metrics(run_dir, *, per_rank: bool = False) -> list[dict]:
    """metrics.jsonl's epochs less what measures the machine (and, by default, each rank's lists and the worker
    count, so runs over different worker counts compare)."""
    from ddplab.rundir.epochs import read_epochs, reproducible

    return [reproducible(r, per_rank=per_rank) for r in read_epochs(Path(run_dir) / "metrics.jsonl")]


def leftover_processes(marker: str) -> list[str]:
    """Processes whose environment carries `marker` (the workers of one test run)."""
    found = []
    for env_file in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in env_file.read_bytes():
                found.append(env_file.parent.name)
        except OSError:
            pass
    return found


def cifar10_root() -> Path | None:
    """The data root holding CIFAR-10, from DDPLAB_DATA or ../shared."""
    from ddplab.data.datasets import holds_cifar10

    for cand in (os.environ.get("DDPLAB_DATA"), SHARED_CIFAR):
        if cand and holds_cifar10(cand):
            return Path(cand)
    return None

"""Logging with the rank in every line; rank 0 speaks, the others only warn (contract 6)."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

OURS = "_ddplab_run"  # set on the handlers a run adds: the ones it may close


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """A run's logging (its rank's console, its train.log) lasts the run: a caller of the Python API gets
    ddplab's logger back as it had it, and nothing logged after the run lands in that run's train.log."""
    logger = logging.getLogger("ddplab")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            if getattr(handler, OURS, False):
                handler.close()
        for handler in saved[0]:
            logger.addHandler(handler)
        logger.setLevel(saved[1])
        logger.propagate = saved[2]


def init_logging(rank: int, log_file: Path | None = None, *, debug: bool = False) -> None:
    root = logging.getLogger("ddplab")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if getattr(handler, OURS, False):  # a caller's own handler is its to close (restored() gives it back)
            handler.close()
    level = logging.DEBUG if debug else logging.INFO
    root.setLevel(level)
    root.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(level if rank == 0 else logging.WARNING)
    console.setFormatter(fmt)
    handlers: list[logging.Handler] = [console]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file))
        handlers[-1].setFormatter(fmt)
    for handler in handlers:
        setattr(handler, OURS, True)
        root.addHandler(handler)

"""Logging with the rank in every line; rank 0 speaks, the others only warn (contract 6)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def init_logging(rank: int, log_file: Path | None = None, *, debug: bool = False) -> None:
    root = logging.getLogger("ddplab")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    level = logging.DEBUG if debug else logging.INFO
    root.setLevel(level)
    root.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(level if rank == 0 else logging.WARNING)
    console.setFormatter(fmt)
    root.addHandler(console)
    if log_file is not None:
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)

"""Checkpoints written atomically and read without running code from the file.

A checkpoint holds everything needed to continue exactly (contract 5): model, optimizer,
scheduler, gradient scaler, early-stopping state, counters and the metrics so far. The
file is written to a temporary name and renamed, so a crash mid-write never leaves a
half-written file under the real name. Loading uses `weights_only=True` (contract 9).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ddplab.errors import DataError

LAST = "last.pt"
BEST = "best.pt"


def save_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load(path: Path, map_location: torch.device | str = "cpu") -> dict:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise DataError(f"checkpoint {path} does not exist") from None
    except Exception as exc:  # unpickling refused, truncated zip, ...
        raise DataError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); it is corrupt or not a ddplab checkpoint") from None

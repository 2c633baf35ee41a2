"""Checkpoints written atomically and read without running code from the file.

A checkpoint holds everything needed to continue exactly (contract 5): model, optimizer,
scheduler, gradient scaler, early-stopping state, counters and the metrics so far. The
file is written to a temporary name and renamed, so a crash mid-write never leaves a
half-written file under the real name. Loading uses `weights_only=True` (contract 9).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ddplab import files
from ddplab.errors import DataError, FileSystemError

LAST = "last.pt"
BEST = "best.pt"


def save_atomic(obj: Any, path: Path) -> None:
    files.make_dir(path.parent)
    try:
        files.write_atomic(path, lambda tmp: torch.save(obj, tmp))
    except RuntimeError as exc:  # torch.save reports a failed write (a full disk, say) as RuntimeError
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileSystemError(f"cannot write checkpoint {path}: {reason}; is the disk full? "
                              "The previous checkpoint is kept") from None


def load(path: Path, map_location: torch.device | str = "cpu") -> dict:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise DataError(f"checkpoint {path} does not exist") from None
    except Exception as exc:  # unpickling refused, truncated zip, ...
        raise DataError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); it is corrupt or not a ddplab checkpoint") from None

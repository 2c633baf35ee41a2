"""Checkpoints written atomically and read without running code from the file.

A checkpoint holds everything needed to continue exactly (contract 5): model, optimizer,
scheduler, gradient scaler, early-stopping state, counters and the metrics so far. The
file is written to a temporary name and renamed, so a crash mid-write never leaves a
half-written file under the real name. Loading uses `weights_only=True` (contract 9).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ddplab import faults
from ddplab.errors import ConfigError, DataError, FileSystemError
from ddplab.io import borders, files
from ddplab.rundir import runfiles

LAST, BEST = runfiles.LAST_CHECKPOINT, runfiles.BEST_CHECKPOINT


def save_atomic(obj: Any, path: Path, *, epoch: int | None = None) -> None:
    files.make_dir(path.parent)

    def write(tmp: Path) -> None:
        torch.save(obj, tmp)
        if epoch is not None:
            faults.maybe_slow_save(epoch)

    try:
        files.write_atomic(path, write)
    except RuntimeError as exc:  # torch.save reports a failed write (a full disk, say) as RuntimeError
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileSystemError(
            f"cannot write checkpoint {path}: {reason}; is the disk full? The previous checkpoint is kept"
        ) from None


# What each kind of checkpoint must hold to be ddplab's (the last one resumes a run, the best one is weights).
REQUIRED_KEYS = {
    LAST: ("model", "optimizer", "scheduler", "scaler", "early_stopping", "train_state"),
    BEST: ("model", "epoch", "test_acc"),
}


def load(path: Path, map_location: torch.device | str = "cpu") -> dict:
    """A checkpoint's contents, checked to be ddplab's kind `path.name` (last.pt or best.pt)."""
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise DataError(f"checkpoint {path} does not exist") from None
    except Exception:  # unpickling refused, truncated zip, random bytes, ...
        # torch's own message advises loading with weights_only=False: never repeat that advice.
        raise DataError(
            f"checkpoint {path} cannot be read: it is truncated, corrupt or not a PyTorch checkpoint "
            "(ddplab reads only tensors and plain values from checkpoints)"
        ) from None
    required = REQUIRED_KEYS.get(path.name, ("model",))
    missing = [k for k in required if k not in state] if isinstance(state, dict) else list(required)
    if missing:
        raise DataError(f"checkpoint {path} is not a ddplab checkpoint: it lacks {', '.join(missing)}")
    if "train_state" in required:
        check_train_state(path, state["train_state"])
    return state


# The counters a resume reads from a last checkpoint's train_state (borders.py's kinds): epoch, step and the
# epochs' records are always written; the rest, where present (an older checkpoint lacks some), of their kind.
TRAIN_STATE = {
    "epoch": borders.WHOLE,
    "step": borders.WHOLE,
    "history": borders.list_of(borders.TABLE),
    "best_test_acc": borders.number(),
    "best_epoch": borders.WHOLE,
    "stopped_early": borders.FLAG,
    "earlier_sessions_s": borders.SECONDS,
    "layout_world": borders.WHOLE,
    "planned_world": borders.WHOLE,
    "schedule_step": borders.INTEGER,
    "segments": borders.list_of(borders.TABLE),
}


def check_train_state(path: Path, train_state: Any) -> None:
    """A last checkpoint's counters, each present and of its kind, or one line naming the file and the field
    (a hand-edited or foreign checkpoint was a KeyError or TypeError traceback)."""
    borders.check(
        {"train_state": train_state},
        {"train_state": TRAIN_STATE},
        f"checkpoint {path}",
        required=("train_state.epoch", "train_state.step", "train_state.history"),
    )


def restore(path: Path, into: Callable[[dict], Any], state: dict) -> None:
    """`into(state)`, with a checkpoint that does not fit the configured run as one line (exit 2)."""
    try:
        into(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        reason = " ".join(lines[:2])[:240] or type(exc).__name__
        raise ConfigError(
            f"checkpoint {path} does not fit the configured run ({reason}); was the run's config.toml "
            "edited after it was written? Restore that config, or start a new run"
        ) from None

"""The files of a run folder, by name: the one place their names are written.

A run folder is read far from where it was written (the report on a laptop, a sweep's
re-run, `ddplab eval` years later), so its names are a file format: every reader and writer
takes them from here, with what state a folder is in (`run_state`) and its JSON files read
(`read_json`, `read_jsonl`: one-line errors naming the file and the line). Torch-free. A sweep
folder's manifest is named with the manifest (sweepdir/folder.py); what an epoch record holds,
with rundir/epochs.py.
"""

import json
from pathlib import Path
from typing import Any

from ddplab.errors import ConfigError, DataError

CONFIG = "config.toml"  # the run's settings; first written, it marks the folder as a run
ENV = "env.json"  # versions, device, host
METRICS = "metrics.jsonl"  # one record per epoch
STEPS = "steps.jsonl"  # a few records per epoch: loss, learning rate, clock
GPU = "gpu.jsonl"  # NVML samples per rank (CUDA runs)
SUMMARY = "summary.json"  # written last: the run finished
LOG = "train.log"
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.pt"  # in CHECKPOINTS: the state after the last finished epoch
BEST_CHECKPOINT = "best.pt"  # in CHECKPOINTS: the weights with the best test accuracy
TENSORBOARD = "tensorboard"
LOCK = ".lock"  # who holds the folder (runlock.py)
ROUND = "round.json"  # the last round of workers: its hosts, and where it was if a collective failed under it


def checkpoint_path(run_dir: Path | str, which: str = LAST_CHECKPOINT) -> Path:
    """RUN/checkpoints/last.pt, or best.pt: the one place a checkpoint's path is built."""
    return Path(run_dir) / CHECKPOINTS / which


def run_state(run_dir: Path) -> str:
    """'new', 'finished', 'unfinished' or 'foreign' (a non-empty folder that is not a run)."""
    if not run_dir.exists() or (run_dir.is_dir() and not any(p.name != LOCK for p in run_dir.iterdir())):
        return "new"
    if not run_dir.is_dir():
        return "foreign"
    if (run_dir / SUMMARY).exists():
        return "finished"
    if checkpoint_path(run_dir).exists():
        return "unfinished"
    if (run_dir / CONFIG).exists():
        return "new"  # created, but no epoch finished: nothing to lose
    return "foreign"


def read_json(path: Path, run_dir: Path) -> Any:
    """A JSON file; a truncated or edited one is a DataError naming the file and the line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{run_dir} is not a finished ddplab run (no {path.name})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} cannot be read ({type(exc).__name__})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} line {exc.lineno} is not JSON ({exc.msg}): truncated or edited?") from None


def read_jsonl(path: Path, run_dir: Path) -> list[Any]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{run_dir} is not a finished ddplab run (no {path.name})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} cannot be read ({type(exc).__name__})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(json_line(line))
            except ValueError:
                raise DataError(f"{path} line {number} is not JSON (a truncated write?)") from None
    return records


def json_line(line: str) -> Any:
    """One line of a JSONL file (ValueError when it is not JSON: a truncated or a half-written line)."""
    return json.loads(line)

"""Every file ddplab writes: atomically, as strict JSON where it is JSON, with one-line errors.

A file appears under its real name only complete: it is written to `NAME.tmp` and renamed,
and the temporary file is removed if writing fails (a full disk leaves nothing behind).
JSON never carries NaN or Infinity, which are not JSON: a non-finite float is written as
null. An OSError becomes a `FileSystemError` naming the path (exit code 5).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddplab.errors import FileSystemError, file_error


def user_path(text: str | Path) -> Path:
    """A path as a user gave it (a flag, a positional argument, a sweep file's name): `~` and `~user` expanded
    here, once, as a shell would have (a quoted `~/runs` otherwise became a folder named `~`). An empty one
    (`--out "$OUT"` with OUT unset) is refused: Path("") is the working directory, never what was meant."""
    if isinstance(text, str) and not text.strip():
        import argparse

        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?): give a path, or leave it out")
    return Path(text).expanduser()


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)`, flush it to the disk and rename tmp to `path`; on any failure remove tmp and re-raise.

    The flush (fsync) comes before the rename: a disk that reports being full only when the data is written
    out (delayed allocation, NFS, a quota) fails here, with nothing under the real name, and a power cut after
    the rename never leaves a short or empty file where a whole one was (a checkpoint, a report's PNG)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # two writers of one file never share a temp file
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # the rename itself made durable, where the file system can say so
            folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            if exc.filename in (None, str(tmp), tmp):  # the user named `path`: the temporary name is ours
                exc.filename = str(path)
            if isinstance(exc, FileNotFoundError) and not path.parent.is_dir():
                raise FileSystemError(f"cannot write {path}: its folder {path.parent} does not exist") from None
            raise file_error(exc) from None
        raise


def remove_dead_writers_files(*folders: Path) -> list[Path]:
    """The temporary files `write_atomic` left in `folders` when its process was killed between the write and
    the rename (SIGKILL, a power cut): removed where that process is gone. Called by a folder's holder, so no
    live writer of its own is about; another process's live write is left alone."""
    removed = []
    for folder in folders:
        for tmp in Path(folder).glob("*.*.tmp") if Path(folder).is_dir() else ():
            pid = tmp.name[: -len(".tmp")].rsplit(".", 1)[-1]
            if pid.isdigit() and not process_alive(int(pid)):
                with contextlib.suppress(OSError):
                    tmp.unlink()
                    removed.append(tmp)
    return removed


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def ready_to_write(path: Path) -> None:
    """The folder of `path` made (with its parents) and shown to take a file, before work whose result would
    otherwise be lost to a read-only or missing folder (a link measurement, a plan)."""
    folder = Path(path).parent
    make_dir(folder)
    probe = folder / f".{Path(path).name}.{os.getpid()}.probe"
    try:
        probe.touch()
    except OSError as exc:
        exc.filename = str(folder)
        raise file_error(exc, "write into") from None
    probe.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text))


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON (RFC 8259): non-finite floats as null, anything else unknown as its str()."""
    return json.dumps(finite(obj), allow_nan=False, default=str, **kwargs)


def write_json(path: Path, obj: Any) -> None:
    write_text(path, dumps(obj, indent=2) + "\n")


def append_line(path: Path, line: str) -> None:
    """Append one line and flush it (for JSONL files), with a one-line error."""
    try:
        with Path(path).open("a") as f:
            f.write(line + "\n")
    except OSError as exc:
        raise file_error(exc, path=path) from None


def make_dir(path: Path) -> None:
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise file_error(exc, "create the folder") from None

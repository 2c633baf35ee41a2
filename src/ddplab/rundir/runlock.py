"""A run folder belongs to one process tree at a time.

The root of the tree (the CLI process, the built-in launcher, or rank 0 under torchrun /
srun) holds an exclusive `flock` on `RUN_DIR/.lock` for as long as the run lasts, and
writes who it is into the file. The kernel drops the lock when that process ends, however
it ends, so a lock left by a killed run is stale by construction: the next run takes it
over. A second run on the same folder is refused with the owner's pid, host and command.
A sweep runs many runs side by side and relies on this.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ddplab.errors import ConfigError, file_error
from ddplab.io import borders, files
from ddplab.rundir import runfiles

LOCK = runfiles.LOCK
# Run folders this process holds: (lock fd, holding thread). A second hold in this process, by another
# thread (two Python callers) or by the same one, is refused as another process's would be.
_held: dict[Path, tuple[int, int]] = {}


def should_hold(rank: int | None, *, launching_nodes: int = 1, launcher_holds: bool = False) -> bool:
    """Whether this process takes its run folder's lock: the one rule for who holds a run folder.

    The root of the process tree holds it, once: a process started by no launcher (`rank`
    None: the CLI, the built-in launcher, a Python caller), or global rank 0 of torchrun /
    srun. A launcher that starts one node of a multi-node run does not know whether its
    node holds global rank 0, so there the rank-0 worker takes it instead. A worker whose
    launcher holds the folder (`launcher_holds`, as its run plan says) takes nothing.
    """
    if rank is None:
        return launching_nodes == 1
    return rank == 0 and not launcher_holds


OWNER = {"pid": borders.COUNT, "host": borders.TEXT, "argv": borders.list_of(borders.TEXT), "started": borders.SECONDS}


def owner_of(run_dir: Path) -> dict | None:
    """Who wrote the lock file last (the live owner while the folder is locked), or None; a field of another kind
    (an edited or foreign lock file) is left out, so that whom a refusal names is never a traceback."""
    try:
        data = json.loads((Path(run_dir) / LOCK).read_text())
    except (OSError, ValueError):  # UnicodeDecodeError is one too
        return None
    return borders.kept(data, OWNER, str(Path(run_dir) / LOCK))[0] if isinstance(data, dict) else None


def live_owner(run_dir: Path) -> dict | None:
    """Who holds `run_dir` while a live process does ({} if it left no record), else None.

    Tested by trying the lock itself for a moment, so a stale file left by a killed run
    counts as free, as `run_lock` would take it over.
    """
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return owner_of(run_dir) or {}
    finally:
        os.close(fd)  # and with it the moment's lock
    return None


def describe(owner: dict | None) -> str:
    if not owner:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
    return (
        f"pid {owner.get('pid', '?')} on {owner.get('host', '?')} ({' '.join(owner.get('argv', []))[:120]}, "
        f"started {started})"
    )


@contextlib.contextmanager
def run_lock(run_dir: Path, what: str = "run") -> Iterator[None]:
    """Hold `run_dir` (a run's folder, or a sweep's: `what`) for this process tree; ConfigError (exit 2)
    if a live process holds it."""
    key = Path(run_dir).resolve()
    if key in _held:
        whom = "another thread of" if _held[key][1] != threading.get_ident() else f"a {what} already started in"
        raise ConfigError(
            f"{_named(run_dir, what)} is in use by {whom} this process (pid {os.getpid()}); "
            f"wait for that {what} to end, or choose another --out"
        )
    fd = _acquire(Path(run_dir), what)
    _held[key] = (fd, threading.get_ident())
    try:
        yield
    finally:
        del _held[key]
        with contextlib.suppress(OSError):
            (Path(run_dir) / LOCK).unlink()
        os.close(fd)  # releases the flock
        with contextlib.suppress(OSError):
            Path(run_dir).rmdir()  # only if the run never wrote anything (a refused start)


def _acquire(run_dir: Path, what: str) -> int:
    path = run_dir / LOCK
    for _ in range(10):
        files.make_dir(run_dir)  # "cannot create the folder X", as any folder ddplab makes
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise file_error(exc, f"create the {what} folder's lock") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"{_named(run_dir, what)} is in use by {describe(owner_of(run_dir))}; wait for that "
                f"{what} to end, or choose another --out"
            ) from None
        # The previous owner may have removed the file between our open and our flock: then
        # we hold a lock on a file nobody else can see, so start again.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "argv": sys.argv}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):  # left as a release leaves it: no empty lock, no empty folder
                path.unlink()
                run_dir.rmdir()
            raise file_error(exc, path=path) from None
        return fd
    raise ConfigError(f"{_named(run_dir, what)}: could not take the folder's lock; try again")


def _named(folder: Path, what: str) -> str:
    """The folder as its command's option gave it: a run's is its setting, a sweep's or a report's its --out."""
    return f"output.out={str(folder)!r}" if what == "run" else f"the {what} folder {str(folder)!r} (--out)"

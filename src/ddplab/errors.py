"""Errors a user can act on.

Every error raised for bad input derives from `DdplabError`: the CLI prints its message as
one line and exits with `exit_code`, without a traceback (contract 8). Anything else is a
bug and keeps its traceback.
"""


class DdplabError(Exception):
    """An error with a message meant for the user, not a bug."""

    exit_code = 1


class ConfigError(DdplabError, ValueError):
    """A configuration value is wrong; the message names the field, the value and what is allowed."""

    exit_code = 2


class DataError(DdplabError):
    """A dataset is missing, incomplete or corrupt; the message says which file and what to do."""

    exit_code = 3


class TrainingError(DdplabError):
    """Training cannot go on (non-finite loss, out of memory); the last good checkpoint is kept."""

    exit_code = 4


class Interrupted(DdplabError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) ended the command; what finished is kept, what ran is resumable."""

    exit_code = 130  # as a shell reports Ctrl-C: every stop, whatever the signal (stops.py)


TIMED_OUT = 124  # a command stopped at its time limit, as timeout(1) reports it
BROKEN_PIPE = 141  # the reader of the output went away (128 + SIGPIPE), as shell tools end


class SweepError(DdplabError):
    """Some runs of a sweep did not finish; each one's error is in the sweep's manifest."""

    exit_code = 1


class FileSystemError(DdplabError):
    """A file or folder cannot be written or read (read-only, full disk, permissions); the message names the path."""

    exit_code = 5


def file_error(exc: OSError, action: str = "write", path: object = None) -> FileSystemError:
    """One line for an OSError: the path, the operation and the system's reason. `path`: the file the caller was
    writing, for the errors that name none (a write() or pwrite() on an open file: a full disk's ENOSPC)."""
    path = exc.filename if exc.filename is not None else path if path is not None else "a file"
    reason = exc.strerror or str(exc)
    hint = "; free some space" if exc.errno == 28 else ""  # ENOSPC
    return FileSystemError(f"cannot {action} {path}: {reason}{hint}")

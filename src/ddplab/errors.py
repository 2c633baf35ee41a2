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

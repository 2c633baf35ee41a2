"""Switches read from the environment: one rule for every on/off variable ddplab reads; and variables set for a
block only.

A shell user writes DDPLAB_WARM=0, =false, =off or =no and means the same; a value that is none of the
spellings (a typo, =maybe) is one ConfigError naming the variable, never silently read as on. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from ddplab.errors import ConfigError
from ddplab.io.borders import shown

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")


def switch(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    """The on/off variable `name` (`default` where unset or empty), any case, spaces around ignored."""
    env = os.environ if env is None else env
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ConfigError(
        f"{name}={shown(env[name])} is not a switch: "
        f"use one of {', '.join(ON)} to turn it on, {', '.join(OFF)} to turn it off"
    )


@contextlib.contextmanager
def restored(name: str) -> Iterator[None]:
    """The variable `name` as it was before the block (unset again where it was unset), whatever the block set:
    a Python caller's later child processes must not inherit what a launch exported for its own."""
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before

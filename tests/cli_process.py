"""The one way tests run `python -m ddplab ...`: a process of its own, as a user's shell starts it.

Forked from this test process's warm server (ddplab.warm) where it can be, so a test pays for what
the command does, not for importing torch again: the child is still its own process (session, exit
code, signals, output, /proc/PID/environ), and a warm start ends bit-identical to a cold one
(tests/unit/test_warm.py). DDPLAB_WARM=0 runs every command cold.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from ddplab import warm

THREADS = {"OMP_NUM_THREADS": "1"}  # one core's work a command: the suite runs several at once


def ddplab_cli(
    *args,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    cwd=None,
    timeout: float = 300,
    module: str = "ddplab",
    input: str | None = None,
    errors: str = "strict",
) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS`, output captured as text; `env` over `base_env` (this process's by default)."""
    full_env = {**(os.environ if base_env is None else base_env), **THREADS, **(env or {})}
    return warm.run(
        [sys.executable, "-m", module, *map(str, args)],
        input=input,
        capture_output=True,
        errors=errors,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        session=True,
    )

"""One command run as its own process tree: logged, watched, timed, and stopped as a whole.

The sweep runs each of its runs this way, and the scripts and benchmarks their `ddplab train`
and `ddplab kernels` commands. A DDP run is a tree (the launcher and its workers): a timeout
or a Ctrl-C stops all of it, and the child dies with its parent (even a SIGKILLed one), so
nothing trains on unwatched. Torch-free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

POLL_S = 1.0  # how often `on_poll` is called while the child runs
STOP_GRACE_S = 30  # after SIGINT/SIGTERM, how long a tree may take to stop before SIGKILL
TIMED_OUT, INTERRUPTED = 124, 130  # exit codes given to a child stopped for its timeout, or by Ctrl-C


@dataclass(frozen=True)
class Finished:
    code: int  # the child's exit code; TIMED_OUT or INTERRUPTED when it was stopped
    wall_s: float
    log: Path
    command: list[str] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        """The child's `ddplab: error:` line (else its last line), None when it succeeded."""
        return error_line(self.log) if self.code else None


def ddplab_command(*args: str) -> list[str]:
    """`python -m ddplab ARGS` with this interpreter."""
    return [sys.executable, "-m", "ddplab", *args]


def supervise(cmd: Sequence[str], log_path: Path, *, timeout_s: float | None = None,
              on_poll: Callable[[], object] | None = None, env: Mapping[str, str] | None = None,
              cwd: Path | None = None, poll_s: float = POLL_S, timeout_from: str = "") -> Finished:
    """Run `cmd` as its own process tree, its output appended to `log_path` (an earlier attempt's
    output stays, under a `$ command` line each), calling `on_poll` every `poll_s` and once at the end.

    Past `timeout_s` the tree gets SIGTERM (exit TIMED_OUT, said in the log with `timeout_from`, the
    option that set it); a KeyboardInterrupt
    here (Ctrl-C, or SIGTERM made one) stops it as Ctrl-C stops a run: exit INTERRUPTED, for the
    caller to record before it stops too.
    """
    cmd = [str(part) for part in cmd]
    start = time.perf_counter()
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(env) if env is not None else None, cwd=cwd,
                                preexec_fn=die_with_parent if sys.platform == "linux" else None)
        try:
            code = _wait(proc, start, timeout_s, on_poll, poll_s)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM here: stop the tree as Ctrl-C stops a run
            stop_tree(proc, signal.SIGINT)
            code = INTERRUPTED
        except subprocess.TimeoutExpired:
            stop_tree(proc, signal.SIGTERM)
            source = f" ({timeout_from})" if timeout_from else ""
            log.write(f"\nddplab: error: the command did not finish within {timeout_s:g} s{source}; stopped\n")
            code = TIMED_OUT
    wall_s = time.perf_counter() - start
    if on_poll is not None:
        on_poll()
    return Finished(code, wall_s, Path(log_path), cmd)


def _wait(proc: subprocess.Popen, start: float, timeout_s: float | None, on_poll, poll_s: float) -> int:
    while True:
        try:
            return proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            if on_poll is not None:
                on_poll()
            if timeout_s is not None and time.perf_counter() - start > timeout_s:
                raise


def die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGTERM if its parent dies (even by SIGKILL), so
    nothing trains on unsupervised. A run stops as SIGTERM stops it, resumable from its checkpoint."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not glibc: no such safety net, the child goes on
        pass


def stop_tree(proc: subprocess.Popen, sig: int, grace_s: float = STOP_GRACE_S) -> None:
    """Signal the child's whole process group, then SIGKILL whatever is left after `grace_s`."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def error_line(log_path: Path) -> str:
    """The last `ddplab: error:` line of the log's last attempt, else its last line."""
    lines = last_attempt(log_path)
    errors = [line.removeprefix("ddplab: error: ") for line in lines if line.startswith("ddplab: error:")]
    return errors[-1] if errors else (lines[-1][:300] if lines else "no output")


def last_line(log_path: Path) -> str:
    """The last line the last attempt wrote (a test run's summary, say); empty when it wrote none."""
    lines = last_attempt(log_path)
    return lines[-1] if lines else ""


def last_attempt(log_path: Path) -> list[str]:
    """The output lines of the log's last attempt, below its `$ command` line."""
    text = Path(log_path).read_text(errors="replace")
    return text[text.rfind("\n$ ") + 1:].strip().splitlines()[1:]

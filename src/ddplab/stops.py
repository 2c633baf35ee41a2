"""Stop signals: one rule for every ddplab command.

Ctrl-C (SIGINT), SIGTERM (a scheduler's time limit, `kill`, a sweep stopping its point) and SIGHUP (the
terminal or SSH session closed) each stop a command as Ctrl-C does: what finished is kept, what runs is
stopped resumable, the command says which signal in its last line and exits 130. SIGQUIT keeps Python's
default (a core dump: someone asked for one). A DDP launcher's elastic agent stops on the same signals itself.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_CODE = 130  # as a shell reports Ctrl-C


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread as Python raises SIGINT's KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def name_of(interrupt: BaseException) -> str:
    """The signal that stopped the command: a Stopped says which; a plain KeyboardInterrupt is Ctrl-C's."""
    return signal.Signals(interrupt.signum).name if isinstance(interrupt, Stopped) else "SIGINT"


def raise_stopped(signum: int, frame) -> None:
    raise Stopped(signum)


def interrupted_line(interrupt: BaseException) -> str:
    """A command's last line when a stop signal ended it: Ctrl-C's as it always was, another one named."""
    name = name_of(interrupt)
    return "ddplab: interrupted" if name == "SIGINT" else f"ddplab: interrupted by {name}"


def say_last(line: str) -> None:
    """The last line on stderr, where it can still be written: after SIGHUP the terminal may be gone (EIO),
    and Python's own flush at exit must not turn that into a traceback or exit code 120."""
    import os
    import sys

    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # nothing can reach it any more: point it at /dev/null for the exit's flush
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            except (OSError, ValueError):
                pass


@contextlib.contextmanager
def as_interrupts() -> Iterator[None]:
    """For the block, SIGTERM and SIGHUP raise Stopped (a KeyboardInterrupt) as SIGINT raises KeyboardInterrupt.
    One this process was started with ignored stays ignored (`nohup` promises a closed terminal stops nothing).
    Signal handlers belong to the main thread: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, raise_stopped)
        for sig in STOP_SIGNALS
        if sig != signal.SIGINT and signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def ignored() -> Iterator[None]:
    """Every stop signal ignored for the block (in the main thread; elsewhere nothing changes): what is being
    stopped is not interrupted half-way by a second one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

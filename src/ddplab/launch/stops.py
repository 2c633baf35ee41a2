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


def started_ignored(sig: int) -> bool:
    """Ignored in this process (as `nohup` starts a command with SIGHUP): a promise every stop rule keeps."""
    return signal.getsignal(sig) is signal.SIG_IGN


@contextlib.contextmanager
def handled(signals: tuple[int, ...], handler) -> Iterator[None]:
    """`handler` for each of `signals` for the block, the previous ones back after it; one ignored is left
    ignored. Signal handlers belong to the main thread: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals if not started_ignored(sig)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def as_interrupts():
    """For the block, SIGTERM and SIGHUP raise Stopped (a KeyboardInterrupt) as SIGINT raises KeyboardInterrupt
    (main thread only); one this process was started with ignored stays ignored (`nohup`)."""
    return handled(tuple(s for s in STOP_SIGNALS if s != signal.SIGINT), raise_stopped)


def ignored():
    """Every stop signal ignored for the block (main thread only): what is being stopped is not interrupted
    half-way by a second one."""
    return handled(STOP_SIGNALS, signal.SIG_IGN)

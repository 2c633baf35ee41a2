"""Stop signals: one rule for every ddplab command.

Ctrl-C (SIGINT), SIGTERM (a scheduler's time limit, `kill`, a sweep stopping its point) and SIGHUP (the
terminal or SSH session closed) each stop a command as Ctrl-C does: what finished is kept, what runs is
stopped resumable, the command says which signal in its last line and exits 130. The first stop signal
begins the stop; any that follow (a second Ctrl-C, a script's or scheduler's second SIGTERM) are ignored until
the command has exited, so they can neither cut the stop short nor change its exit code. SIGQUIT keeps
Python's default (a core dump: someone asked for one). A DDP launcher's elastic agent stops on the same
signals itself, and a library that takes them for a while (torch's elastic agent, ray.init) gives them back
(`kept`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from ddplab.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TAKEN_BY_LIBRARIES = (*STOP_SIGNALS, signal.SIGQUIT)  # what torch's elastic agent sets for its run and keeps
EXIT_CODE = Interrupted.exit_code

_open = 0  # `as_interrupts` blocks open in this process: the outermost one owns the stop's state
_stopping = False  # a stop has begun: stop signals are ignored until the outermost block ends


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread as Python raises SIGINT's KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def name_of(interrupt: BaseException) -> str:
    """The signal that stopped the command: a Stopped says which; a plain KeyboardInterrupt is Ctrl-C's."""
    return signal.Signals(interrupt.signum).name if isinstance(interrupt, Stopped) else "SIGINT"


def raise_stopped(signum: int, frame) -> None:
    """The handler of every stop signal inside `as_interrupts`: the first begins the stop (SIGINT as Python's
    KeyboardInterrupt, another as Stopped); later ones find it begun and are ignored."""
    if _stopping:
        return
    begin()
    raise KeyboardInterrupt if signum == signal.SIGINT else Stopped(signum)


def begin() -> None:
    """A stop has begun (a handler of ours raised, or a library's took the signal and unwound): every later stop
    signal is ignored until the outermost `as_interrupts` block ends. Outside any block (a Python caller's own
    handlers) there is nothing to ignore with, and no state is left behind for a later call."""
    global _stopping
    if _open:
        _stopping = True


def stopping() -> bool:
    return _stopping


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


@contextlib.contextmanager
def as_interrupts(*, to_exit: bool = False) -> Iterator[None]:
    """For the block, SIGINT raises KeyboardInterrupt and SIGTERM and SIGHUP raise Stopped (a KeyboardInterrupt),
    the first of them only: the rest are ignored while the stop is carried out (main thread only). One this process
    was started with ignored stays ignored (`nohup`). `to_exit`: the block is the command's whole life; once a stop
    has begun, every stop signal stays ignored after it, until the process has exited with 130."""
    global _open, _stopping
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _open == 0:
        _stopping = False
    _open += 1
    try:
        with handled(STOP_SIGNALS, raise_stopped):
            yield
    finally:
        _open -= 1
        if _open == 0:
            if _stopping and to_exit:
                for sig in STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_IGN)
            _stopping = False


@contextlib.contextmanager
def kept(signals: tuple[int, ...] = TAKEN_BY_LIBRARIES) -> Iterator[None]:
    """This process's handlers of `signals` as they were before the block, whatever a library inside it set.

    torch's elastic agent sets its own (raising SignalException) for SIGINT, SIGTERM, SIGHUP and SIGQUIT when it
    starts workers and never puts the old ones back; ray.init sets SIGTERM's. Left there, a Ctrl-C after an
    in-process launch (a sweep's all-reduce measurement, a Python caller's DDP run) raised the agent's exception
    from wherever the process was: a traceback and exit 1. Main thread only, as signal handlers are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, which cannot be put back from here
                signal.signal(sig, handler)


def ignored():
    """Every stop signal ignored for the block (main thread only): what is being stopped is not interrupted
    half-way by a second one."""
    return handled(STOP_SIGNALS, signal.SIG_IGN)

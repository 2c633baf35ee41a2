"""Bounds on the launcher's waits that PyTorch's elastic agent does not keep across a network.

The agent's main thread talks to the rendezvous store on host 0 (every monitor tick, at a
restart, at the end), and a store call across a dead link blocks in C++ for its whole read
timeout, then is retried: a node whose link was cut waited for minutes and its Python
signal handlers never ran, so SIGTERM was ignored. This thread keeps two promises whatever
the main thread is blocked in:

- a signal the agent stops on (SIGTERM, Ctrl-C, SIGHUP, SIGQUIT) ends this node's processes
  within `grace_s`: the agent's own shutdown first, then SIGKILL for every descendant, the
  launcher's usual line, exit 130;
- a rendezvous host that stops answering for `timeout_s`, or never answers, ends them with
  one line that names it (exit 4). The probe is one idle TCP connection to the store's port whose kernel
  keep-alive probes every second: it costs no traffic and no store request, and a dead
  link shows as a socket error after `timeout_s`. A store that closes the connection (its
  run ended, its host's processes died) is the agent's business: it fails at once.

Checkpoints are atomic (temp file and rename), so killing mid-write keeps the last good one.
Only the `ddplab` command arms it: killing every descendant and ending the process is for a
process that is the run, never for a Python caller's (a notebook's kernel).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ddplab import errors
from ddplab.launch import warm
from ddplab.launch.process import INTERRUPTED

UNREACHED_GRACE_S = 3  # past dist.timeout_s, for the agent to say a never-reached endpoint in its own words
# What a dead link or host looks like to a socket (a reset or a refusal is a live peer's answer).
UNREACHABLE = {errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, by parent id (Linux /proc; none elsewhere)."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            found.setdefault(int(entry.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(entry.parent.name))
    return found


def children(parent: int) -> list[int]:
    return children_by_parent().get(parent, [])


def descendants(root: int) -> list[int]:
    """Every process below `root`, children before their own children."""
    parents = children_by_parent()
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> None:
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def end_now(line: str, code: int) -> None:
    """Every process of this node gone, one line said, this process ended: the main thread may be
    blocked in C++ for minutes yet, and nothing it would still do (tear-down talk with a dead host) counts."""
    kill_descendants()
    with contextlib.suppress(OSError):  # not sys.stderr: the blocked main thread may hold its lock
        os.write(2, f"ddplab: error: {line}\n".encode())
    os._exit(code)


MAX_KEEPALIVE_PROBES = 127  # Linux refuses a larger TCP_KEEPCNT


def open_probe(host: str, port: int, timeout_s: int) -> socket.socket:
    """A connection to the store whose kernel gives up on it after `timeout_s` of silence from the peer.

    A keep-alive probe every second from the first idle second; TCP_USER_TIMEOUT (Linux) decides
    when unanswered probes close the connection (tcp(7): it overrides the probe count, which
    Linux caps at 127). Elsewhere the count alone bounds it, at most 127 s."""
    probe = socket.create_connection((host, port), timeout=min(10, timeout_s))
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's keep-alive (hours) applies
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, min(MAX_KEEPALIVE_PROBES, max(1, timeout_s - 1)))
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # milliseconds, a C int
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, min(timeout_s * 1000, 2**31 - 1))
    except OSError:
        probe.close()
        raise
    probe.settimeout(None)
    return probe


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # those the elastic agent stops on


class Watchdog:
    """The threads' state; `guarded` starts and stops them around the agent."""

    def __init__(
        self,
        *,
        grace_s: float,
        interrupted_line: Callable[[str], str],
        endpoint: tuple[str, int] | None = None,
        timeout_s: int = 600,
        lost_line: Callable[[str], str] | None = None,
        unreached_line: Callable[[str], str] | None = None,
    ):
        self.grace_s, self.interrupted_line = grace_s, interrupted_line
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.lost_line, self.unreached_line = lost_line, unreached_line
        self.done = threading.Event()
        self.signalled: str | None = None
        self._wake_r = self._wake_w = -1  # the wake-up pipe, while guarded

    def watch_signals(self) -> None:
        """Signals reach the C-level handler even while the main thread is stuck: CPython writes their
        numbers to the wake-up fd at once, though the Python handler waits for the main thread."""
        deadline = None
        while not self.done.is_set():
            timeout = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            ready, _, _ = select.select([self._wake_r], [], [], timeout)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    for number in os.read(self._wake_r, 64):
                        if number in STOP_SIGNALS and self.signalled is None:
                            self.signalled = signal.Signals(number).name
                            deadline = time.monotonic() + self.grace_s
            if deadline is not None and time.monotonic() >= deadline and not self.done.is_set():
                end_now(self.interrupted_line(self.signalled or "SIGTERM"), INTERRUPTED)

    def watch_endpoint(self) -> None:
        assert self.endpoint is not None and self.lost_line is not None and self.unreached_line is not None
        host, port = self.endpoint
        since = time.monotonic()
        probe = None
        while not self.done.is_set():  # the store may not be up yet (refused): its host's node may start later
            try:
                probe = open_probe(host, port, self.timeout_s)
                break
            except OSError as exc:
                if exc.errno not in UNREACHABLE | {errno.ECONNREFUSED} and not isinstance(exc, TimeoutError):
                    return  # not the network's doing: the probe stands down, the agent's own timeouts remain
                if (
                    time.monotonic() - since > self.timeout_s + UNREACHED_GRACE_S
                    and not workers_started()
                    and not self.done.is_set()
                ):
                    # torch's connect retries once more after its timeout, with a back-off as long: don't wait for it
                    end_now(self.unreached_line(f"{host}:{port}"), errors.TrainingError.exit_code)
                self.done.wait(1.0)
        if probe is None:
            return
        with probe:
            try:
                while not self.done.is_set():
                    ready, _, _ = select.select([probe], [], [], 0.5)
                    if ready and not probe.recv(1):
                        return  # the store closed it: the run ended there, or that host's processes died
            except OSError as exc:  # ETIMEDOUT: the keep-alive probes went unanswered for timeout_s
                if exc.errno in UNREACHABLE and not self.done.is_set():
                    end_now(self.lost_line(f"{host}:{port}"), errors.TrainingError.exit_code)


def workers_started() -> bool:
    """Whether this launcher has spawned its workers, which it does only once the rendezvous formed (the
    store was reached, whatever the probe saw): any descendant but multiprocessing's resource tracker and the
    warm server the workers fork from (started before the rendezvous; its children are the workers)."""
    servers = warm.server_pids()
    for pid in descendants(os.getpid()):
        if pid in servers:
            continue
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
    return False


@contextlib.contextmanager
def guarded(watchdog: Watchdog) -> Iterator[Watchdog]:
    """Run the watchdog's threads for the length of the block (main thread only: it owns the wake-up fd)."""
    if threading.current_thread() is not threading.main_thread():
        yield watchdog
        return
    watchdog._wake_r, watchdog._wake_w = os.pipe()
    for fd in (watchdog._wake_r, watchdog._wake_w):
        os.set_blocking(fd, False)
    previous = signal.set_wakeup_fd(watchdog._wake_w, warn_on_full_buffer=False)
    threads = [threading.Thread(target=watchdog.watch_signals, name="ddplab-watchdog-signals", daemon=True)]
    if watchdog.endpoint is not None:
        threads.append(threading.Thread(target=watchdog.watch_endpoint, name="ddplab-watchdog-endpoint", daemon=True))
    for thread in threads:
        thread.start()
    try:
        yield watchdog
    finally:
        watchdog.done.set()
        signal.set_wakeup_fd(previous)
        for thread in threads:
            thread.join(timeout=2)
        for fd in (watchdog._wake_r, watchdog._wake_w):
            os.close(fd)

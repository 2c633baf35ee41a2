"""The client's side: one warm server per start-up environment (Factory), a warm child as subprocess.Popen is
seen (WarmProcess), and `popen`/`run`, subprocess's two calls, forking warm where the command allows it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from ddplab import internals
from ddplab.launch.warm.protocol import (
    START_TIMEOUT_S,
    STARTED,
    can_adopt,
    can_enter,
    command_of,
    enabled,
    read_at_start,
    read_reply,
    same_file,
    set_parent_death_signal,
    split_namespace,
)


class Factory:
    """A client's handle on one warm server: started on first use (or by `start`), shared by the threads
    of this process, ended when this process ends (the server reads the channel's end as its cue)."""

    def __init__(
        self, channel: socket.socket | None = None, env: Mapping[str, str] | None = None, pid: int | None = None
    ):
        self._lock = threading.Lock()
        self._channel = channel  # SOCK_SEQPACKET to the server; None until started
        self._start_env = dict(env) if env is not None and channel is None else None  # the server's, else ours
        self._env = read_at_start(env if env is not None else os.environ)
        self._server: subprocess.Popen | None = None
        self._pid = pid  # a server forked from this process (not started by exec)
        self._broken = False
        # A parent-death signal follows the thread that forked: the server's children die with this process by one
        # only where its main thread started the server (a forked server is started before the command runs).
        self._from_main_thread = channel is not None or threading.current_thread() is threading.main_thread()
        atexit.register(self.close)  # the server ends before this process does: nothing of ours outlives it

    def start(self, imports: Sequence[str] = ()) -> None:
        """Start the server now (it imports in the background, `imports` too: the modules the caller's children
        will import), so that the first request finds it warm."""
        with self._lock:
            self._start(imports)

    def _start(self, imports: Sequence[str] = ()) -> None:
        if self._channel is not None or self._broken:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._from_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self._server = subprocess.Popen(
                [
                    sys.executable,
                    *internals.interpreter_flags(),
                    "-c",
                    # -c puts the working directory first on sys.path: a ddplab/ or torch/ folder there would be
                    # imported in place of the real ones. Left out while the server imports, back for its children.
                    "import sys; first = sys.path.pop(0) if sys.path[:1] == [''] else None; "
                    f"from ddplab.launch.warm import serve_cold; serve_cold({theirs.fileno()}, first, "
                    f"{tuple(str(name) for name in imports)!r})",
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=self._start_env,
                # Killed with this process where the main thread starts it (a parent-death signal follows the
                # thread that forked); elsewhere it ends when the channel does, as this process does too.
                preexec_fn=server_dies_with_parent if threading.current_thread() is threading.main_thread() else None,
            )
        except OSError:
            self._broken = True
            ours.close()
            return
        finally:
            theirs.close()
        self._env = read_at_start(os.environ if self._start_env is None else self._start_env)
        self._channel = ours

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a command with `env` can start warm here: what it would read at start-up is the server's."""
        return not self._broken and read_at_start(env) == self._env

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | os.PathLike | None = None,
        fds: Mapping[int, int],
        session: bool = False,
        mask: Sequence[int] = (),
        ignored: Sequence[int] = (),
        cpus: Sequence[int] = (),
        imports: Sequence[str] = (),
        timeout_s: float = START_TIMEOUT_S,
    ) -> WarmProcess | None:
        """Fork `argv` from the server as exec would run it, with `fds` ({number in the child: descriptor
        here}, stdin/stdout/stderr among them); None where it must start cold (then nothing was started).
        `imports`: modules the child will import, imported by the server first (once) for this child and the next."""
        if not (emulated(argv) and self.fits(env)):
            return None
        namespace, command = split_namespace(argv)
        request = {
            "argv": command,
            "namespace": namespace,
            "env": dict(env),
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "targets": list(fds),
            "session": session,
            "mask": sorted(int(s) for s in mask),
            "ignored": sorted(int(s) for s in ignored),
            "cpus": sorted(cpus),
            "umask": current_umask(),
            "limits": current_limits(),
            "adopt": can_adopt(),  # the child made this process's own: it outlives a server that dies
            "pid": os.getpid(),  # the server adopts for the process that started it alone (not a fork of it)
            "die_with_client": self._from_main_thread,
            "imports": [str(name) for name in imports],
        }
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                self._start(imports)
                if self._channel is None:
                    return None
                try:
                    socket.send_fds(self._channel, [pickle.dumps(request)], [*fds.values(), theirs.fileno()])
                except OSError:  # the server is gone: cold from now on
                    self._broken = True
                    return None
            theirs.close()
            mine.settimeout(timeout_s)
            try:
                pid, adopted = read_reply(mine, STARTED)
            except (OSError, EOFError):  # never answered (still importing, or died doing so): start cold
                mine.close()
                return None
            mine.settimeout(None)
            return WarmProcess(pid, mine, list(argv), adopted=bool(adopted))
        finally:
            if theirs.fileno() != -1:
                theirs.close()

    def __enter__(self) -> Factory:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The server's process id, once started."""
        return self._server.pid if self._server is not None else self._pid

    def close(self, timeout_s: float = 5.0) -> None:
        """End the server (it reads the channel's end as its cue) and wait for it to be gone."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            if self._server is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._server.wait(timeout=timeout_s)
            elif self._pid is not None:
                deadline = time.monotonic() + timeout_s
                with contextlib.suppress(ChildProcessError):
                    while os.waitpid(self._pid, os.WNOHANG)[0] == 0 and time.monotonic() < deadline:
                        time.sleep(0.005)
                self._pid = None


class WarmProcess:
    """A warm child as its client sees it: subprocess.Popen's polling and signalling interface.

    `adopted`: the child is this process's own (see `adopt`), waited for here as subprocess waits for its
    children, through a pidfd; otherwise it is the server's, and the server says how it ended."""

    def __init__(self, pid: int, channel: socket.socket, args: list[str], *, adopted: bool = False):
        self.pid, self.args, self._channel = pid, args, channel
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid) if adopted else None  # a zombie has one too: it waits for us
        self._lock = threading.Lock()  # one waiter reaps; another finds its code (as subprocess.Popen)

    @property
    def sentinel(self) -> int:
        """Readable once the child has exited (its exit code is there to read); valid until `close`, as a
        multiprocessing sentinel is (a number closed earlier could be another file's by the next wait on it)."""
        return self._pidfd if self._pidfd is not None else self._channel.fileno()

    def close(self) -> None:
        self._channel.close()
        if self._pidfd is not None:
            if self.returncode is None:
                with contextlib.suppress(ChildProcessError):  # reaped if it has ended: no zombie left behind
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            os.close(self._pidfd)
            self._pidfd = None

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, as subprocess.Popen.wait: TimeoutExpired where it has not ended within `timeout` (0
        included: a caller that then kills it, as stop_tree does, must learn that it still runs)."""
        import select

        if self.returncode is None and timeout is not None and not select.select([self.sentinel], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(self.args, timeout)
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            if self._pidfd is not None:
                try:
                    self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
                except ChildProcessError:  # reaped by someone else (SIGCHLD ignored here): how it ended is lost
                    self.returncode = -signal.SIGKILL
            else:
                try:
                    self.returncode = read_reply(self._channel)
                except (OSError, EOFError):  # the server died (its children die with it): as a SIGKILL
                    self.returncode = -signal.SIGKILL
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


MAX_SERVERS = 3  # start-up environments served at once by one process (each server holds its own torch)


_factories: list[Factory] = []  # this process's servers, the first one first


_factory_lock = threading.Lock()


def factory(env: Mapping[str, str] | None = None) -> Factory | None:
    """This process's warm server for a command with `env` (this process's by default): one whose start-up
    environment is that one's, started on first use (a warm child has its own clean copy for its own); None
    where warm starts are off, or this process already serves MAX_SERVERS others (then it starts cold)."""
    if not enabled():
        return None
    env = os.environ if env is None else env
    with _factory_lock:
        for f in _factories:
            if f.fits(env):
                return f
        if len(_factories) >= MAX_SERVERS:
            return None
        # This process's environment with the command's start-up part: the server carries nothing else of it.
        own = {k: v for k, v in os.environ.items() if k not in read_at_start(os.environ)}
        f = Factory(env={**own, **read_at_start(env)})
        _factories.append(f)
        return f


def server_pids() -> set[int]:
    """This process's warm servers: children that are none of its workers (the workers are theirs)."""
    return {pid for f in _factories if (pid := f.pid) is not None}


@contextlib.contextmanager
def using(f: Factory):
    """`f` is this process's first warm server for the block (a test's own, started with another environment);
    those started for other environments meanwhile are ended with it."""
    with _factory_lock:
        before = list(_factories)
        _factories[:] = [f]
    try:
        yield f
    finally:
        with _factory_lock:
            added, _factories[:] = _factories[1:], before
        for other in added:
            other.close()


def prestart(imports: Sequence[str] = ()) -> None:
    """Start the server for this process's environment now, to import (torch, and `imports`: the modules this
    process's children will import) while this process does other work."""
    f = factory()
    if f is not None:
        f.start(imports)


def emulated(argv: Sequence[str]) -> bool:
    """The commands a fork can run as exec would: this interpreter's `-m MODULE ...` and `-c CODE ...`, with
    no interpreter flags or this one's (spawn repeats them: -B where PYTHONDONTWRITEBYTECODE is set), alone or
    after `ip netns exec NAME` (a host of ddplab.launch.hosts) where this process may enter that namespace."""
    namespace, argv = split_namespace(argv)
    if namespace is not None and not can_enter(namespace):
        return False
    return len(argv) >= 3 and same_file(os.fsdecode(argv[0]), sys.executable) and command_of(argv) is not None


def inherited_environment() -> dict[str, str]:
    """What an exec'd child inherits where no environment is given: the C library's, which a library's setenv
    changes without os.environ knowing (readline, once loaded, sets LINES and COLUMNS)."""
    import ctypes

    try:
        entries = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):
        return dict(os.environ)
    found: dict[str, str] = {}
    i = 0
    while entries[i] is not None:
        name, _, value = os.fsdecode(entries[i]).partition("=")
        found.setdefault(name, value)
        i += 1
    return found


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def current_limits() -> dict[int, tuple[int, int]]:
    import resource

    return {
        getattr(resource, name): resource.getrlimit(getattr(resource, name))
        for name in dir(resource)
        if name.startswith("RLIMIT_") and name != "RLIMIT_NLIMITS"
    }


def ignored_signals() -> list[int]:
    """The signals this process ignores: an exec'd child keeps them ignored."""
    found = []
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(sig) == signal.SIG_IGN:
                found.append(int(sig))
    return found


def blocked_signals() -> list[int]:
    """This thread's blocked signals: an exec'd child keeps the mask."""
    return [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]


def popen(
    argv: Sequence[str],
    *,
    stdin=None,
    stdout=None,
    stderr=None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    session: bool = False,
    cpus: Sequence[int] = (),
    reset: Sequence[int] = (),
    imports: Sequence[str] = (),
) -> WarmProcess | None:
    """`argv` started warm where it can be, with stdin, stdout and stderr given as files or descriptors
    (None: this process's); `reset`: signals this process ignores that the child must not; `imports`: the modules
    the child will import (the server imports them first, once). None: start it cold (as subprocess.Popen, with
    the same arguments)."""
    env = inherited_environment() if env is None else env
    f = factory(env) if emulated(argv) else None
    if f is None:
        return None
    fds = {0: fd_of(stdin, 0), 1: fd_of(stdout, 1), 2: fd_of(stderr if stderr is not subprocess.STDOUT else stdout, 2)}
    return f.spawn(
        argv,
        env=env,
        cwd=cwd,
        fds=fds,
        session=session,
        mask=blocked_signals(),
        ignored=[s for s in ignored_signals() if s not in reset],
        cpus=cpus,
        imports=imports,
    )


def run(
    argv: Sequence[str],
    *,
    input: str | bytes | None = None,
    capture_output: bool = False,
    text: bool = False,
    errors: str | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    session: bool = False,
    stdout=None,
    stderr=None,
    reset: Sequence[int] = (),
    imports: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """subprocess.run's contract (these arguments), started warm where it can be, cold otherwise."""
    text = text or errors is not None

    def cold() -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv),
            input=input,
            capture_output=capture_output,
            text=text,
            errors=errors,
            timeout=timeout,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=session,
            **({} if capture_output else {"stdout": stdout, "stderr": stderr}),
        )

    env = inherited_environment() if env is None else env
    f = factory(env) if emulated(argv) else None
    if f is None:
        return cold()
    pipes: dict[int, tuple[int, int]] = {}
    if input is not None:
        pipes[0] = os.pipe()
    if capture_output:
        pipes[1], pipes[2] = os.pipe(), os.pipe()
    child_end = {n: (r if n == 0 else w) for n, (r, w) in pipes.items()}
    try:
        proc = popen(
            argv,
            stdin=child_end.get(0),
            stdout=child_end.get(1, stdout),
            stderr=child_end.get(2, stderr),
            env=env,
            cwd=cwd,
            session=session,
            reset=reset,
            imports=imports,
        )
    finally:
        for fd in child_end.values():
            os.close(fd)
    if proc is None:
        for n, (r, w) in pipes.items():
            os.close(w if n == 0 else r)
        return cold()
    return communicate(proc, pipes, input, (errors or "strict") if text else None, timeout)


def communicate(proc: WarmProcess, pipes: dict[int, tuple[int, int]], input, errors: str | None, timeout: float | None):
    """Feed stdin, drain stdout and stderr until the child ends (threads, as subprocess does where it must).
    `errors`: decode as text, as subprocess's text mode does (None: bytes)."""
    text = errors is not None
    got: dict[int, list[bytes]] = {1: [], 2: []}

    def drain(n: int, fd: int) -> None:
        with open(fd, "rb", closefd=True) as stream:
            got[n].append(stream.read())

    def feed(fd: int) -> None:
        with open(fd, "wb", closefd=True) as stream, contextlib.suppress(BrokenPipeError):
            stream.write(input.encode() if isinstance(input, str) else input)

    threads = [threading.Thread(target=drain, args=(n, pipes[n][0]), daemon=True) for n in (1, 2) if n in pipes]
    if 0 in pipes:
        threads.append(threading.Thread(target=feed, args=(pipes[0][1],), daemon=True))
    for thread in threads:
        thread.start()

    def output(n: int):
        if n not in pipes:
            return None
        data = b"".join(got[n])
        if not text:
            return data
        import locale  # as subprocess's text mode: the locale's encoding, universal newlines

        return (
            data.decode(locale.getpreferredencoding(False), errors or "strict")
            .replace("\r\n", "\n")
            .replace("\r", "\n")
        )

    try:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            for thread in threads:
                thread.join(1.0)
            raise subprocess.TimeoutExpired(proc.args, timeout or 0, output(1), output(2)) from None
    finally:
        proc.close()
    for thread in threads:
        thread.join()
    return subprocess.CompletedProcess(proc.args, code, output(1), output(2))


def fd_of(stream, default: int) -> int:
    if stream is None:
        return default
    if isinstance(stream, int):
        if stream == subprocess.DEVNULL:
            return _devnull()
        return stream
    return stream.fileno()


_devnull_fd: int | None = None


def _devnull() -> int:
    global _devnull_fd
    if _devnull_fd is None:
        _devnull_fd = os.open(os.devnull, os.O_RDWR)
    return _devnull_fd


def server_dies_with_parent() -> None:
    """In the server, before exec: the kernel kills it when its client dies (a SIGKILLed one included)."""
    set_parent_death_signal(signal.SIGKILL)

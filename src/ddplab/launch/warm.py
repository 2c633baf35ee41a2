"""Warm starts: processes forked from a server that imported torch once, instead of each importing it.

A `python -m ddplab ...` pays 4-6 s before its first line of work (torch, then torch._dynamo, which
torch.optim and DDP import), often more than a small run trains. The processes ddplab starts many of
(sweep points, DDP workers, the estimate's probe, the tests' CLI runs) are instead forked from a
server that imported those modules and did nothing else: no tensor op (so no thread pool), no CUDA.

A warm child is still a process of its own, made to look like a fresh `exec` of the same command:
its own session (where asked), signal dispositions and mask as exec leaves them, exit code, file
descriptors, environment, working directory, resource limits, CPU set and thread count; Python's own
state as a fresh interpreter has it (argv, `__main__`, sys.path[0], stdio, RNGs). What a fresh
interpreter would read from the environment at start-up or import (PYTHON*, LD_*, TORCH*, locale,
thread libraries; not OMP_NUM_THREADS and TORCH_CPP_LOG_LEVEL, which a child applies) cannot be given
to a fork: a command whose environment differs there from the server's starts cold, as does every
command that is not `python -m MODULE` or `python -c CODE` with this interpreter. Such a command
after `ip netns exec NAME` (a host of ddplab.launch.hosts) starts warm too where this process is root: the
child enters the namespace as ip would.

The server serves the process that started it alone, over a socketpair (nothing on the file system,
nothing another user could reach), and ends with it. Children report their exit code over a channel
of their own, which is their sentinel: a client polls a warm child as multiprocessing's forkserver
polls its children. `DDPLAB_WARM=0` turns it all off: every process starts cold, as before.

Linux only (fork, SCM_RIGHTS, SOCK_SEQPACKET); elsewhere, or where the server cannot start,
everything starts cold.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing import context as mp_context
from multiprocessing import popen_spawn_posix
from typing import Any

SWITCH = "DDPLAB_WARM"  # off (0, false, off, no): every process starts cold
# What the server imports: what every ddplab process imports before its first step.
IMPORTS = (
    "torch",
    "torch._dynamo",
    "torch.optim",
    "torch.distributed",
    "torch.distributed.elastic.multiprocessing",
    "torch.distributed.launcher.api",
    "torch.distributed.run",
    "torch.nn.parallel",
    "ddplab.cli",
    "ddplab.launch.elastic",
    "ddplab.engine.run",
    "ddplab.engine.probe",
)
# Environment read when an interpreter starts or torch, numpy and their libraries load: a fork cannot
# take another value of these. OMP_NUM_THREADS is applied to the child (torch.set_num_threads).
READ_AT_START = ("PYTHON", "LD_", "TORCH", "PYTORCH", "CUDA", "NVIDIA", "OMP_", "GOMP_", "KMP_", "MKL_",
                 "OPENBLAS_", "LC_", "LANG", "LOGLEVEL", "TRITON", "MALLOC_", "GLIBC_")  # fmt: skip
READ_LATER = ("TORCHELASTIC_", "TORCH_NCCL_", "OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")  # read when used, or applied
STARTED = struct.Struct("qq")  # a child's pid, and whether it is the client's own child (adopted: see `adopt`)
REPLY = struct.Struct("q")  # a child's exit code (negative: killed by that signal), for a child the server keeps
START_TIMEOUT_S = 120.0  # how long a request waits for a server still importing before starting cold


def enabled() -> bool:
    """Whether processes start warm: DDPLAB_WARM on (the default; 0, false, off or no turn it off) on Linux."""
    from ddplab.io.environment import switch

    return switch(SWITCH, True) and sys.platform == "linux" and hasattr(socket, "send_fds")


def read_at_start(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(READ_AT_START) and not k.startswith(READ_LATER)}


# --- the client side ----------------------------------------------------------------------------------


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

    def start(self) -> None:
        """Start the server now (it imports in the background), so that the first request finds it warm."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._channel is not None or self._broken:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._from_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self._server = subprocess.Popen(
                [
                    sys.executable,
                    *subprocess._args_from_interpreter_flags(),  # type: ignore[attr-defined]
                    "-c",
                    # -c puts the working directory first on sys.path: a ddplab/ or torch/ folder there would be
                    # imported in place of the real ones. Left out while the server imports, back for its children.
                    "import sys; first = sys.path.pop(0) if sys.path[:1] == [''] else None; "
                    f"from ddplab.launch.warm import serve_cold; serve_cold({theirs.fileno()}, first)",
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
        timeout_s: float = START_TIMEOUT_S,
    ) -> WarmProcess | None:
        """Fork `argv` from the server as exec would run it, with `fds` ({number in the child: descriptor
        here}, stdin/stdout/stderr among them); None where it must start cold (then nothing was started)."""
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
            "die_with_client": self._from_main_thread,
        }
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                self._start()
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


def read_reply(sock: socket.socket, kind: struct.Struct = REPLY) -> Any:
    data = b""
    while len(data) < kind.size:
        chunk = sock.recv(kind.size - len(data))
        if not chunk:
            raise EOFError("the warm server closed the channel")
        data += chunk
    values = kind.unpack(data)
    return values if len(values) > 1 else values[0]


class WarmProcess:
    """A warm child as its client sees it: subprocess.Popen's polling and signalling interface.

    `adopted`: the child is this process's own (see `adopt`), waited for here as subprocess waits for its
    children, through a pidfd; otherwise it is the server's, and the server says how it ended."""

    def __init__(self, pid: int, channel: socket.socket, args: list[str], *, adopted: bool = False):
        self.pid, self.args, self._channel = pid, args, channel
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid) if adopted else None  # a zombie has one too: it waits for us

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
                    if os.waitpid(self.pid, os.WNOHANG)[0]:
                        self.returncode = -signal.SIGKILL  # unknown, and no longer asked for
            os.close(self._pidfd)
            self._pidfd = None

    def poll(self) -> int | None:
        return self.wait(timeout=0)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            import select

            if timeout is not None and not select.select([self.sentinel], [], [], timeout)[0]:
                if timeout == 0:
                    return None  # type: ignore[return-value]  # poll's None, as subprocess.Popen.poll
                raise subprocess.TimeoutExpired(self.args, timeout)
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


def prestart() -> None:
    """Start the server for this process's environment now, to import while this process does other work."""
    f = factory()
    if f is not None:
        f.start()


def emulated(argv: Sequence[str]) -> bool:
    """The commands a fork can run as exec would: this interpreter's `-m MODULE ...` and `-c CODE ...`, with
    no interpreter flags or this one's (spawn repeats them: -B where PYTHONDONTWRITEBYTECODE is set), alone or
    after `ip netns exec NAME` (a host of ddplab.launch.hosts) where this process may enter that namespace."""
    namespace, argv = split_namespace(argv)
    if namespace is not None and not can_enter(namespace):
        return False
    return len(argv) >= 3 and same_file(os.fsdecode(argv[0]), sys.executable) and command_of(argv) is not None


NAMESPACES = "/var/run/netns"  # where `ip netns` keeps a namespace of each name (iproute2's NETNS_RUN_DIR)


def split_namespace(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """`ip netns exec NAME CMD...` as (NAME, CMD); any other command as (None, itself)."""
    args = [os.fsdecode(a) for a in argv]
    if len(args) > 4 and os.path.basename(args[0]) == "ip" and args[1:3] == ["netns", "exec"]:
        return args[3], args[4:]
    return None, args


def can_enter(namespace: str) -> bool:
    """Whether a child can do what `ip netns exec` does for it: root, the namespace there, and no per-namespace
    /etc files to bind over /etc (that, ip alone does)."""
    return (
        os.geteuid() == 0
        and "/" not in namespace
        and os.path.exists(os.path.join(NAMESPACES, namespace))
        and not os.path.exists(os.path.join("/etc/netns", namespace))
    )


def enter_namespace(namespace: str) -> None:
    """In a warm child, what `ip netns exec NAME` does before it execs (iproute2's netns_switch): join the
    network namespace, then a mount namespace of its own with a /sys that shows this network's interfaces."""
    import ctypes

    clone_newnet, clone_newns, ms_rec, ms_slave, ms_rdonly, mnt_detach = 0x40000000, 0x20000, 0x4000, 1 << 19, 1, 2
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what} for network namespace {namespace!r}: {os.strerror(err)}")

    fd = os.open(os.path.join(NAMESPACES, namespace), os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(fd, clone_newnet), "setns")
    finally:
        os.close(fd)
    check(libc.unshare(clone_newns), "unshare")
    check(libc.mount(b"", b"/", b"none", ms_slave | ms_rec, None), "mount --make-rslave /")
    flags = 0
    if libc.umount2(b"/sys", mnt_detach) != 0 and os.statvfs("/sys").f_flag & os.ST_RDONLY:
        flags = ms_rdonly  # as ip: a read-only /sys it could not detach stays read-only
    check(libc.mount(os.fsencode(namespace), b"/sys", b"sysfs", flags, None), "mount sysfs")


def command_of(argv: Sequence[str]) -> list[str] | None:
    """`argv` past the interpreter and its flags, from -m or -c on; None if it is no such command."""
    rest = [os.fsdecode(a) for a in argv[1:]]
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    if flags and rest[: len(flags)] == flags:
        rest = rest[len(flags) :]
    return rest if len(rest) >= 2 and rest[0] in ("-m", "-c") else None


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


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
) -> WarmProcess | None:
    """`argv` started warm where it can be, with stdin, stdout and stderr given as files or descriptors
    (None: this process's); `reset`: signals this process ignores that the child must not. None: start it
    cold (as subprocess.Popen, with the same arguments)."""
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


# --- the server side ----------------------------------------------------------------------------------


def server_dies_with_parent() -> None:
    """In the server, before exec: the kernel kills it when its client dies (a SIGKILLed one included)."""
    set_parent_death_signal(signal.SIGKILL)


def set_parent_death_signal(sig: int) -> None:
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG


def serve_cold(fd: int, first_path: str | None = None) -> None:
    """The server started by exec: import what every ddplab process imports, then serve. `first_path`: the
    sys.path entry -c had put first, left out for the imports (the working directory's modules are a
    command's own, never the server's), back in its place for the children, which set it as exec would."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the client; the server ends with it
    channel = socket.socket(fileno=fd)
    for name in IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (a module this machine cannot import: the child will, and say why)
            pass
    if first_path is not None:
        sys.path.insert(0, first_path)
    serve(channel)


def serve(channel: socket.socket) -> None:
    """Fork one child per request; tell each request's channel the child's pid, then its exit code. Ends when
    the client closes the channel. Single-threaded: a fork copies no thread but this one."""
    import select

    if "torch" in sys.modules and getattr(sys.modules["torch"].cuda, "is_initialized", lambda: False)():
        return  # never fork a process that holds CUDA (the child's CUDA would be broken): every request goes cold
    settle_fork_handlers()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    replies: dict[int, socket.socket] = {}
    started: dict[int, str | None] = {}  # the client's own children started here, with their start times
    client = os.getppid()  # an adopted child's parent
    while True:
        try:
            ready = select.select([channel.fileno(), wake_r], [], [])[0]
        except InterruptedError:
            continue
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            reap(replies)
        if channel.fileno() in ready:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(channel, 1 << 20, 256)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the client is gone: so are we, and the children it left (its own die with it)
                for fd in fds:
                    os.close(fd)
                stop_orphans(started)
                return
            request = pickle.loads(msg)
            reply = socket.socket(fileno=fds[-1])
            if select.select([reply], [], [], 0)[0]:  # its client stopped waiting (gave up on us): not started
                for fd in fds[:-1]:
                    os.close(fd)
                reply.close()
                continue
            adopted = bool(request.get("adopt"))
            pid = adopt() if adopted else -1
            if pid < 0:  # not asked, or the kernel refused: the server's own child, as before
                adopted, pid = False, os.fork()
            if pid == 0:
                try:
                    become({**request, "adopted": adopted, "client": client}, fds[:-1])
                except BaseException:  # noqa: BLE001  (the child could not be made: say why where its stderr goes)
                    import traceback

                    with contextlib.suppress(Exception):
                        os.write(2, f"ddplab: warm start failed: {traceback.format_exc()}".encode())
                finally:
                    os._exit(70)
            for fd in fds[:-1]:
                os.close(fd)
            with contextlib.suppress(OSError):
                reply.sendall(STARTED.pack(pid, adopted))
            if adopted:  # the client waits for it itself
                reply.close()
                started[pid] = start_time(pid)
            else:
                replies[pid] = reply
            reap(replies)


def reap(replies: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply = replies.pop(pid, None)
        if reply is not None:
            with contextlib.suppress(OSError):
                reply.sendall(REPLY.pack(os.waitstatus_to_exitcode(status)))
            reply.close()


CLONE_PARENT = 0x00008000  # clone(2): the new process's parent is the caller's parent
SYS_CLONE = {"x86_64": 56, "aarch64": 220}  # clone's number where its first argument is the flags on both


def can_adopt() -> bool:
    """Whether this client can wait for a child the server starts for it (os.pidfd_open: Python 3.9, Linux 5.3)."""
    global _can_adopt
    if _can_adopt is None:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _can_adopt = os.uname().machine in SYS_CLONE
        except (AttributeError, OSError):
            _can_adopt = False
    return _can_adopt


_can_adopt: bool | None = None


def adopt() -> int:
    """Fork as os.fork does, but with the new process the client's own child (clone with CLONE_PARENT): a server
    that dies (the OOM killer's pick, a SIGKILL) takes none of the runs it started with it, and the client waits
    for them as for any child. The interpreter's own fork steps run around it as os.fork runs them (the server is
    single-threaded, as any fork needs). -1 where the kernel refuses or a thread runs here (then os.fork)."""
    import ctypes

    if len(os.listdir("/proc/self/task")) != 1:  # a library's threads, whose fork handlers clone(2) would skip
        return -1
    api = ctypes.pythonapi  # holds the GIL across each call: the child starts holding it, as after os.fork
    libc = ctypes.CDLL(None, use_errno=True)
    api.PyOS_BeforeFork()
    pid = libc.syscall(SYS_CLONE[os.uname().machine], CLONE_PARENT | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        api.PyOS_AfterFork_Child()
    else:
        api.PyOS_AfterFork_Parent()
    return pid


def settle_fork_handlers() -> None:
    """One fork, at once reaped, before the server serves: the libraries' fork handlers run in it as they do around
    any fork (OpenBLAS, which numpy starts with a thread pool at import, stops its threads, and they start again
    only for a BLAS call, which the server never makes). The server is then single-threaded, so `adopt`'s clone,
    which runs no library's fork handler, copies no library state that a later fork in the child would wait on."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def start_time(pid: int) -> str | None:
    """A process's start time (/proc/PID/stat field 22): with the pid, it names one process, never a later one."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


def stop_orphans(started: dict[int, str | None]) -> None:
    """SIGTERM to the client's children started here that are still running once the client is gone: those whose
    parent-death signal could not follow it (a server started by another thread than its main one)."""
    for pid, when in started.items():
        if when is not None and start_time(pid) == when:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


def become(request: dict, fds: list[int]) -> None:
    """In the forked child: turn into the process `exec(request["argv"])` would have made, run it, exit."""
    signal.set_wakeup_fd(-1)
    if request["session"]:
        os.setsid()
    if not request["adopted"]:
        set_parent_death_signal(signal.SIGTERM)  # dies with the server, which dies with its client
    elif request["die_with_client"]:  # the client's own child: dies with it, and never outlives it unseen
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != request["client"]:  # it died before the line above: nothing will wait for us
            os._exit(128 + signal.SIGTERM)
    install_fds(dict(zip(request["targets"], fds, strict=True)))
    if request["namespace"] is not None:
        try:
            enter_namespace(request["namespace"])
        except OSError as exc:  # said on the command's own stderr, and ended, as `ip netns exec` would
            os.write(2, f'setting the network namespace "{request["namespace"]}" failed: {exc.strerror}\n'.encode())
            os._exit(255)
    os.umask(request["umask"])
    apply_limits(request["limits"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    present_as(request["argv"], request["env"])
    if request["cpus"]:
        os.sched_setaffinity(0, request["cpus"])
    reset_signals(request["ignored"], request["mask"])
    if not fresh_interpreter_state():  # a fork cannot be made what exec would make: exec it, then
        os.execv(request["argv"][0], request["argv"])
    if launches_workers(request["argv"]):
        fork_own_server()
    code = run_command(request["argv"])
    if code < 0:  # an uncaught KeyboardInterrupt: the interpreter ends by the signal itself
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    os._exit(code)


def present_as(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """/proc/PID/cmdline and /proc/PID/environ as an exec'd child's (what ps, pgrep -f and a search for a
    process by its environment read), where the kernel lets this process say so (PR_SET_MM_MAP: Linux 3.18+
    with checkpoint/restore); elsewhere they stay the server's."""
    import ctypes

    global _presented
    try:
        stat = open("/proc/self/stat").read()
        fields = stat[stat.rindex(")") + 2 :].split()

        def field(n: int) -> int:  # proc(5)'s 1-based numbering; the list starts at field 3
            return int(fields[n - 3])

        args = b"".join(os.fsencode(a) + b"\0" for a in argv)
        environ = b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())
        _presented = [ctypes.create_string_buffer(args, len(args)), ctypes.create_string_buffer(environ, len(environ))]
        a, e = (ctypes.addressof(b) for b in _presented)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sbrk.restype = ctypes.c_void_p
        mm_map = struct.pack(
            "11QQII",  # struct prctl_mm_map: code, data, brk, stack, args, env; no auxv; exe_fd -1 (kept)
            field(26), field(27), field(45), field(46), field(47), libc.sbrk(0), field(28),
            a, a + len(args), e, e + len(environ), 0, 0, 0xFFFFFFFF,
        )  # fmt: skip
        buf = ctypes.create_string_buffer(mm_map, len(mm_map))
        ulong = ctypes.c_ulong
        libc.prctl(ctypes.c_int(35), ulong(14), ulong(ctypes.addressof(buf)), ulong(len(mm_map)), ulong(0))
    except (OSError, ValueError, AttributeError, IndexError):
        pass


_presented: list = []  # the buffers /proc now reads: kept for the life of the process


def launches_workers(argv: Sequence[str]) -> bool:
    """Commands that may start processes of their own (a DDP launcher, the link measurement)."""
    return (command_of(argv) or [])[:2] == ["-m", "ddplab"] and any(a in ("train", "plan", "sweep") for a in argv[3:])


def fork_own_server() -> None:
    """A clean copy of this process, taken before the command runs anything, as its own warm server: its
    workers fork from it into its process group and session, and die with it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            set_parent_death_signal(signal.SIGKILL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # holds no pipe of the command's open (a reader waits for every writer's end)
                os.dup2(null, fd)
            serve(theirs)
        finally:
            os._exit(0)
    theirs.close()
    _factories[:] = [Factory(channel=ours, env=os.environ, pid=pid)]


def install_fds(targets: dict[int, int]) -> None:
    """Each received descriptor at the number the child expects, every other one closed (as close_fds)."""
    high = max([*targets, *targets.values(), 2]) + 1  # staged above both: no target overwrites one not yet moved
    staged = {target: os.dup2(fd, high + i, inheritable=False) for i, (target, fd) in enumerate(targets.items())}
    for target, fd in staged.items():
        os.dup2(fd, target)
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in targets:
            with contextlib.suppress(OSError):
                os.close(int(name))


def apply_limits(limits: dict[int, tuple[int, int]]) -> None:
    import resource

    for which, (soft, hard) in limits.items():
        if resource.getrlimit(which) != (soft, hard):
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, (soft, hard))


def reset_signals(ignored: Sequence[int], mask: Sequence[int]) -> None:
    """Dispositions as exec leaves them (handlers back to default, ignored ones kept) and as Python then sets
    them (SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ ignored); the client's mask."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def fresh_interpreter_state() -> bool:
    """What a fresh interpreter would have and the server's does not: its own stdio objects on 0-2 (buffered
    as Python buffers them), RNGs seeded from the OS, torch's thread count and native log level from this
    environment. False where this torch cannot take the log level once loaded (the command must start cold)."""
    import io

    def stream(fd: int, mode: str, old):
        isatty, unbuffered = os.isatty(fd), bool(os.environ.get("PYTHONUNBUFFERED"))  # -u: never here
        raw = io.FileIO(fd, mode, closefd=False)
        layer: io.RawIOBase | io.BufferedIOBase = raw
        if mode == "r":
            layer = io.BufferedReader(raw)
        elif not unbuffered:
            layer = io.BufferedWriter(raw)
        return io.TextIOWrapper(
            layer,  # a raw writer where unbuffered, as Python's own stdio
            encoding=getattr(old, "encoding", None),
            errors=getattr(old, "errors", None),
            line_buffering=not unbuffered and (isatty or fd == 2),
            write_through=unbuffered,
        )

    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        fresh = stream(fd, mode, getattr(sys, f"__{name}__"))
        setattr(sys, name, fresh)
        setattr(sys, f"__{name}__", fresh)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fresh interpreter's global numpy RNG is seeded from the OS
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.default_generator.seed()  # a fresh interpreter's CPU generator is seeded from the OS (CUDA's are fixed)
        threads = os.environ.get("OMP_NUM_THREADS", "")
        n = int(threads) if threads.strip().isdigit() and int(threads) > 0 else len(os.sched_getaffinity(0))
        torch.set_num_threads(n)
        from ddplab import compat

        return compat.set_cpp_log_level(os.environ.get("TORCH_CPP_LOG_LEVEL", ""))
    return True


def run_command(argv: Sequence[str]) -> int:
    """Run `python -m MODULE ARGS` or `python -c CODE ARGS` in this process, end it as the interpreter would
    (non-daemon threads joined, atexit run, stdio flushed); its exit code."""
    import importlib.machinery
    import runpy
    import traceback
    import types

    flag, target, *args = command_of(argv) or argv[1:]
    code = 0
    main = types.ModuleType("__main__")  # a fresh one, as a fresh interpreter's (not the server's, with its names)
    main.__dict__.update(
        __builtins__=sys.modules["builtins"], __annotations__={}, __loader__=importlib.machinery.BuiltinImporter
    )
    sys.modules["__main__"] = main
    try:
        try:
            if flag == "-m":
                sys.argv = ["-m", *args]
                if not getattr(sys.flags, "safe_path", False):
                    sys.path[0] = os.getcwd()
                runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]  # python -m's own
            else:
                sys.argv = ["-c", *args]
                if not getattr(sys.flags, "safe_path", False):
                    sys.path[0] = ""
                exec(compile(target, "<string>", "exec"), main.__dict__)
        finally:
            threading_shutdown()
    except SystemExit as exc:
        code = exit_code_of(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001  (as the interpreter: the traceback, exit 1)
        traceback.print_exc()
        code = 1
    try:
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def threading_shutdown() -> None:
    import threading as t

    with contextlib.suppress(Exception):
        t._shutdown()  # type: ignore[attr-defined]


def exit_code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


# --- DDP workers: multiprocessing's spawn, forked from the server --------------------------------------

WARM_METHOD = "ddplab-warm"  # the elastic agent's start method for workers forked warm


def start_method() -> str:
    """The start method for the elastic agent: spawn's protocol with the worker forked from this process's
    warm server, where there is one; "spawn" otherwise."""
    if factory() is None:
        return "spawn"
    try:
        mp_context._concrete_contexts.setdefault(WARM_METHOD, WarmContext())  # type: ignore[attr-defined]
    except AttributeError:  # multiprocessing's internals differ: cold spawn
        return "spawn"
    return WARM_METHOD


class WarmPopen(popen_spawn_posix.Popen):
    """multiprocessing's spawn Popen whose child is forked from the warm server: the same command line,
    descriptors, preparation data and pickled process object as spawn's exec, so the child runs
    multiprocessing's own spawn_main as a spawned one would; polled through the server's channel."""

    _warm: WarmProcess | None = None

    def _launch(self, process_obj):
        import io
        from multiprocessing import reduction, resource_tracker, spawn, util

        f = factory()
        tracker_fd = resource_tracker.getfd()
        child_r, parent_w = os.pipe()
        cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
        proc = None
        try:
            if f is not None and emulated(cmd):
                prep = spawn.get_preparation_data(process_obj._name)
                fp = io.BytesIO()
                mp_context.set_spawning_popen(self)
                try:
                    reduction.dump(prep, fp)
                    reduction.dump(process_obj, fp)
                finally:
                    mp_context.set_spawning_popen(None)
                fds = {0: 0, 1: 1, 2: 2, **{fd: fd for fd in (*self._fds, tracker_fd, child_r)}}
                proc = f.spawn(cmd, env=os.environ, fds=fds, mask=blocked_signals(), ignored=ignored_signals())
            if proc is None:
                os.close(parent_w)
                return super()._launch(process_obj)
            self._warm, self.pid, self.sentinel = proc, proc.pid, proc.sentinel
            self.finalizer = util.Finalize(self, close_warm, (proc, parent_w))
            with open(parent_w, "wb", closefd=False) as out:
                out.write(fp.getbuffer())
        finally:
            os.close(child_r)

    def poll(self, flag=os.WNOHANG):
        if self._warm is None:
            return super().poll(flag)
        if self.returncode is None:
            self.returncode = self._warm.wait(timeout=0 if flag == os.WNOHANG else None)
        return self.returncode


def close_warm(proc: WarmProcess, parent_w: int) -> None:
    os.close(parent_w)
    proc.close()


class WarmSpawnProcess(mp_context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj):
        return WarmPopen(process_obj)


class WarmContext(mp_context.SpawnContext):
    _name = WARM_METHOD
    Process = WarmSpawnProcess

"""The server's side: import what every ddplab process imports, then fork one child per request, the client's own
child where the kernel allows it (`adopt`), and end with the client.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import signal
import socket
import sys
from collections.abc import Sequence

from ddplab.launch.warm.client import Factory, _factories
from ddplab.launch.warm.fresh import become, launches_workers, run_and_exit
from ddplab.launch.warm.protocol import CLONE_PARENT, IMPORTS, REPLY, STARTED, SYS_CLONE, set_parent_death_signal


def serve_cold(fd: int, first_path: str | None = None, imports: tuple[str, ...] = ()) -> None:
    """The server started by exec: import what every ddplab process imports and what its client handed in, then
    serve. `first_path`: the sys.path entry -c had put first, left out for the imports (the working directory's
    modules are a command's own, never the server's), back in its place for the children, which set it as exec
    would."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the client; the server ends with it
    channel = socket.socket(fileno=fd)
    load((*IMPORTS, *imports))
    if first_path is not None:
        sys.path.insert(0, first_path)
    serve(channel)


def load(names: Sequence[str]) -> bool:
    """Import each of `names` not imported yet; whether any now is. A module this machine cannot import is left to
    the child, which imports it again and says why (and is no reason to settle the fork handlers again)."""
    import importlib

    new = [name for name in names if name not in sys.modules]
    for name in new:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    return any(name in sys.modules for name in new)


def serve(channel: socket.socket) -> None:
    """Fork one child per request; tell each request's channel the child's pid, then its exit code. Ends when
    the client closes the channel. Single-threaded: a fork copies no thread but this one."""
    import select

    if "torch" in sys.modules and getattr(sys.modules["torch"].cuda, "is_initialized", lambda: False)():
        return  # never fork a process that holds CUDA (the child's CUDA would be broken): every request goes cold
    own_thread_id_field()  # found now, while a thread may still be started and joined
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
            if load(request.get("imports", ())):  # a caller's modules, once: its later children find them here
                settle_fork_handlers()  # an import may have started a library's threads: stop them before a clone
            adopted = bool(request.get("adopt")) and request.get("pid") == client  # a forked copy's: not its child
            pid = adopt() if adopted else -1
            if pid < 0:  # not asked, or the kernel refused: the server's own child, as before
                adopted, pid = False, os.fork()
            if pid == 0:
                try:
                    become({**request, "adopted": adopted, "client": client}, fds[:-1])
                    if launches_workers(request["argv"]):
                        fork_own_server()  # before the command runs anything: its workers fork from a clean copy
                    run_and_exit(request["argv"])
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


def adopt() -> int:
    """Fork as os.fork does, but with the new process the client's own child (clone with CLONE_PARENT): a server
    that dies (the OOM killer's pick, a SIGKILL) takes none of the runs it started with it, and the client waits
    for them as for any child. The interpreter's own fork steps run around it as os.fork runs them (the server is
    single-threaded, as any fork needs), and the kernel writes the child's thread id where the C library keeps it
    (CLONE_CHILD_SETTID, as the library's own fork does: `pthread_*(pthread_self())` must name the child's thread,
    not the server's). -1 where the kernel refuses, a thread runs here, or that place is not known (then os.fork)."""
    import ctypes

    tid_field = own_thread_id_field()
    if tid_field is None or len(os.listdir("/proc/self/task")) != 1:  # a library's threads: its fork handlers
        return -1
    api = ctypes.pythonapi  # each call holds the GIL; the clone's (through CDLL) is made with the server alone
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    flags = CLONE_PARENT | CLONE_CHILD_SETTID | signal.SIGCHLD
    ctid = ctypes.c_void_p(tid_field)
    api.PyOS_BeforeFork()
    if os.uname().machine == "aarch64":  # clone(flags, stack, parent_tid, tls, child_tid)
        pid = libc.syscall(SYS_CLONE["aarch64"], ctypes.c_ulong(flags), None, None, None, ctid)
    else:  # x86_64: clone(flags, stack, parent_tid, child_tid, tls)
        pid = libc.syscall(SYS_CLONE["x86_64"], ctypes.c_ulong(flags), None, None, ctid, None)
    if pid == 0:
        api.PyOS_AfterFork_Child()
    else:
        api.PyOS_AfterFork_Parent()
    return int(pid)


CLONE_CHILD_SETTID = 0x01000000  # clone(2): the kernel stores the child's thread id at child_tid, in the child


@functools.cache  # found once a process: the address of its main thread's id in the C library's thread block
def own_thread_id_field() -> int | None:
    """Where glibc keeps the calling thread's id (struct pthread's `tid`, which its pthread_* calls on
    pthread_self() read): the one offset from pthread_self() holding gettid() in this thread and in another
    thread's block alike; None where no single offset does (another C library: then no adoption)."""
    import ctypes
    import threading as t

    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_self.restype = ctypes.c_void_p
    span = 1024 // 4  # struct pthread's tid sits in its first kilobyte (720 bytes in on x86-64 glibc 2.36)

    def offsets() -> set[int]:
        base = libc.pthread_self()
        words = (ctypes.c_int32 * span).from_address(base)
        tid = t.get_native_id()
        return {i * 4 for i in range(span) if words[i] == tid}

    found: dict[str, set[int]] = {}
    try:
        found["main"] = offsets()
        other = t.Thread(target=lambda: found.__setitem__("other", offsets()))
        other.start()
        other.join()
        both = found["main"] & found.get("other", set())
        field = libc.pthread_self() + both.pop() if len(both) == 1 else None
    except (OSError, ValueError, AttributeError):
        field = None
    return field


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

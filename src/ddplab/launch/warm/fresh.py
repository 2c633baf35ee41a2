"""Becoming the process exec would have made: in the forked child, the descriptors, namespace, umask, limits,
working directory, environment, signal dispositions and mask, Python's own state (stdio, RNGs, argv,
`__main__`), then the command run and ended as the interpreter ends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import sys
from collections.abc import Mapping, Sequence

from ddplab import internals
from ddplab.launch.warm.protocol import command_of, enter_namespace, set_parent_death_signal


def become(request: dict, fds: list[int]) -> None:
    """In the forked child: turn into the process `exec(request["argv"])` would have made (the server then runs it:
    `run_and_exit`)."""
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


def run_and_exit(argv: Sequence[str]) -> None:
    """Run the command in this process and end it with its exit code, as the interpreter would."""
    code = run_command(argv)
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
                internals.run_module_as_main(target)  # python -m's own
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
        internals.run_exit_functions()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def threading_shutdown() -> None:

    with contextlib.suppress(Exception):
        internals.join_threads()


def exit_code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1

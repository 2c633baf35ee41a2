"""What a warm server and its clients agree on: the switch, what the server imports, what a fork cannot be
given (the start-up environment), the replies on the wire, network namespaces, and how a child is tied to
its client (adoption by clone's CLONE_PARENT, a parent-death signal).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ddplab import internals

SWITCH = "DDPLAB_WARM"  # off (0, false, off, no): every process starts cold


# What every server imports: torch's modules that every ddplab process imports before its first step. ddplab's own
# are handed in by the callers that start the children (`imports=`: the launcher its workers', the sweep its points'),
# so that this package, below them, names none of the layers above it.
IMPORTS = (
    "torch",
    "torch._dynamo",
    "torch.optim",
    "torch.distributed",
    "torch.distributed.elastic.multiprocessing",
    "torch.distributed.launcher.api",
    "torch.distributed.run",
    "torch.nn.parallel",
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


def read_reply(sock: socket.socket, kind: struct.Struct = REPLY) -> Any:
    data = b""
    while len(data) < kind.size:
        chunk = sock.recv(kind.size - len(data))
        if not chunk:
            raise EOFError("the warm server closed the channel")
        data += chunk
    values = kind.unpack(data)
    return values if len(values) > 1 else values[0]


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
    flags = internals.interpreter_flags()
    if flags and rest[: len(flags)] == flags:
        rest = rest[len(flags) :]
    return rest if len(rest) >= 2 and rest[0] in ("-m", "-c") else None


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def set_parent_death_signal(sig: int) -> None:
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG


CLONE_PARENT = 0x00008000  # clone(2): the new process's parent is the caller's parent


SYS_CLONE = {"x86_64": 56, "aarch64": 220}  # clone's number where its first argument is the flags on both


@functools.cache
def can_adopt() -> bool:
    """Whether this client can wait for a child the server starts for it (os.pidfd_open: Python 3.9, Linux 5.3)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return os.uname().machine in SYS_CLONE

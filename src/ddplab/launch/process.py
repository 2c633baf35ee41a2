"""One command run as its own process tree: logged, watched, timed, and stopped as a whole.

The sweep runs each of its runs this way, and the scripts and benchmarks their `ddplab train`
and `ddplab kernels` commands. A DDP run is a tree (the launcher and its workers): a timeout
or a Ctrl-C stops all of it, and the child dies with its parent (even a SIGKILLed one), so
nothing trains on unwatched. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddplab import errors, stops
from ddplab.launch import warm

POLL_S = 1.0  # how often `on_poll` is called while the child runs
STOP_GRACE_S = 30  # after SIGINT/SIGTERM, how long a tree may take to stop before SIGKILL
TIMED_OUT, INTERRUPTED = errors.TIMED_OUT, errors.Interrupted.exit_code  # a child stopped at its limit, or by a stop


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


def supervise(
    cmd: Sequence[str],
    log_path: Path,
    *,
    timeout_s: float | None = None,
    on_poll: Callable[[], object] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    poll_s: float = POLL_S,
    timeout_from: str = "",
    stop_signal: int = signal.SIGINT,
    grace_s: float = STOP_GRACE_S,
    warm_start: bool = True,
    imports: Sequence[str] = (),
) -> Finished:
    """Run `cmd` as its own process tree, its output appended to `log_path` (an earlier attempt's
    output stays, under a `$ command` line each), calling `on_poll` every `poll_s` and once at the end.

    `warm_start`: forked from this process's warm server where the command allows (ddplab.launch.warm); False for a
    process that starts one command only (a Slurm task), where a server would cost what it saves. `imports`: the
    modules the command imports, for the server to import once before it forks (warm.popen's).

    Past `timeout_s` the tree gets SIGTERM (exit TIMED_OUT, said in the log with `timeout_from`, the
    option that set it); a KeyboardInterrupt here (Ctrl-C, or SIGTERM made one) stops it with
    `stop_signal` (SIGINT: as Ctrl-C stops a run; srun wants SIGTERM), SIGKILL after `grace_s`: exit
    INTERRUPTED, for the caller to record before it stops too.
    """
    child = Child(
        cmd,
        log_path,
        timeout_s=timeout_s,
        env=env,
        cwd=cwd,
        timeout_from=timeout_from,
        warm_start=warm_start,
        imports=imports,
    )
    try:
        while (done := child.poll(wait_s=poll_s)) is None:
            if on_poll is not None:
                on_poll()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM here: stop the tree as Ctrl-C stops a run
        done = stop_all([child], stop_signal, grace_s)[0]
    if on_poll is not None:
        on_poll()
    return done


class Child:
    """A command started as its own process tree (own session, dies with its parent, optionally held
    to some CPU cores), polled by its owner, which may run several at once (a parallel sweep)."""

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: Path,
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout_from: str = "",
        cpus: Sequence[int] = (),
        warm_start: bool = True,
        imports: Sequence[str] = (),
    ):
        self.command = [str(part) for part in cmd]
        self.log_path, self.timeout_s, self.timeout_from, self.cpus = (
            Path(log_path),
            timeout_s,
            timeout_from,
            tuple(cpus),
        )
        self.start = time.perf_counter()
        self.kill_at: float | None = None  # past its timeout: when SIGKILL follows the SIGTERM
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "a", errors="surrogateescape")  # a path of bytes that are not UTF-8 as it is
        self.log.write(f"\n$ {' '.join(self.command)}\n")
        self.log.flush()
        # Forked warm where it can be (ddplab.launch.warm: the same process an exec would make, without the imports).
        warmed = warm_start and warm.popen(
            self.command,
            stdout=self.log,
            stderr=self.log,
            env=env,
            cwd=cwd,
            session=True,
            cpus=self.cpus,
            reset=(signal.SIGINT, signal.SIGTERM),
            imports=imports,
        )
        self.proc: subprocess.Popen | warm.WarmProcess = warmed or subprocess.Popen(
            self.command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            preexec_fn=self.before_exec if sys.platform == "linux" else None,
        )

    def before_exec(self) -> None:
        die_with_parent()
        # A command started in the background by a script inherits SIGINT ignored (and a child keeps what its
        # parent ignored across exec): the child's stop signals are its own again, or stopping it would wait
        # out the grace and end in SIGKILL.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self, wait_s: float = 0.0) -> Finished | None:
        """Its outcome once it has exited (waiting up to `wait_s` for that), None while it runs; past its
        timeout the tree is stopped with SIGTERM first."""
        try:
            code = self.proc.wait(timeout=wait_s) if wait_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        now = time.perf_counter()
        if code is None and self.timeout_s is not None and now - self.start > self.timeout_s:
            if self.kill_at is None:  # SIGTERM now; SIGKILL on a later poll if the tree is still there
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                self.kill_at = now + STOP_GRACE_S
                source = f" ({self.timeout_from})" if self.timeout_from else ""
                self.log.write(
                    f"\nddplab: error: the command did not finish within {self.timeout_s:g} s{source}; stopped\n"
                )
                self.log.flush()
            elif now > self.kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        if code is None:
            return None
        return self.finished(TIMED_OUT if self.kill_at is not None else code)

    def finished(self, code: int) -> Finished:
        self.log.close()
        if isinstance(self.proc, warm.WarmProcess):
            self.proc.close()  # its channel to the server (a subprocess.Popen holds no descriptor once waited)
        return Finished(code, time.perf_counter() - self.start, self.log_path, self.command)


def stop_all(children: Sequence[Child], sig: int = signal.SIGINT, grace_s: float = STOP_GRACE_S) -> list[Finished]:
    """Stop every child's tree as Ctrl-C stops a run (all signalled at once, then each given what is left
    of one grace before SIGKILL); each comes back INTERRUPTED, unless it had exited on its own before (its
    own code, a failure included). A second Ctrl-C or SIGTERM meanwhile is ignored: the trees are being
    stopped, and what became of each is still recorded."""
    with stops.ignored():
        exited = {id(child): child.proc.poll() for child in children}
        for child in children:
            if exited[id(child)] is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, sig)
        deadline = time.monotonic() + grace_s
        for child in children:
            stop_tree(child.proc, sig, grace_s=max(deadline - time.monotonic(), 0.0), signalled=True)
        return [child.finished(INTERRUPTED if (code := exited[id(child)]) is None else code) for child in children]


def wait_any(children: Sequence[Child], timeout_s: float) -> None:
    """Return when one of `children` has exited, or after `timeout_s`: a pidfd per child where the
    system has them (Linux 5.3+), else a short sleep."""
    fds = []
    try:
        for child in children:
            fds.append(os.pidfd_open(child.pid))
    except (AttributeError, OSError):  # no pidfd (or the child is already gone): poll soon
        for fd in fds:
            os.close(fd)
        time.sleep(min(timeout_s, 0.05))
        return
    try:
        select.select(fds, [], [], timeout_s)
    finally:
        for fd in fds:
            os.close(fd)


def die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGTERM if its parent dies (even by SIGKILL), so
    nothing trains on unsupervised. A run stops as SIGTERM stops it, resumable from its checkpoint."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not glibc: no such safety net, the child goes on
        pass


def stop_tree(
    proc: subprocess.Popen | warm.WarmProcess, sig: int, grace_s: float = STOP_GRACE_S, *, signalled: bool = False
) -> None:
    """Signal the child's whole process group (unless `signalled` already), then SIGKILL whatever is left
    after `grace_s`."""
    try:
        if not signalled:
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
    return text[text.rfind("\n$ ") + 1 :].strip().splitlines()[1:]

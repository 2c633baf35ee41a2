"""The one way tests run `python -m ddplab ...`: a process of its own, as a user's shell starts it.

Forked from this test process's warm server (ddplab.launch.warm) where it can be, so a test pays for what
the command does, not for importing torch again: the child is still its own process (session, exit
code, signals, output, /proc/PID/environ), and a warm start ends bit-identical to a cold one
(tests/unit/launch/test_warm.py). DDPLAB_WARM=0 runs every command cold.

A command still running shortly before its timeout is looked at before it is killed: every process of
it (found by a mark in its environment) with its state, kernel wait channel and, where py-spy is
installed (the test extra), every Python thread's stack. A hang on CI then says where it hung.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from ddplab.launch import warm

THREADS = {"OMP_NUM_THREADS": "1"}  # one core's work a command: the suite runs several at once
MARK = "DDPLAB_TEST_COMMAND"  # environment variable naming one command's processes
LOOK_BEFORE_S = 15.0  # how long before its timeout a still-running command is looked at


def ddplab_cli(
    *args,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    cwd=None,
    timeout: float = 300,
    module: str = "ddplab",
    input: str | None = None,
    errors: str = "strict",
) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS`, output captured as text; `env` over `base_env` (this process's by default).
    Past `timeout`: an AssertionError saying where each of its processes was."""
    mark = uuid.uuid4().hex
    full_env = {**(os.environ if base_env is None else base_env), **THREADS, **(env or {}), MARK: mark}
    looked: list[str] = []
    look = threading.Timer(max(timeout - LOOK_BEFORE_S, timeout * 0.9), lambda: looked.append(where_they_are(mark)))
    look.daemon = True
    look.start()
    try:
        return warm.run(
            [sys.executable, "-m", module, *map(str, args)],
            input=input,
            capture_output=True,
            errors=errors,
            timeout=timeout,
            env=full_env,
            cwd=cwd,
            session=True,
        )
    except subprocess.TimeoutExpired as exc:
        look.join()
        raise AssertionError(
            f"`{' '.join(map(str, args))}` did not finish within {timeout:g} s\n"
            f"{''.join(looked) or '(its processes were not looked at)'}\n"
            f"--- its stderr, the end ---\n{(exc.stderr or '')[-4000:]}"
        ) from None
    finally:
        look.cancel()


class Started:
    """A command started in the background, warm where it can be: subprocess.Popen's interface as the tests use
    it (pid, returncode, stdout and stderr pipes, poll, wait, send_signal, terminate, kill, communicate)."""

    def __init__(self, proc: warm.WarmProcess, pipes: dict[int, int], text: bool):
        self._proc, self.pid = proc, proc.pid
        mode = "r" if text else "rb"
        self.stdout = os.fdopen(pipes[1], mode) if 1 in pipes else None
        self.stderr = os.fdopen(pipes[2], mode) if 2 in pipes else None
        self._readers: list[threading.Thread] | None = None  # started by the first communicate
        self._read: dict[int, str | bytes] = {}

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._proc.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def terminate(self) -> None:
        self._proc.terminate()

    def kill(self) -> None:
        self._proc.kill()

    def communicate(self, timeout: float | None = None):
        """(stdout, stderr) once the command has ended and every writer closed them; TimeoutExpired as Popen's,
        past `timeout` (the pipes are still being read: a later call gets all of it)."""
        if self._readers is None:
            streams = [s for s in (self.stdout, self.stderr) if s is not None]
            self._readers = [threading.Thread(target=self._drain, args=(s,), daemon=True) for s in streams]
            for t in self._readers:
                t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._proc.wait(timeout)
        for t in self._readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():  # a process it left behind still holds the pipe open
                raise subprocess.TimeoutExpired(self._proc.args, timeout or 0.0)
        self._proc.close()  # its exit code is read: the channel it came on is done
        return self._read.get(1), self._read.get(2)

    def _drain(self, stream) -> None:
        with stream:
            self._read[1 if stream is self.stdout else 2] = stream.read()


def popen(argv, *, stdout=None, stderr=None, text: bool = False, env=None, cwd=None, session: bool = False):
    """subprocess.Popen(argv, ...) for the tests' background commands (`python -m ...`, also inside a host's
    `ip netns exec`): forked warm where it can be, cold otherwise. stdout/stderr: None, PIPE, STDOUT or a file."""
    pipes: dict[int, tuple[int, int]] = {}
    for n, stream in ((1, stdout), (2, stderr)):
        if stream is subprocess.PIPE:
            pipes[n] = os.pipe()
    child = {n: w for n, (_, w) in pipes.items()}
    out = child.get(1, stdout)
    err = (1 if out is None else out) if stderr is subprocess.STDOUT else child.get(2, stderr)
    try:
        proc = warm.popen(argv, stdout=out, stderr=err, env=env, cwd=cwd, session=session)
    except BaseException:
        for r, _ in pipes.values():
            os.close(r)
        raise
    finally:
        for w in child.values():
            os.close(w)
    if proc is None:
        for r, _ in pipes.values():
            os.close(r)
        return subprocess.Popen(
            argv, stdout=stdout, stderr=stderr, text=text, env=env, cwd=cwd, start_new_session=session
        )
    return Started(proc, {n: r for n, (r, _) in pipes.items()}, text)


def processes_marked(mark: str) -> list[int]:
    """Processes whose environment carries MARK=mark (a warm child shows its own environment there too)."""
    needle = f"{MARK}={mark}\0".encode()
    found = []
    for env_file in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in env_file.read_bytes() + b"\0":
                found.append(int(env_file.parent.name))
        except OSError:
            pass
    return sorted(found)


def where_they_are(mark: str) -> str:
    """Each process of one command: pid, parent, state, kernel wait channel, command line; and its Python
    stacks where py-spy is installed (it reads another process's memory: root, or ptrace allowed)."""
    spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    out = []
    for pid in processes_marked(mark):
        proc = Path(f"/proc/{pid}")
        try:
            stat = proc.joinpath("stat").read_text()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            wchan = proc.joinpath("wchan").read_text()
            cmdline = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out.append(f"--- pid {pid} (parent {ppid}) state {state} wchan {wchan or '-'}: {cmdline[:300]}\n")
        if spy:
            try:
                dump = subprocess.run(
                    [spy, "dump", "--native", "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    timeout=20,
                    errors="replace",
                )
                out.append(dump.stdout or dump.stderr)
            except (OSError, subprocess.TimeoutExpired) as exc:
                out.append(f"(py-spy: {exc})\n")
    return "".join(out) or "(no process of it was left)\n"

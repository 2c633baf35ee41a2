"""DDP workers forked warm: multiprocessing's spawn protocol (the same command line, descriptors and pickled
process object) with the worker forked from the launcher's warm server, as the elastic agent's start method.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from multiprocessing import context as mp_context

from ddplab import internals
from ddplab.launch.warm.client import WarmProcess, blocked_signals, emulated, factory, ignored_signals

WARM_METHOD = "ddplab-warm"  # the elastic agent's start method for workers forked warm


def start_method(imports: Sequence[str] = ()) -> str:
    """The start method for the elastic agent: spawn's protocol with the worker forked from this process's
    warm server, where there is one; "spawn" otherwise. `imports`: the modules the workers import (the
    launcher's entry point and what it runs), imported by the server once, before the first worker."""
    if factory() is None:
        return "spawn"
    if not internals.register_start_method(WARM_METHOD, WarmContext()):  # multiprocessing's internals differ
        return "spawn"
    WarmPopen.imports = tuple(imports)
    return WARM_METHOD


class WarmPopen(internals.spawn_popen()):  # type: ignore[misc]
    """multiprocessing's spawn Popen whose child is forked from the warm server: the same command line,
    descriptors, preparation data and pickled process object as spawn's exec, so the child runs
    multiprocessing's own spawn_main as a spawned one would; polled through the server's channel."""

    _warm: WarmProcess | None = None
    imports: tuple[str, ...] = ()  # the workers' modules (start_method's)

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
                prep = spawn.get_preparation_data(internals.process_name(process_obj))
                fp = io.BytesIO()
                mp_context.set_spawning_popen(self)
                try:
                    reduction.dump(prep, fp)
                    reduction.dump(process_obj, fp)
                finally:
                    mp_context.set_spawning_popen(None)
                fds = {0: 0, 1: 1, 2: 2, **{fd: fd for fd in (*self._fds, tracker_fd, child_r)}}
                proc = f.spawn(
                    cmd,
                    env=os.environ,
                    fds=fds,
                    mask=blocked_signals(),
                    ignored=ignored_signals(),
                    imports=self.imports,
                )
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
            self.returncode = self._warm.poll() if flag == os.WNOHANG else self._warm.wait()
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

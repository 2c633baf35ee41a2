"""Start a run: in this process, or as N workers through PyTorch's elastic launcher.

The elastic launcher is the engine behind torchrun: c10d rendezvous on `localhost:0` picks
its own free port (no find-free-port race, two runs on one machine never collide), a
failed worker brings the whole group down and, with `--max-restarts K`, back up from the
last checkpoint. A process already started by torchrun or srun runs as one worker.

Everything is decided before any worker exists, once (runplan.py): the config, the machine, the
run folder; the workers take the plan.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddplab import compat, errors, faults, internals, stops, topology
from ddplab.config import DistConfig, RunConfig
from ddplab.errors import Interrupted
from ddplab.io import environment
from ddplab.io.borders import shown
from ddplab.launch import tracked, warm, watchdog
from ddplab.rundir.runplan import RunPlan, as_worker, prepared

if TYPE_CHECKING:
    from ddplab.engine.worker import RunResult

SHUTDOWN_TIMEOUT_S = 5
WORKER_IMPORTS = ("ddplab.launch.elastic", "ddplab.engine.worker")  # a worker's: worker_main runs the engine
STORE_SLACK_S = 10  # a store call outwaits the watchdog's probe, so a lost host is said in the probe's words
# A membership that may change (--nnodes MIN:MAX): once MIN nodes have joined a round, how long it waits for more
# (torch's last call; its default is 30 s), and how often each node says it is alive (torch's 5 s): a node silent
# for 3 of these is dropped from the round it was in, which a round after its loss waits for.
LAST_CALL_S, KEEP_ALIVE_S, KEEP_ALIVE_TRIES = 30, 5, 3


def train(config: RunConfig) -> RunResult:
    """Train as configured and return the finished run (the Python API: `ddplab.train`). It goes the
    CLI's way: prepared once, then trained here or by the launcher's workers."""
    if not isinstance(config, RunConfig):  # a notebook's first guess (a path, a dict): the sentence it needs
        raise errors.ConfigError(
            f"train() takes a RunConfig, not {'None' if config is None else f'{type(config).__name__} {shown(config)}'}"
            ": build one with "
            "ddplab.config.build_config({'train': {'epochs': 2}, ...}) from a dict of sections, or "
            "build_config(ddplab.config.load_toml('config.toml')) from a file"
        )
    return launch(config, command=False)


def launch(config: RunConfig, *, saved: RunConfig | None = None, command: bool = True):
    """Run `config` the way it asks to be run (the CLI's `ddplab train` and the Python API's
    `ddplab.train`); returns the RunResult (rank 0's, when it has one). `saved`: the resumed run's
    config.toml, where the caller has read it already. `command`: this process is a command, whose
    single-process run stops on SIGTERM as on Ctrl-C, with one line; a Python caller (False) keeps
    its own signal handlers and gets Ctrl-C as KeyboardInterrupt."""
    with prepared(config, saved=saved) as plan:  # torch is imported after these checks: a refusal comes at once
        note = plan.nothing_to_do()
        if note is not None:  # a finished run folder is never rewritten
            from ddplab.engine.worker import finished_result

            print(f"ddplab: nothing to do: {note}", flush=True)
            return finished_result(plan.run_dir)
        if plan.place is None:  # the root of the run: a fault this run cannot fire is refused before anything starts
            faults.check_env(
                world_size=plan.config.world_size(),
                epochs=plan.config.train.epochs,
                steps=plan.config.most_steps_per_epoch(),
            )
        if plan.launches_workers():
            warm.prestart(WORKER_IMPORTS)  # a cold launcher's server imports torch while this process does
            result = launch_workers(plan, command=command)
        else:
            from ddplab.engine.worker import run

            if plan.place is not None or not command:
                result = run(plan)  # a worker's launcher stops it: SIGTERM keeps its default action
            else:
                with interrupts_said(plan.config):
                    result = run(plan)
        if result is not None:  # rank 0's process, or the launcher of its node
            tracked.report_to_tracker(result)
        return result


@contextlib.contextmanager
def interrupts_said(config: RunConfig):
    """A single process stops on SIGTERM or SIGHUP as on Ctrl-C (ddplab.stops), with the line and exit code
    (130) of a DDP run's launcher: a scheduler's SIGTERM (Slurm's time limit, a sweep) or a closed terminal's
    SIGHUP used to end it with 143 or 129 and nothing said. Its checkpoints stay, as the last finished epoch
    left them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; a Python caller's thread keeps KeyboardInterrupt
        return
    try:
        with stops.as_interrupts():
            yield
    except KeyboardInterrupt as exc:
        raise Interrupted(
            f"interrupted by {stops.name_of(exc)}; checkpoints are kept: continue with "
            f"ddplab train --out {config.output.out} --resume"
        ) from None


def launch_workers(plan: RunPlan, *, command: bool = True):
    """N workers through the elastic launcher; `command`: this process is the `ddplab` command, which the
    watchdog may end (never a Python caller's process)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from ddplab.distributed import route_address
    from ddplab.io.arguments import endpoint_parts

    config = plan.config
    d = config.dist
    static = d.rdzv_backend == "static"
    launch_config = compat.launch_config(
        min_nodes=d.min_nodes or d.nnodes,
        max_nodes=d.nnodes,
        nproc_per_node=d.nproc,
        # Every node of one run must present the same id: derive it from the shared endpoint.
        run_id=d.rdzv_id or (f"ddplab-{d.rdzv_endpoint}" if d.nnodes > 1 else str(uuid.uuid4())),
        rdzv_backend=d.rdzv_backend,
        rdzv_endpoint=d.rdzv_endpoint or "localhost:0",  # port 0: the store picks a free port itself
        rdzv_configs=(
            {"rank": d.node_rank, "timeout": d.timeout_s}
            if static
            else {
                **c10d_configs(d.rdzv_endpoint, d.timeout_s, patience_s(d) + STORE_SLACK_S),
                **(elastic_waits(d.timeout_s) if d.elastic() else {}),
            }
        ),
        local_addr=route_address(d.rdzv_endpoint) if d.nnodes > 1 else None,
        max_restarts=d.max_restarts,
        monitor_interval=0.1,
        # spawn's protocol, the worker forked from a warm server where one runs
        start_method=warm.start_method(WORKER_IMPORTS),
        # After Ctrl-C / SIGTERM, wait this long for the workers before the agent's SIGKILL
        # (torch 2.12+; older releases wait their fixed 30 s).
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        **({"signals_to_handle": compat.agent_signals_without_sigint()} if launcher_takes_sigint() else {}),
    )
    if not config.output.debug:
        quiet_elastic_logs()

    def interrupted_line(name: str) -> str:
        return (
            f"interrupted by {name}; every worker was stopped, checkpoints are kept: continue with "
            f"ddplab train --out {config.output.out} --resume"
        )

    timeout = f"dist.timeout_s={d.timeout_s}"
    guard = watchdog.Watchdog(
        grace_s=SHUTDOWN_TIMEOUT_S + 5,
        interrupted_line=interrupted_line,
        endpoint=endpoint_parts(d.rdzv_endpoint) if d.nnodes > 1 and d.rdzv_endpoint else None,
        timeout_s=patience_s(d),
        lost_line=lambda endpoint: lost_host_line(config, endpoint),
        unreached_line=lambda endpoint: unreached_line(endpoint, waited_text(d)),
    )
    guarded = watchdog.guarded(guard) if command else contextlib.nullcontext()
    with (
        sigint_only_for_the_launcher() as interrupted,
        stopped_workers_woken_to_die(),
        whole_spawns(),
        rounds_counted(),
        workers_store_of_their_own(d.elastic()),
        guarded,
    ):
        try:
            results = run_agent(launch_config, worker_main, plan.for_workers())
        except ChildFailedError as exc:
            raise worker_failure(exc, d.max_restarts) from None
        except SignalException as exc:  # Ctrl-C / SIGTERM: the agent has already stopped every worker
            raise Interrupted(interrupted_line("SIGINT" if interrupted else exc.sigval.name)) from None
        except KeyboardInterrupt as exc:  # a stop signal before the agent took the signals (its rendezvous)
            raise Interrupted(interrupted_line("SIGINT" if interrupted else stops.name_of(exc))) from None
        except RendezvousError as exc:
            formed = topology.ROUND in os.environ  # a round had formed: the run was under way (rounds_counted)
            raise rendezvous_failure(exc, d.rdzv_endpoint, d.nnodes, timeout, d.min_nodes, formed) from None
    return next((r for r in results.values() if r is not None), None)


def run_agent(launch_config: Any, entrypoint: Any, *args: Any) -> dict[int, Any]:
    """torch's elastic launcher run from this process, every result by global rank; the one way ddplab runs it.

    Its agent takes SIGINT, SIGTERM, SIGHUP and SIGQUIT for the run (raising SignalException) and never gives them
    back: here they are this process's own again however the launch ends (`stops.kept`), and a stop signal the
    agent took begins this command's stop, so that a second one is ignored as ddplab's own handlers ignore it."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.launcher.api import elastic_launch

    with stops.kept():
        try:
            return elastic_launch(launch_config, entrypoint)(*args)
        except SignalException:
            stops.begin()
            raise


def unreached_line(endpoint: str | None, timeout: str) -> str:
    return (
        f"cannot reach the rendezvous endpoint {endpoint} within {timeout} s: is ddplab running on the host "
        "that owns that address (node 0), and does this host have a route to it?"
    )


def rendezvous_failure(
    exc: Exception, endpoint: str | None, nnodes: int, timeout: str, min_nodes: int = 0, formed: bool = False
) -> errors.DdplabError:
    """One line for a rendezvous that never formed, that formed without this node (a timeout CountedRendezvous marked:
    the others train, this one waited for a round that never came), or whose store went away once it had
    (`formed`): which endpoint, what to check. `timeout`: the setting that bounded it and its value, as the user
    would spell it (dist.timeout_s=600). `min_nodes`: the fewest a membership that may change goes on with (0: all
    `nnodes`)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

    endpoint = endpoint or "this machine"
    if isinstance(exc, RendezvousConnectionError) and formed:
        return errors.TrainingError(
            f"the run's store at the rendezvous host {endpoint} (node 0) closed while the run was under way: the run "
            "ended there (node 0's own line says why) or its processes died; every process on this node was "
            "stopped, checkpoints are kept"
        )
    if isinstance(exc, RendezvousConnectionError):
        return errors.TrainingError(unreached_line(endpoint, timeout))
    if isinstance(exc, RendezvousTimeoutError) and getattr(exc, FORMED_WITHOUT, None):
        n = getattr(exc, FORMED_WITHOUT)
        return errors.TrainingError(
            f"a round of {n} of {nnodes} nodes formed at {endpoint} without this node, and no next round took it in "
            f"within {timeout} s: the nodes training take a waiting node in when they next check the rendezvous, "
            "unless they are ending the run or too loaded to answer in time; this node's processes were stopped: start "
            "the same command on it again to join (or, the run ended, with --resume on every node)"
        )
    if isinstance(exc, RendezvousTimeoutError) and 0 < min_nodes < nnodes:
        return errors.TrainingError(
            f"fewer than {min_nodes} of {nnodes} nodes (dist.min_nodes) joined the rendezvous at {endpoint} within "
            f"{timeout} s, and the time a lost node takes to be dropped: too few to go on; checkpoints are kept: "
            f"start the same command with --resume on at least {min_nodes} nodes"
        )
    if isinstance(exc, RendezvousTimeoutError):
        return errors.TrainingError(
            f"not all {nnodes} nodes joined the rendezvous at {endpoint} within {timeout} s: "
            f"start the same command on every node, each with --nnodes {nnodes} and --rdzv-endpoint {endpoint}"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no message"
    return errors.TrainingError(f"the rendezvous at {endpoint} failed ({type(exc).__name__}): {first}")


def waited_text(d: DistConfig) -> str:
    """How long a node waits for a silent rendezvous host, as the settings that make it."""
    return (
        f"dist.timeout_s={d.timeout_s}"
        if not d.max_restarts
        else f"{patience_s(d)} (dist.timeout_s={d.timeout_s}, and as long for each of {d.max_restarts} restart(s))"
    )


def lost_host_line(config: RunConfig, endpoint: str) -> str:
    return (
        f"lost the rendezvous host {endpoint}: no answer for {waited_text(config.dist)} s (a link or host down); "
        "every process on this node was stopped, checkpoints are kept: once it is back, run the same command "
        "with --resume on every node"
    )


def quiet_elastic_logs() -> None:
    """The agent logs every worker's traceback and each signal, and the process context each
    SIGTERM and SIGKILL it sends; the one-line root cause is enough.

    Its modules set their loggers' own levels (LOGLEVEL, default WARNING) when imported, so
    each one is quieted, not only their common parent.
    """
    import torch.multiprocessing.spawn  # noqa: F401  (its logger exists from here on)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def launcher_takes_sigint() -> bool:
    """Whether Ctrl-C can be kept from the workers (see `sigint_only_for_the_launcher`)."""
    return threading.current_thread() is threading.main_thread() and compat.elastic_signals_configurable()


@contextlib.contextmanager
def sigint_only_for_the_launcher():
    """Workers start with SIGINT blocked; Ctrl-C reaches the launcher alone, which stops them with SIGTERM.

    Ctrl-C goes to the whole foreground process group, and torch's spawn also sends each
    worker SIGINT when the launcher dies: a worker that gets it while still importing torch
    prints a KeyboardInterrupt traceback, or fails to unpickle its arguments because the
    launcher is tearing down. A blocked signal stays blocked across fork and exec, so
    workers spawned from this thread never see it. This process still gets it: a helper
    thread that does not block SIGINT receives it, and Python runs the handler in the main
    thread. The handler turns it into SIGTERM for the elastic agent, which is told to leave
    SIGINT alone (`compat.agent_signals_without_sigint`, torch 2.10+), and stops the workers with SIGTERM: they die
    at once, silently. (Were SIGINT among its signals, it would forward SIGINT, which the
    workers block, and SIGKILL them after its shutdown timeout.) Yields a list that holds
    True once Ctrl-C came. An orphaned worker ends itself (`watch_launcher`).
    """
    interrupted: list[bool] = []
    if not launcher_takes_sigint():
        yield interrupted  # the mask is per thread; older torch forwards SIGINT to the workers itself
        return
    from multiprocessing import resource_tracker

    # Started first: starting it later unblocks SIGINT again in this thread (CPython does that).
    resource_tracker.ensure_running()

    def on_sigint(signum, frame) -> None:
        interrupted.append(True)
        os.kill(os.getpid(), signal.SIGTERM)

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    receiver = threading.Event()
    threading.Thread(target=receiver.wait, name="ddplab-sigint-receiver", daemon=True).start()
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with environment.restored(compat.ELASTIC_SIGNALS_ENV):  # the agent exports its signals_to_handle there
            yield interrupted
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        signal.signal(signal.SIGINT, previous_handler)
        receiver.set()


@contextlib.contextmanager
def rounds_counted():
    """The agent's rendezvous handler, counting the rounds it joins into $DDPLAB_RDZV_ROUND for the workers it
    starts next (spawned workers inherit this process's environment): topology.group_attempt reads it.

    A fixed membership's nodes join every round once (a round forms only when all have joined), whatever made
    them re-join: their own workers' failure, or another node waiting (which torch's restart count leaves out);
    where nodes come and go, the rendezvous' own round is taken (CountedRendezvous). The launcher builds its
    handler through the registry's module function; where that is not so, this does nothing and the workers
    fall back on the restart count.
    """
    counting = internals.wrapped(*internals.rendezvous_handlers(), lambda make: lambda p: CountedRendezvous(make(p)))
    with environment.restored(topology.ROUND), counting:
        # One inherited from a launch around this one (a worker's environment) would say a round had formed here
        # before any did: a rendezvous that never formed would then be read as a store lost mid-run.
        os.environ.pop(topology.ROUND, None)
        yield


FORMED_WITHOUT = "ddplab_formed_without"  # on a rendezvous timeout: the nodes of a round formed without this node


class CountedRendezvous:
    """A rendezvous handler that says which round it joined (0 first) in $DDPLAB_RDZV_ROUND; the rest of the
    handler's interface is the wrapped one's (the agent calls it by name, never checks its class)."""

    def __init__(self, inner: Any):
        self.inner, self.rounds = inner, 0

    def next_rendezvous(self) -> Any:
        from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

        try:
            info = self.inner.next_rendezvous()
        except RendezvousTimeoutError as exc:  # say whether a round had formed without this node (rendezvous_failure)
            setattr(exc, FORMED_WITHOUT, internals.rendezvous_formed_without(self.inner))
            raise
        # The rendezvous' own round where it says it: a node that joins a membership that may change later than
        # the others has joined fewer rounds, and must still name the group as they do.
        shared = internals.rendezvous_round(self.inner)
        os.environ[topology.ROUND] = str(self.rounds if shared is None else shared)
        self.rounds += 1
        return info

    @property
    def use_agent_store(self) -> bool:
        return self.inner.use_agent_store

    def __getattr__(self, name: str) -> Any:  # get_backend, get_run_id, num_nodes_waiting, shutdown, ...
        return getattr(self.inner, name)


SHARED_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@contextlib.contextmanager
def workers_store_of_their_own(on: bool):
    """Each round's workers meet at a store of their own (their rank 0 hosts it), not the agents' shared one, where
    nodes may come and go: with the shared store, the agent that stays rank 0 across rounds writes the workers'
    address only at its first round, and a node that joins later waits for it until it times out (torch 2.13)."""
    with environment.restored(SHARED_STORE_OFF):
        if on:
            os.environ[SHARED_STORE_OFF] = "1"
        yield


@contextlib.contextmanager
def held_stop_signals():
    """Stop signals that land inside the block are held, and raised again (in order, once each) when it ends.

    Held in Python, not by a signal mask, which a worker spawned inside would inherit. One ignored stays ignored
    (nohup's SIGHUP): a worker spawned inside inherits it so, as from the launcher. Only the main thread can set
    handlers; elsewhere this holds nothing."""
    held: list[int] = []
    try:
        with stops.handled(stops.STOP_SIGNALS, lambda signum, frame: held.append(signum)):
            yield
    finally:
        for s in dict.fromkeys(held):
            os.kill(os.getpid(), s)


@contextlib.contextmanager
def whole_spawns():
    """A stop signal that lands while the workers are being spawned is held until every one has its arguments
    and the launcher holds them all.

    A spawned worker reads what to run from a pipe its launcher writes right after starting it.
    SIGTERM or SIGINT between the two (the agent's handler raises in the main thread) leaves the
    pipe closed unwritten: the worker printed an EOFError traceback under ddplab's one line. And
    between two workers' spawns the agent's handler raised before it held the group: the workers
    already started were never stopped, and one went on to print a FileNotFoundError traceback when
    the launcher's semaphores it unpickles were gone. Held (`held_stop_signals`) over each spawn and
    over the group's start, the signal is raised again once the agent holds every worker, which it
    then stops: each can die quietly. Where multiprocessing's or torch's internals differ, the
    missing part does nothing.
    """

    def holding(original):
        def held(*args, **kwargs):
            with held_stop_signals():
                return original(*args, **kwargs)

        return held

    with (
        internals.wrapped(*internals.spawn_launch(), holding),
        internals.wrapped(*internals.agent_start(), holding),
    ):
        yield


@contextlib.contextmanager
def stopped_workers_woken_to_die(poll_s: float = 0.2):
    """A worker frozen by SIGSTOP (a debugger, the OS, Ctrl-Z) that the agent has sent SIGTERM gets
    SIGCONT, so that it dies of that SIGTERM now.

    A stopped process hears nothing but SIGKILL and SIGCONT: the agent would wait out its
    shutdown timeout (30 s in torch's failure path, which ignores `shutdown_timeout`) before
    killing it. Only a worker with SIGTERM already pending is woken: it dies before running
    a line (workers keep SIGTERM's default action), so it can neither train on nor fail in
    words of its own that would be taken for the run's cause.
    """
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            for pid in watchdog.descendants(os.getpid()):  # workers forked warm are its warm server's children
                if stopped_with_sigterm_pending(pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)

    watcher = threading.Thread(target=watch, name="ddplab-stopped-workers", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def stopped_with_sigterm_pending(pid: int) -> bool:
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
    except OSError:
        return False
    pending = int(status.get("ShdPnd", "0").strip(), 16) | int(status.get("SigPnd", "0").strip(), 16)
    return status.get("State", "").strip().startswith("T") and bool(pending >> (signal.SIGTERM - 1) & 1)


def patience_s(d: DistConfig) -> int:
    """How long a node waits for a silent rendezvous host: dist.timeout_s, and as long again for each restart
    left, so that a link back within that window re-forms the group (the agent's store call just waits)."""
    return d.timeout_s * (1 + d.max_restarts)


def elastic_waits(timeout_s: int) -> dict[str, int]:
    """A round's waits where nodes may come and go, scaled to dist.timeout_s: a lost node is dropped within half
    of it, the last call for more nodes lasts up to half of it (30 s at most), and a node waits for the round its
    whole timeout on top of both (the round after a loss first waits for the lost node to be dropped)."""
    keep_alive = max(1, min(KEEP_ALIVE_S, timeout_s // (2 * KEEP_ALIVE_TRIES)))
    last_call = max(2, min(LAST_CALL_S, timeout_s // 2))
    return {
        "last_call_timeout": last_call,
        "keep_alive_interval": keep_alive,
        "keep_alive_max_attempt": KEEP_ALIVE_TRIES,
        "join_timeout": timeout_s + keep_alive * KEEP_ALIVE_TRIES + last_call,
    }


def c10d_configs(endpoint: str | None, timeout_s: int, store_timeout_s: int | None = None) -> dict:
    """The rendezvous's waits, bounded by dist.timeout_s, and whether this node hosts its store.

    Nodes wait for each other to join, and for the store to answer, for at most `timeout_s`
    (torch's defaults: 600 s and 60 s): node 0, which hosts the store, may start minutes after
    the others. A store request across a link that dies meanwhile is the watchdog's business.

    The node that owns the endpoint's address hosts the store. PyTorch recognizes the host
    by its hostname only, so a node reached through another interface (a second NIC, a
    network namespace) would wait for a store nobody starts. Being able to bind the address
    is the test that it is ours.
    """
    waits = {"join_timeout": timeout_s, "read_timeout": store_timeout_s or timeout_s}
    if endpoint is None:
        return waits
    from ddplab.io.arguments import endpoint_parts

    host = endpoint_parts(endpoint)[0]
    try:  # where PyTorch already recognizes the host, keep its fallback for shared machines
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

        if _matches_machine_hostname(host):
            return waits
    except ImportError:
        pass
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
    except OSError:
        return waits
    return {**waits, "is_host": True}


def worker_main(launcher_plan: RunPlan):
    """The body of each spawned worker (module-level, so spawn can import it)."""
    from ddplab.engine.worker import run

    # A worker stopped by its agent is usually blocked in a collective, where a Python-level
    # handler never runs; the default action ends it at once (checkpoints are atomic).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    watch_launcher()
    try:
        with as_worker(launcher_plan) as plan:
            result = run(plan)
    except OSError as exc:  # as the CLI reports it, and with its class name the launcher maps to exit code 5
        raise errors.file_error(exc, "use") from None
    return result if result is not None and int(os.environ.get("RANK", "0")) == 0 else None


def watch_launcher(poll_s: float = 0.5) -> None:
    """End this worker at once, silently, if the launcher that spawned it dies (SIGKILL, OOM killer).

    An orphaned worker would otherwise train on alone, or fail in its next collective with a
    traceback on the user's terminal. Its exit code no longer reaches anyone.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="ddplab-launcher-watch", daemon=True).start()


_ERROR_TYPES = {
    cls.__name__: cls for cls in (errors.ConfigError, errors.DataError, errors.TrainingError, errors.FileSystemError)
}


ROOT_CAUSE_WINDOW_S = 2  # failures this close to the first count as one event


def root_failure(failures: dict) -> tuple[int, Any]:
    """The failed rank that caused the others: among the failures of the first moment, one that
    recorded an exception before one that merely died.

    When a rank raises, its peers often die in the collective they were waiting in (Gloo aborts
    the process: SIGABRT) within the same second, and the agent's timestamps are whole seconds
    (a death's is when the agent noticed it): its own "first failure" then picks the lowest
    rank, the collateral one. A death well before any exception (an OOM kill) stays the cause.
    """
    first = min(f.timestamp for f in failures.values())
    moment = [r for r, f in failures.items() if f.timestamp - first <= ROOT_CAUSE_WINDOW_S]

    def key(rank):
        failure = failures[rank]  # an exception leaves an error file (torch elastic's @record); a signal none
        return (not os.path.isfile(str(failure.error_file)), failure.timestamp, rank)

    rank = min(moment, key=key)
    return rank, failures[rank]


def worker_failure(exc, max_restarts: int) -> errors.DdplabError:
    """One line naming the failed rank that caused the rest and its cause, keeping the error's exit code."""
    rank, failure = root_failure(exc.failures)
    raw = failure.message
    message = raw.get("message", "") if isinstance(raw, dict) else str(raw)
    match = re.match(r"^(\w+): (.*)$", message, re.S)
    cls: type[errors.DdplabError]
    cls, text = errors.TrainingError, message
    if match and match.group(1) in _ERROR_TYPES:
        cls, text = _ERROR_TYPES[match.group(1)], match.group(2)
    elif failure.exitcode < 0:
        text = f"killed by signal {failure.signal_name()} (exit code {failure.exitcode})"
    restarts = f" after {max_restarts} restart(s)" if max_restarts else ""
    return cls(f"worker rank {rank} failed{restarts}: {text.strip().splitlines()[0] if text.strip() else 'no message'}")

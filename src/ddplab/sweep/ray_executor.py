"""A sweep on a Ray cluster: each point a Ray task asking for what its workers need, placed where it fits.

`ddplab sweep FILE --executor ray` connects to the cluster at `--ray.address`, else `$RAY_ADDRESS`, else a local Ray
it starts and stops itself (said in one line); `--ray.address auto` joins the cluster this node is part of. A
cluster that cannot be reached, or Ray not installed, is one line before anything is written. Every unfinished point
becomes a task that asks for its CPUs (its workers x their threads) and its GPUs (one a worker on CUDA), so the
cluster runs as many at once as fit (`--parallel N` caps them): the task runs the point's `ddplab train` through
point.py on the node Ray picks, the command the local executor runs, its output appended to the point's log. The
sweep folder must be one every node sees (a shared file system, as for Slurm): each node is asked before anything is
written. This process stays connected while the points run: their epochs are shown as they land, each outcome
recorded in the manifest as its task ends; Ctrl-C or SIGTERM cancels every task (each point stopped resumable, as a
local one is) and leaves no process behind. A point across N nodes is a placement group of N bundles on N distinct
nodes (STRICT_SPREAD), each bundle what one node's workers ask: the first bundle's task picks the rendezvous (its
node's address, a free port) and starts one task in each other bundle, and every node runs the command a user would
run there by hand (`ddplab train ... --node-rank R --rdzv-endpoint HOST:PORT`), not a port to Ray Train. A node lost
under a point (its raylet or link gone) ends the point resumable, naming the node, within the run's dist.timeout_s
and Ray's own health checks. Torch-free; Ray only when used.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ddplab import runfiles, stops
from ddplab.config import RunConfig
from ddplab.errors import ConfigError
from ddplab.process import INTERRUPTED, STOP_GRACE_S
from ddplab.runlock import run_lock
from ddplab.sweep.estimate import duration
from ddplab.sweep.folder import Entry, Manifest, Status, SweepFolder
from ddplab.sweep.point import Node, Outcome, Point
from ddplab.sweep.spec import Sweep, SweepRun

ADDRESS_ENV = "RAY_ADDRESS"
CONNECT_TIMEOUT_S = 5.0  # an address that does not answer a TCP connect in this long is not a cluster (Ray waits 60 s+)
POLL_S = 1.0
SEE_TIMEOUT_S = 120.0  # each node's answer whether it sees the sweep folder (a cold node starts a worker first)
CANCEL_GRACE_S = STOP_GRACE_S + 15.0  # cancelled tasks' runs stop resumable (or are killed) before Ray shuts down
INSTALL = "pip install 'ddplab[ray]'"


def resources(config: RunConfig, node_gpus: int) -> dict[str, float]:
    """What one point's task asks the cluster for: a CPU for each thread of each worker (one thread a worker
    unless train.threads says; Ray gives the task OMP_NUM_THREADS to match, so the run uses what it asked for and
    points side by side never share cores), and the GPUs the local executor would give it on a node of
    `node_gpus` (slots.gpus_needed: none on a cluster without GPUs, whatever the device says)."""
    from ddplab.sweep.slots import gpus_needed

    workers = config.dist.nproc if config.dist.strategy == "ddp" else 1
    return {
        "num_cpus": float(workers * (config.train.threads or 1)),
        "num_gpus": float(gpus_needed(config, node_gpus)),
        "max_retries": 0,  # a task whose worker died is the sweep's to record, resumable: never re-run behind it
    }


RAY_SETS = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")  # what Ray sets in a task's worker for the task's resources


def node_name() -> str:
    """How a line names the node a task runs on: its host name and the address Ray knows it by."""
    import ray

    return f"{socket.gethostname()} ({ray.util.get_node_ip_address()})"


@dataclass(frozen=True)
class Task:
    """What a point's task carries to its node: plain values (Ray pickles them), the point rebuilt there."""

    root: str  # the sweep folder, as every node sees it
    name: str
    config: dict[str, Any]  # RunConfig.to_dict()
    launch: str
    env: dict[str, str]
    cwd: str  # the sweep's working directory: a relative data root means there what it meant to the sweep

    def point(self) -> Point:
        from ddplab.config import build_config

        return Point(SweepFolder(Path(self.root)), self.name, build_config(self.config), self.launch)


def run_point(task: Task, node: Node | None = None) -> tuple[Outcome, str]:
    """In the task, on whichever node Ray placed it: the point's `ddplab train` (`node`: this node's part of a point
    across nodes), from the sweep's working directory, and its outcome. A cancel (Ray raises KeyboardInterrupt
    here) stops the run as Ctrl-C does, resumable."""
    if os.path.isdir(task.cwd):
        os.chdir(task.cwd)
    env = {**task.env, **{k: os.environ[k] for k in RAY_SETS if k in os.environ}}  # the GPUs and threads Ray gave
    point = task.point()
    where = node_name()
    # Ray cancels a running task with SIGINT. A worker of a Ray started from a sweep with SIGINT ignored (nohup, a
    # script's background job) inherits it ignored, and its thread blocks it: the cancel would never arrive, nor
    # the Ctrl-C that stops the run resumable (a child inherits both). For the run, SIGINT is Ctrl-C's again.
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, stops.STOP_SIGNALS)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = point.run(env, warm=True, node=node)  # a Ray worker runs many tasks: its server's torch serves each
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return point.ended(done), where


def run_across_nodes(task: Task, group: Any, ask: dict[str, float]) -> tuple[Outcome, str]:
    """In the first bundle's task of a point across nodes: the rendezvous on this node (its address, a free port),
    one task in each other bundle running that node's part, this node's own part, then every node's outcome.
    The point's outcome is this node's (rank 0's node writes the summary); a node Ray lost under it makes it
    resumable, named. A cancel reaches every node's task (Ray cancels a task's own tasks with it)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    point = task.point()
    host = ray.util.get_node_ip_address()
    endpoint = f"{'[' + host + ']' if ':' in host else host}:{free_port(host)}"
    resume = point.resumes()  # every node resumes, or none does
    remote = ray.remote(run_point)
    others = [
        remote.options(
            **ask, scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
        ).remote(task, Node(rank, endpoint, resume))
        for rank in range(1, point.config.dist.nnodes)
    ]
    outcome, first = run_point(task, Node(0, endpoint, resume))
    where, lost = [first], []
    for rank, ref in enumerate(others, 1):
        try:
            where.append(ray.get(ref)[1])
        except ray.exceptions.TaskCancelledError:  # cancelled before it started: nothing ran there
            pass
        except ray.exceptions.RayTaskError as exc:  # the task's own error: the node is fine
            where.append(f"node {rank}: {(str(exc.cause or exc).strip().splitlines() or ['?'])[-1][:200]}")
        except ray.exceptions.RayError as exc:  # its worker or node died under it
            lost.append(f"node {rank} ({bundle_node(ray, group, rank)}) lost: {first_line(exc)}")
    if lost and outcome.status is not Status.FINISHED:
        outcome = Outcome(Status.INTERRUPTED, outcome.exit_code, "; ".join(lost), outcome.wall_s)
    return outcome, ", ".join(where)


def folder_identity(path: str) -> int | None:
    """On a node: the inode of `path` as this node sees it (a shared file system shows every node the same one), or
    None where it is not a folder here."""
    return os.stat(path).st_ino if os.path.isdir(path) else None


def refuse_nodes_that_cannot_see(ray: Any, root: Path) -> None:
    """Every node must see the sweep folder (its points' run folders, logs and the manifest are there): a node that
    does not, or sees another folder at its path, is one line before anything is written. The folder may not exist
    yet: its nearest existing parent is what every node must see as this machine does."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    seen = root.resolve()
    while not seen.is_dir() and seen != seen.parent:
        seen = seen.parent
    here = folder_identity(str(seen))
    ask = ray.remote(folder_identity)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    answers = [
        ask.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(seen)
        )
        for n in nodes
    ]
    ray.wait(answers, num_returns=len(answers), timeout=SEE_TIMEOUT_S)
    for node, ref in zip(nodes, answers, strict=True):
        try:
            answer = ray.get(ref, timeout=0)
        except ray.exceptions.TaskUnschedulableError:  # the node left the cluster since it was listed: no work for it
            continue
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"the Ray node {node.get('NodeManagerHostname')} ({node.get('NodeManagerAddress')}) did not say within "
                f"{SEE_TIMEOUT_S:g} s whether it sees the sweep folder {root}: is it overloaded, or leaving?"
            ) from None
        if answer != here:
            raise ConfigError(
                f"the Ray node {node.get('NodeManagerHostname')} ({node.get('NodeManagerAddress')}) does not see "
                f"{seen} as this machine does: every node must see the sweep folder {root} (a shared file system)"
            )


def release(started: Started) -> None:
    """A point across nodes gives its placement group back (its nodes' CPUs and GPUs) as it ends."""
    if started.group is not None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(started.group)


def free_port(host: str) -> int:
    """A port free on this node now, for the rendezvous store its first worker opens."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bundle_node(ray: Any, group: Any, bundle: int) -> str:
    """The address of the node a placement group's bundle was placed on, as Ray knows it (or its id)."""
    try:
        node_id = ray.util.placement_group_table(group)["bundles_to_node_id"][bundle]
        found: dict[str, Any] = next((n for n in ray.nodes() if n.get("NodeID") == node_id), {})
        return str(found.get("NodeManagerAddress") or node_id)
    except Exception:  # noqa: BLE001  (a cluster that cannot say: the bundle's number is all there is)
        return f"bundle {bundle}'s node"


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


@dataclass
class Started:
    run: SweepRun
    entry: Entry
    tag: str
    ref: Any  # the task's ObjectRef
    watch: Any  # local.EpochWatch: its epochs, read from the shared folder
    group: Any = None  # a point across nodes: its placement group, removed when the point ends


class RayExecutor:
    """Submits the points as Ray tasks and stays until they end; submit returns with the final manifest."""

    name: ClassVar[str] = "ray"
    waits: ClassVar[bool] = False  # this process drives the tasks: they end with it

    def __init__(self, *, address: str | None = None, parallel: int | str | None = None):
        self.address, self.parallel = address, parallel  # None or auto: as many as the cluster fits
        self.node_gpus = 0  # the most GPUs a node of the cluster has (known once connected)

    @classmethod
    def add_options(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--ray.address",
            dest="ray_address",
            default=None,
            help=f"--executor ray: the cluster (host:port of its head, ray://..., or auto); default ${ADDRESS_ENV}, "
            "else a local Ray started for the sweep",
        )

    @classmethod
    def options_given(cls, args: argparse.Namespace) -> list[str]:
        return ["--ray.address"] if getattr(args, "ray_address", None) is not None else []

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RayExecutor:
        """Checked before the sweep writes anything or starts tracking it: Ray importable, its cluster answering."""
        if args.timeout is not None:
            raise ConfigError("--timeout is the local executor's: a Ray cluster bounds its tasks itself")
        executor = cls(address=args.ray_address, parallel=args.parallel)
        if not (args.dry_run or args.status or args.wait):
            require_ray()
            reachable(cluster_address(executor.address))
        return executor

    @classmethod
    def reading(cls) -> RayExecutor:
        return cls()

    def runs_on_gpus(self) -> bool | None:
        return None  # the cluster decides per point: the profile follows this machine, --profile picks another

    def dry_run(self, sweep: Sweep, folder: SweepFolder) -> str:
        from ddplab.sweep.local import dry_run_text

        asks = {run.name: resources(run.config, node_gpus=1) for run in sweep.runs}
        lines = [dry_run_text(sweep, folder, here=False), f"on Ray at {self.where()}, each point a task asking for "
                 "(on a cluster with GPUs):"]  # fmt: skip
        lines += [f"  {name:<40} {r['num_cpus']:g} CPU(s), {r['num_gpus']:g} GPU(s)" for name, r in asks.items()]
        return "\n".join(lines)

    def where(self) -> str:
        return cluster_address(self.address) or "a local Ray started for the sweep"

    def submit(self, sweep: Sweep, folder: SweepFolder, echo=print) -> Manifest:
        folder.refuse_run_folder()
        torchrun = next((r for r in sweep.runs if r.config.dist.nnodes > 1 and r.launch == "torchrun"), None)
        if torchrun is not None:
            raise ConfigError(
                f'sweep run {torchrun.name} spans {torchrun.config.dist.nnodes} nodes with launch = "torchrun": on '
                "Ray each node runs ddplab's launcher (leave launch out, or run it with --executor slurm)"
            )
        ray = connect(self.address, echo)
        try:
            return self.submit_connected(ray, sweep, folder, echo)
        except ray.exceptions.RayError as exc:  # the cluster went away under the sweep: one line, resumable
            raise ConfigError(
                f"the Ray cluster failed the sweep: {first_line(exc)}; run the sweep again to resume"
            ) from None
        finally:
            ray.shutdown()  # a local Ray stops with it; a cluster's stays, its tasks of this sweep ended

    def submit_connected(self, ray: Any, sweep: Sweep, folder: SweepFolder, echo) -> Manifest:
        self.refuse_what_fits_no_node(ray, sweep)
        refuse_nodes_that_cannot_see(ray, folder.root)
        with run_lock(folder.root, "sweep"):
            manifest, todo = folder.prepare(sweep, unavailable={}, executor=self.name, echo=echo)
            echo(f"sweep {sweep.name}: {len(sweep.runs)} runs, {len(sweep.runs) - len(todo)} already finished, "
                 f"{len(todo)} to run on Ray ({cluster_text(ray)})")  # fmt: skip
            received: list[int] = []  # Ray's blocking calls turn our Stopped into a bare KeyboardInterrupt

            def stopped(signum: int, frame: Any) -> None:
                received.append(signum)
                raise stops.Stopped(signum)

            with stops.handled(tuple(s for s in stops.STOP_SIGNALS if s != signal.SIGINT), stopped):
                try:
                    self.run_tasks(ray, folder, manifest, todo, echo)
                except KeyboardInterrupt as exc:
                    if received and not isinstance(exc, stops.Stopped):  # the last line names the signal
                        raise stops.Stopped(received[0]) from None
                    raise
            return manifest

    def refuse_what_fits_no_node(self, ray: Any, sweep: Sweep) -> None:
        """A point asking more than any node has would wait forever: one line before anything starts."""
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        self.node_gpus = int(max((n.get("GPU", 0) for n in nodes), default=0))
        for run in sweep.runs:
            ask, wanted = resources(run.config, self.node_gpus), run.config.dist.nnodes
            fit = sum(n.get("CPU", 0) >= ask["num_cpus"] and n.get("GPU", 0) >= ask["num_gpus"] for n in nodes)
            if fit >= wanted:
                continue
            asks = f"{ask['num_cpus']:g} CPU(s) and {ask['num_gpus']:g} GPU(s)"
            if wanted > 1:
                raise ConfigError(
                    f"sweep run {run.name} spans {wanted} nodes, each asking for {asks}, and the cluster has "
                    f"{fit} such node(s) of {len(nodes)}"
                )
            most = max(((n.get("CPU", 0), n.get("GPU", 0)) for n in nodes), default=(0, 0))
            raise ConfigError(
                f"sweep run {run.name} asks for {asks} on one node, and the cluster's largest node has "
                f"{most[0]:g} and {most[1]:g}"
            )

    def run_tasks(
        self, ray: Any, folder: SweepFolder, manifest: Manifest, todo: list[tuple[SweepRun, Entry]], echo
    ) -> None:
        from ddplab import files
        from ddplab.sweep.local import EpochWatch

        env = {k: v for k, v in os.environ.items() if k != ADDRESS_ENV}  # the points' own, as a local sweep's
        pending = [(f"[{i}/{len(todo)}] {run.name}", run, entry) for i, (run, entry) in enumerate(todo, 1)]
        at_once = self.parallel if isinstance(self.parallel, int) else len(pending)
        started: list[Started] = []
        begun = time.perf_counter()
        try:
            while pending or started:
                while pending and len(started) < at_once:
                    tag, run, entry = pending.pop(0)
                    point = Point(folder, run.name, run.config, run.launch)
                    files.write_text(point.config_file, run.config.to_toml())
                    ref, group = self.start(ray, point, point.env(env))
                    entry.status, entry.exit_code, entry.error = Status.SUBMITTED, None, None  # Ray places it
                    folder.write(manifest)
                    echo(f"{tag}: submitted to Ray ({'resuming' if point.resumes() else 'new'}; log: {point.log})")
                    watch = EpochWatch(point.run_dir / runfiles.METRICS, run.config.train.epochs)
                    started.append(Started(run, entry, tag, ref, watch, group))
                ready, _ = ray.wait([s.ref for s in started], num_returns=1, timeout=POLL_S)
                for s in list(started):
                    for line in s.watch.new_lines():
                        echo(f"{s.tag}: {line}")
                    if s.ref in ready:
                        started.remove(s)
                        self.record(ray, folder, manifest, s, echo)
                        echo(f"  sweep: {len(todo) - len(pending) - len(started)} of {len(todo)} done, "
                             f"{duration(time.perf_counter() - begun)} so far")  # fmt: skip
        except KeyboardInterrupt:
            for s in started:
                ray.cancel(s.ref)  # KeyboardInterrupt in the task: its run stopped as Ctrl-C stops one
            deadline = time.monotonic() + CANCEL_GRACE_S
            while started and time.monotonic() < deadline:
                ready, _ = ray.wait([s.ref for s in started], num_returns=len(started), timeout=1.0)
                for s in [s for s in started if s.ref in ready]:
                    started.remove(s)
                    self.record(ray, folder, manifest, s, echo)
            for s in started:  # still running past the grace: Ray's shutdown ends them
                release(s)
                s.entry.ended(Status.INTERRUPTED, INTERRUPTED, "the sweep was stopped", None)
            folder.write(manifest)
            raise

    def start(self, ray: Any, point: Point, env: Mapping[str, str]) -> tuple[Any, Any]:
        """The point's task, and for a point across nodes the placement group its nodes' tasks run in: one bundle a
        node, each on a node of its own, the first bundle's task starting the others (run_across_nodes)."""
        ask = resources(point.config, self.node_gpus)
        task = Task(str(point.folder.root.resolve()), point.name, point.config.to_dict(), point.launch, dict(env),
                    os.getcwd())  # fmt: skip
        nodes = point.config.dist.nnodes
        if nodes == 1:
            return ray.remote(run_point).options(**ask).remote(task), None
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": ask["num_cpus"], **({"GPU": ask["num_gpus"]} if ask["num_gpus"] else {})}
        group = placement_group([bundle] * nodes, strategy="STRICT_SPREAD", name=f"ddplab {point.name}")
        first = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        ref = ray.remote(run_across_nodes).options(**ask, scheduling_strategy=first).remote(task, group, ask)
        return ref, group

    def record(self, ray: Any, folder: SweepFolder, manifest: Manifest, s: Started, echo) -> None:
        node = None
        try:
            outcome, node = ray.get(s.ref)
        except ray.exceptions.TaskCancelledError:  # cancelled before it started: nothing ran
            outcome = Outcome(Status.INTERRUPTED, None, None, None)
        except ray.exceptions.RayTaskError as exc:  # the task's own error (the folder not seen there, say): failed
            lines = str(exc.cause if exc.cause is not None else exc).strip().splitlines() or [type(exc).__name__]
            outcome = Outcome(Status.FAILED, None, f"Ray task: {lines[-1][:300]}", None)
        except ray.exceptions.RayError as exc:  # its worker or node died: resumable by running the sweep again
            lost = "" if s.group is None else f"node 0 ({bundle_node(ray, s.group, 0)}) lost: "
            outcome = Outcome(Status.INTERRUPTED, None, f"{lost}Ray: {first_line(exc)}", None)
        release(s)
        s.entry.ended(
            outcome.status, outcome.exit_code, outcome.error, outcome.wall_s, s.watch.count() - s.watch.started
        )
        folder.write(manifest)
        where, error, code = f" on {node}" if node else "", outcome.error, outcome.exit_code
        if outcome.status is Status.FINISHED:
            said = f"finished in {duration(outcome.wall_s or 0.0)}{where}"
        elif outcome.status is Status.INTERRUPTED:
            said = f"interrupted (resumable){where}" + (f": {error}" if error else "")
        else:
            said = "FAILED" + (f" (exit {code})" if code is not None else "") + f"{where}: {error}"
        echo(f"{s.tag}: {said}")

    def refresh(self, folder: SweepFolder, manifest: Manifest) -> list[str]:
        from ddplab.runlock import live_owner

        for entry in manifest.runs:  # the sweep that drove it is gone (killed outright): nothing trains it any more
            if entry.status in (Status.SUBMITTED, Status.RUNNING) and live_owner(folder.root) is None:
                entry.status = Status.STOPPED
        return []

    def wait(self, folder: SweepFolder, echo=print) -> Manifest:
        return folder.load()  # submit drove them to the end


def cluster_address(given: str | None) -> str | None:
    """The cluster a sweep runs on: --ray.address, else $RAY_ADDRESS; None: a local Ray of the sweep's own."""
    return given or os.environ.get(ADDRESS_ENV) or None


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--executor ray needs Ray, which this Python lacks: {INSTALL}") from None
    return ray


def reachable(address: str | None) -> None:
    """A cluster's address that does not answer a TCP connect within CONNECT_TIMEOUT_S: one line (Ray itself retries
    for minutes). `auto` and None need no network; `ray://` (Ray Client) is host:port too."""
    if address is None or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address} ({exc.__class__.__name__}: {exc}): is its head running "
            "(ray start --head), and is that its GCS address (host:6379 by default)?"
        ) from None


def connect(address: str | None, echo) -> Any:
    """Ray, connected: to `address` (else $RAY_ADDRESS), else to a local Ray started here. One line, before
    anything is written, where Ray is not installed or the cluster does not answer."""
    ray = require_ray()
    address = cluster_address(address)
    reachable(address)
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init puts its own (sys.exit): ddplab's stop rule is ours
    try:
        if address is None:  # "local": a Ray of its own, never a `ray start` one found on this machine
            ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
            echo(f"Ray: no cluster given (--ray.address, ${ADDRESS_ENV}): started a local one for this sweep, "
                 f"{cluster_text(ray)}; it stops when the sweep ends")  # fmt: skip
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError, ray.exceptions.RayError) as exc:
        raise ConfigError(
            f"cannot join the Ray cluster at {address or 'local'}: {(str(exc).strip().splitlines() or [''])[0]}"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    return ray


def cluster_text(ray: Any) -> str:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}, {total.get('CPU', 0):g} CPUs" + (
        f", {total.get('GPU', 0):g} GPUs" if total.get("GPU") else ""
    )

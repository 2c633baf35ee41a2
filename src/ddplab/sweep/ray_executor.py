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
nodes (STRICT_SPREAD), each bundle what one node's workers ask: a task in the first bundle picks the rendezvous (its
node's address, a free port), then one task a bundle runs, all owned by this process, and every node runs the
command a user would run there by hand (`ddplab train ... --node-rank R --rdzv-endpoint HOST:PORT`), not a port to
Ray Train. A node lost under a point ends the point resumable, naming the node: as Ray reports its task's end (a
raylet gone), as its task stays silent past dist.timeout_s after another node's run ended (a link cut), or as Ray
marks the node dead. Torch-free; Ray only when used.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ddplab import stops
from ddplab.config import RunConfig
from ddplab.errors import ConfigError
from ddplab.io.arguments import given
from ddplab.io.borders import shown
from ddplab.launch.process import INTERRUPTED, STOP_GRACE_S
from ddplab.rundir import runfiles
from ddplab.rundir.runlock import run_lock
from ddplab.sweep.estimate import duration
from ddplab.sweep.point import Node, Outcome, Point
from ddplab.sweep.slots import points_at_once
from ddplab.sweepdir.folder import Entry, Manifest, Status, SweepFolder
from ddplab.sweepdir.spec import Sweep, SweepRun

ADDRESS_ENV = "RAY_ADDRESS"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # preface, empty SETTINGS
SETTINGS_FRAME = 0x4  # an HTTP/2 frame's type byte (its fourth): a gRPC server's first frame
CONNECT_TIMEOUT_S = 5.0  # an address that does not answer a TCP connect in this long is not a cluster (Ray waits 60 s+)
POLL_S = 1.0
SEE_TIMEOUT_S = 120.0  # each node's answer whether it sees the sweep folder (a cold node starts a worker first)
CANCEL_GRACE_S = STOP_GRACE_S + 15.0  # cancelled tasks' runs stop resumable (or are killed) before Ray shuts down
NODE_GRACE_S = 15.0  # past dist.timeout_s after the first node's run ended, a node whose run has not is cut off
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


def rendezvous_address() -> str:
    """In the first bundle of a point across nodes, before its nodes start: where they meet (this node's address as
    Ray knows it, a port free here now)."""
    import ray

    host = ray.util.get_node_ip_address()
    return f"{'[' + host + ']' if ':' in host else host}:{free_port(host)}"


def outcome_of(ray: Any, ref: Any) -> tuple[Outcome, str | None, bool]:
    """What became of a task that ended: its point's outcome, the node it ran on (None: Ray cannot say), and whether
    Ray lost it (its worker or node died under it: resumable by running the sweep again)."""
    try:
        outcome, node = ray.get(ref)
        return outcome, node, False
    except ray.exceptions.TaskCancelledError:  # cancelled before it started: nothing ran
        return Outcome(Status.INTERRUPTED, None, None, None), None, False
    except ray.exceptions.RayTaskError as exc:  # the task's own error (the folder not seen there, say): failed
        lines = str(exc.cause if exc.cause is not None else exc).strip().splitlines() or [type(exc).__name__]
        return Outcome(Status.FAILED, None, f"Ray task: {lines[-1][:300]}", None), None, False
    except ray.exceptions.RayError as exc:
        return Outcome(Status.INTERRUPTED, None, f"Ray: {first_line(exc)}", None), None, True


def sees(path: str) -> bool:
    """On a node: whether the file the sweep just made is there."""
    return os.path.exists(path)


def refuse_nodes_that_cannot_see(ray: Any, root: Path) -> None:
    """Every node must see the sweep folder (its points' run folders, logs and the manifest are there): a node that
    does not, or sees another folder at its path, is one line before anything is written. The folder may not exist
    yet: a file of a random name, made in its nearest existing parent for the question and removed after it, is
    what every node must see (a folder's inode alone is no identity: node-local roots share theirs)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    seen = root.resolve()
    while not seen.is_dir() and seen != seen.parent:
        seen = seen.parent
    mark = seen / f".ddplab-sees-{uuid.uuid4().hex}"
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except OSError:  # a parent this process cannot write to: the sweep's own first write says so
        return
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        answers = [
            ray.remote(sees)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(str(mark))
            for n in nodes
        ]
        ray.wait(answers, num_returns=len(answers), timeout=SEE_TIMEOUT_S)
        for node, ref in zip(nodes, answers, strict=True):
            name = f"the Ray node {node.get('NodeManagerHostname')} ({node.get('NodeManagerAddress')})"
            try:
                if not ray.get(ref, timeout=0):
                    raise ConfigError(
                        f"{name} does not see {seen} as this machine does: every node must see the sweep folder "
                        f"{root} (a shared file system)"
                    )
            except ray.exceptions.TaskUnschedulableError:  # the node left the cluster since it was listed
                continue
            except ray.exceptions.GetTimeoutError:
                raise ConfigError(
                    f"{name} did not say within {SEE_TIMEOUT_S:g} s whether it sees the sweep folder {root}: is it "
                    "overloaded, or leaving?"
                ) from None
    finally:
        mark.unlink(missing_ok=True)


def pause(ray: Any, started: list[Started], timeout_s: float) -> None:
    """Until one of the tasks still running ends, or `timeout_s` (each point is then asked whether it ended)."""
    running = [ref for s in started for ref in s.waiting_on()]
    if running:
        ray.wait(running, num_returns=1, timeout=timeout_s)
    else:
        time.sleep(timeout_s)


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


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


@dataclass
class Started:
    """A point handed to Ray, until it ends: one task, or, across nodes, its placement group, the task that finds
    where its nodes meet, then one task a node, every one owned by this process (so a node cut off from the others
    is the one silent task, never a task that holds the others' outcomes)."""

    point: Point  # as this process built it: its config, run folder and outcome rule
    entry: Entry
    tag: str
    watch: Any  # local.EpochWatch: its epochs, read from the shared folder
    task: Task  # what its tasks carry to their nodes
    ask: dict[str, float]
    refs: list[Any] = field(default_factory=list)  # each node's task, by node rank
    done: set[int] = field(default_factory=set)  # the node ranks whose task ended
    group: Any = None  # a point across nodes: its placement group, removed when the point ends
    address: Any = None  # ... and the task that picks its rendezvous, until its nodes' tasks start
    nodes: dict[int, tuple[str, str]] | None = None  # bundle -> (node id, address), once the group is placed
    placed_at: float | None = None
    first_end: float | None = None  # when the first of its nodes' tasks ended
    lost: dict[int, str] = field(default_factory=dict)  # node rank -> why it is lost; the rest are being stopped
    stop_by: float | None = None  # ... until then
    stopping: bool = False  # the sweep is stopping: its nodes' tasks are not started any more

    def waiting_on(self) -> list[Any]:
        if not self.refs:
            return [self.address]
        return [ref for rank, ref in enumerate(self.refs) if rank not in self.done and rank not in self.lost]

    def bundles(self) -> range:
        return range(self.point.config.dist.nnodes)

    def where(self, rank: int) -> str:
        return f"node {rank} ({self.nodes[rank][1] if self.nodes else f'bundle {rank}'})"

    def ended(self, ray: Any) -> tuple[Outcome, str | None] | None:
        """Its outcome and where it ran once it ended, else None (called each poll)."""
        if self.group is None:
            done, _ = ray.wait(self.refs, timeout=0)
            return outcome_of(ray, self.refs[0])[:2] if done else None
        self.placed(ray)
        if not self.refs:
            return self.meet(ray)
        waiting = self.waiting_on()
        ready = ray.wait(waiting, num_returns=len(waiting), timeout=0)[0] if waiting else []
        self.done |= {rank for rank, ref in enumerate(self.refs) if ref in ready}
        if self.done and self.first_end is None:
            self.first_end = time.monotonic()
        if not self.lost:
            self.lost = self.cut_off(ray)
            for rank, ref in enumerate(self.refs):
                if self.lost and rank not in self.done and rank not in self.lost:
                    ray.cancel(ref)  # the nodes left stop their part, resumable, before the point is recorded
            self.stop_by = time.monotonic() + CANCEL_GRACE_S if self.lost else None
        if self.waiting_on() and not (self.stop_by is not None and time.monotonic() > self.stop_by):
            return None
        return self.outcome(ray)

    def placed(self, ray: Any) -> None:
        table = {} if self.nodes is not None else ray.util.placement_group_table(self.group)
        if table.get("state") == "CREATED":
            ids = table.get("bundles_to_node_id") or {}
            address = {n.get("NodeID"): n.get("NodeManagerAddress") for n in ray.nodes()}
            self.nodes = {int(b): (node, str(address.get(node, node))) for b, node in ids.items()}
            self.placed_at = time.monotonic()

    def meet(self, ray: Any) -> tuple[Outcome, str | None] | None:
        """Before its nodes start: once the first bundle's task says where they meet, start them."""
        if self.stopping:
            return Outcome(Status.INTERRUPTED, None, None, None), None
        done, _ = ray.wait([self.address], timeout=0)
        if done:
            try:
                self.start_nodes(ray, ray.get(self.address))
                return None
            except ray.exceptions.RayError:
                return outcome_of(ray, self.address)[:2]
        dead = self.dead(ray)
        silent = self.placed_at is not None and time.monotonic() - self.placed_at > SEE_TIMEOUT_S
        if 0 in dead or silent:
            ray.cancel(self.address)
            why = "Ray marked it dead" if 0 in dead else f"no answer within {SEE_TIMEOUT_S:g} s of its placement"
            return Outcome(Status.INTERRUPTED, None, f"{self.where(0)} lost: {why}", None), None
        return None

    def start_nodes(self, ray: Any, endpoint: str) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        resume = self.point.resumes()  # every node resumes, or none does
        self.refs = [
            ray.remote(run_point)
            .options(**self.ask, scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, rank))
            .remote(self.task, Node(rank, endpoint, resume))
            for rank in self.bundles()
        ]

    def dead(self, ray: Any) -> set[int]:
        """The bundles whose node Ray has marked dead (its raylet or link down)."""
        if not self.nodes:
            return set()
        gone = {n.get("NodeID") for n in ray.nodes() if not n.get("Alive")}
        return {bundle for bundle, (node, _) in self.nodes.items() if node in gone}

    def cut_off(self, ray: Any) -> dict[int, str]:
        """Its nodes lost, each with why: marked dead by Ray, or still silent past the longest a node's run outlives
        another's (dist.timeout_s for each attempt left, the store's and the agent's own waits, a margin). A task on a
        node cut off from the cluster never answers its owner, so the sweep does not wait for it."""
        lost = {rank: "Ray marked it dead" for rank in self.dead(ray) if rank not in self.done}
        if self.first_end is not None and time.monotonic() - self.first_end > self.patience_s():
            lost.update(
                {rank: f"no answer {self.patience_s():g} s after another node's run ended" for rank in self.silent()}
            )
        return lost

    def silent(self) -> list[int]:
        return [rank for rank in self.bundles() if rank not in self.done]

    def patience_s(self) -> float:
        from ddplab.launch.elastic import SHUTDOWN_TIMEOUT_S, STORE_SLACK_S, patience_s

        return patience_s(self.point.config.dist) + STORE_SLACK_S + SHUTDOWN_TIMEOUT_S + NODE_GRACE_S

    def outcome(self, ray: Any) -> tuple[Outcome, str | None]:
        """One outcome for all its nodes, decided here once every node's task ended or was given up: finished when
        every node exited 0 and the run wrote its summary (global rank 0 may be on any node); stopped (resumable)
        when a node was lost or stopped and none failed otherwise; else failed, each failing node's error named."""
        said = [f"{self.where(rank)} lost: {why}" for rank, why in sorted(self.lost.items())]
        ran: list[tuple[int, Outcome]] = []
        where, walls = [], []
        for rank in sorted(self.done):
            outcome, ran_on, died = outcome_of(ray, self.refs[rank])
            where += [ran_on] if ran_on else []
            walls += [outcome.wall_s] if outcome.wall_s is not None else []
            if died:
                said.append(f"{self.where(rank)} lost: {outcome.error}")
            else:
                ran.append((rank, outcome))
        wall, nodes = max(walls, default=None), ", ".join(where) or None
        if not said and len(ran) == len(self.refs) and all(o.exit_code == 0 for _, o in ran):
            return self.point.outcome(0, None, wall or 0.0), nodes
        failed = [(rank, o) for rank, o in ran if o.status is Status.FAILED and o.exit_code != 0]
        if failed and not said:
            error = "; ".join(f"node {rank}: {o.error}" for rank, o in failed if o.error) or None
            return Outcome(Status.FAILED, failed[0][1].exit_code, error, wall), nodes
        return Outcome(Status.INTERRUPTED, INTERRUPTED, "; ".join(said) or None, wall), nodes


class RayExecutor:
    """Submits the points as Ray tasks and stays until they end; submit returns with the final manifest."""

    name: ClassVar[str] = "ray"
    waits: ClassVar[bool] = False  # this process drives the tasks: they end with it
    summary: ClassVar[str] = "tasks on a Ray cluster (--ray.address), else on a local Ray started for the sweep"

    def __init__(self, *, address: str | None = None, parallel: int | str | None = None):
        points_at_once(parallel, type(self).__name__, unset_ok=True)
        if address is not None and not (isinstance(address, str) and address.strip()):
            raise ConfigError(
                f"RayExecutor(address={shown(address)}): a cluster's host:port, ray://host:port or auto; "
                f"None for ${ADDRESS_ENV}, else a local Ray"
            )
        self.address, self.parallel = address, parallel  # None or auto: as many as the cluster fits
        self.node_gpus = 0  # the most GPUs a node of the cluster has (known once connected)

    @classmethod
    def add_options(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--ray.address",
            dest="ray_address",
            type=given,  # '' (an unset shell variable) refused, never read as the default
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
        elastic = next((r for r in sweep.runs if r.config.dist.elastic()), None)
        if elastic is not None:
            raise ConfigError(
                f"sweep run {elastic.name} may go on without a lost node (dist.min_nodes="
                f"{elastic.config.dist.min_nodes} of {elastic.config.dist.nnodes}): on Ray a point's nodes are its "
                "tasks, and a lost one ends the point, resumable (leave dist.min_nodes out, or run it with ddplab's "
                "launcher on hosts you start)"
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
                if not stops.stopping():  # the first: the one the last line names (a later one is ignored)
                    received.append(signum)
                stops.raise_stopped(signum, frame)

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
        from ddplab.io import files
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
                    watch = EpochWatch(point.run_dir / runfiles.METRICS, run.config.train.epochs)
                    started.append(self.start(ray, Started(point, entry, tag, watch, *self.task(point, env))))
                    entry.status, entry.exit_code, entry.error = Status.SUBMITTED, None, None  # Ray places it
                    folder.write(manifest)
                    echo(f"{tag}: submitted to Ray ({'resuming' if point.resumes() else 'new'}; log: {point.log})")
                pause(ray, started, POLL_S)
                for s in list(started):
                    for line in s.watch.new_lines():
                        echo(f"{s.tag}: {line}")
                    if (ended := s.ended(ray)) is not None:
                        self.record(folder, manifest, s, *ended, echo)  # then removed: a stop between the two
                        started.remove(s)  # finds it recorded (no longer submitted), not lost
                        echo(f"  sweep: {len(todo) - len(pending) - len(started)} of {len(todo)} done, "
                             f"{duration(time.perf_counter() - begun)} so far")  # fmt: skip
        except KeyboardInterrupt:
            self.stop(ray, folder, manifest, started, echo)
            raise

    def stop(self, ray: Any, folder: SweepFolder, manifest: Manifest, started: list[Started], echo) -> None:
        """Every task cancelled (KeyboardInterrupt in the task: its run stopped as Ctrl-C stops one), each point
        recorded as it ends, within CANCEL_GRACE_S."""
        started[:] = [s for s in started if s.entry.status is Status.SUBMITTED]  # not yet recorded
        for s in started:
            s.stopping = True
            for ref in s.waiting_on():
                ray.cancel(ref)
        deadline = time.monotonic() + CANCEL_GRACE_S
        while started and time.monotonic() < deadline:
            pause(ray, started, 1.0)
            for s in list(started):
                if (ended := s.ended(ray)) is not None:
                    started.remove(s)
                    self.record(folder, manifest, s, *ended, echo)
        for s in started:  # still running past the grace: Ray's shutdown ends them
            release(s)
            s.entry.ended(Status.INTERRUPTED, INTERRUPTED, "the sweep was stopped", None)
        folder.write(manifest)

    def task(self, point: Point, env: Mapping[str, str]) -> tuple[Task, dict[str, float]]:
        task = Task(str(point.folder.root.resolve()), point.name, point.config.to_dict(), point.launch,
                    point.env(env), os.getcwd())  # fmt: skip
        return task, resources(point.config, self.node_gpus)

    def start(self, ray: Any, s: Started) -> Started:
        """A point of one node: its task. Across nodes: a placement group of one bundle a node, each on a node of its
        own, and the task in the first bundle that says where they meet; their tasks start once it answers."""
        if s.point.config.dist.nnodes == 1:
            s.refs = [ray.remote(run_point).options(**s.ask).remote(s.task)]
            return s
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": s.ask["num_cpus"], **({"GPU": s.ask["num_gpus"]} if s.ask["num_gpus"] else {})}
        s.group = placement_group([bundle] * len(s.bundles()), strategy="STRICT_SPREAD", name=f"ddplab {s.point.name}")
        first = PlacementGroupSchedulingStrategy(s.group, placement_group_bundle_index=0)
        s.address = ray.remote(rendezvous_address).options(num_cpus=0, scheduling_strategy=first).remote()
        return s

    def record(
        self, folder: SweepFolder, manifest: Manifest, s: Started, outcome: Outcome, node: str | None, echo
    ) -> None:
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
        from ddplab.rundir.runlock import live_owner

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
    """A cluster's address that does not answer as a Ray head within CONNECT_TIMEOUT_S: one line (Ray itself retries
    for minutes, and hangs on a port where something else listens). Ray's GCS and its Client server (`ray://`)
    both speak gRPC, which answers HTTP/2's connection preface with a SETTINGS frame: a silent service, an HTTP/1
    server or a database does not. `auto` and None need no network."""
    if address is None or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    from ddplab.io.environment import switch

    tls = switch("RAY_USE_TLS", False)  # a TLS head answers no cleartext preface: only that it listens is checked
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S) as conn:
            if tls:
                return
            conn.sendall(HTTP2_PREFACE)
            answer = b""
            deadline = time.monotonic() + CONNECT_TIMEOUT_S
            while len(answer) < 9 and (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                chunk = conn.recv(9 - len(answer))
                if not chunk:
                    break
                answer += chunk
    except socket.timeout:
        answer = b""
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address} ({exc.__class__.__name__}: {exc}): is its head running "
            "(ray start --head), and is that its GCS address (host:6379 by default)?"
        ) from None
    if len(answer) < 9 or answer[3] != SETTINGS_FRAME:
        said = "nothing within {:g} s".format(CONNECT_TIMEOUT_S) if not answer else f"{answer[:20]!r}"
        raise ConfigError(
            f"{address} is not a Ray cluster: something listens there but does not answer as Ray's head does "
            f"(gRPC; it answered {said}): give its GCS address (host:6379 by default) or ray://host:10001"
        )


def connect(address: str | None, echo) -> Any:
    """Ray, connected: to `address` (else $RAY_ADDRESS), else to a local Ray started here. One line, before
    anything is written, where Ray is not installed or the cluster does not answer."""
    ray = require_ray()
    address = cluster_address(address)
    reachable(address)
    try:
        with stops.kept():  # ray.init puts its own SIGTERM handler (sys.exit): ddplab's stop rule is ours
            if address is None:  # "local": a Ray of its own, never a `ray start` one found on this machine
                ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        if address is None:
            echo(f"Ray: no cluster given (--ray.address, ${ADDRESS_ENV}): started a local one for this sweep, "
                 f"{cluster_text(ray)}; it stops when the sweep ends")  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError, TimeoutError, ray.exceptions.RayError) as exc:
        raise ConfigError(f"cannot join the Ray cluster at {address or 'local'}: {first_line(exc)}") from None
    return ray


def cluster_text(ray: Any) -> str:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}, {total.get('CPU', 0):g} CPUs" + (
        f", {total.get('GPU', 0):g} GPUs" if total.get("GPU") else ""
    )

"""Who this process is (rank, world size, device) and the few collectives the loop needs.

A worker learns its place from the environment its launcher set: PyTorch's elastic agent
(`ddplab train --nproc N`, torchrun) or Slurm's srun.

The loop is written against `DistContext` only: at world size 1 every collective is a
no-op, so the single-process path and the distributed one run the same code (contract 1,
STYLE rule 8). `wrap_model` is the one place where strategies differ in how the model is
held.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ddplab import compat, internals
from ddplab.config import RunConfig
from ddplab.errors import ConfigError
from ddplab.io.arguments import endpoint_parts
from ddplab.topology import ProcessPlace, group_attempt, resolve_backend, usable_cores

# torch's Flight Recorder (a ring of the last collectives, any backend's on a recent torch): the entries it keeps,
# set for a run's group unless the user set them (0 turns it off); what it costs a step: benchmarks/step_clocks.py.
FLIGHT_RECORDER_ENTRIES = 256


@dataclass(frozen=True)
class Entered:
    """One collective this rank entered: ddplab's count of them, what it was, its bytes, and when."""

    seq: int
    op: str
    bucket: int | None  # a gradient bucket's index, from 0
    nbytes: int
    at: float  # time.time()


class Collectives:
    """The last collectives this rank entered, newest last: ddplab's own record, which a hang reads to say which
    collective the others wait in and who never entered it (engine/hang.py). Every rank enters the same ones in the
    same order, so their counts line up. One append a collective: no lock (one thread enters at a time)."""

    KEEP = 32

    def __init__(self) -> None:
        self.entries: deque[Entered] = deque(maxlen=self.KEEP)
        self.seq = 0
        self.buckets = 0  # a step's gradient buckets, once a step has shown its last

    def enter(self, op: str, nbytes: int = 0, bucket: int | None = None) -> None:
        self.seq += 1
        self.entries.append(Entered(self.seq, op, bucket, nbytes, time.time()))

    def bucket(self, index: int, last: bool, nbytes: int) -> None:
        if last:
            self.buckets = index + 1
        self.enter("all-reduce", nbytes, index)

    def last(self) -> Entered | None:
        return self.entries[-1] if self.entries else None

    def describe(self, entry: Entered) -> str:
        """ "all-reduce #1234 (bucket 3 of 4, 25 MiB)"."""
        parts = []
        if entry.bucket is not None:
            parts.append(f"bucket {entry.bucket + 1}" + (f" of {self.buckets}" if self.buckets else ""))
        if entry.nbytes:
            parts.append(size_text(entry.nbytes))
        return f"{entry.op} #{entry.seq}" + (f" ({', '.join(parts)})" if parts else "")


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None  # None: no process group
    monitor: dist.ProcessGroup | None = None  # a separate Gloo group, for monitored_barrier
    hosts: tuple[str, ...] = ()  # each rank's address (multi-node runs), to name the host of a rank in errors
    collectives: Collectives = field(default_factory=Collectives, compare=False)  # what this rank entered

    def rank_hosts(self) -> tuple[str, ...]:
        """Each rank's host, "" for each where the run is on one node (which records none)."""
        return self.hosts or ("",) * self.world_size

    def on_host(self, rank: int) -> str:
        """' on HOST' for an error about `rank`, where the ranks are spread over several hosts."""
        return f" on {self.hosts[rank]}" if len(set(self.hosts)) > 1 and 0 <= rank < len(self.hosts) else ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns the tensor for chaining."""
        if self.is_distributed:
            self.collectives.enter("all-reduce", tensor.numel() * tensor.element_size())
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """Per-rank lists of floats (for per-rank time and memory tables)."""
        local = torch.tensor(values, dtype=torch.float64, device=self.device)
        if not self.is_distributed:
            return [local.tolist()]
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        self.collectives.enter("all-gather", local.numel() * local.element_size())
        torch.distributed.all_gather(gathered, local)
        return [g.tolist() for g in gathered]

    def gather_objects(self, obj: object) -> list:
        """Every rank's `obj` (picklable), on every rank: for per-epoch samples, never per step."""
        if not self.is_distributed:
            return [obj]
        out: list = [None] * self.world_size
        self.collectives.enter("all-gather of objects")
        torch.distributed.all_gather_object(out, obj)
        return out

    def any_true(self, flag: bool) -> bool:
        """True on every rank if it is true on any rank, so all ranks stop together."""
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        return bool(self.all_reduce_sum(t).item() > 0)

    def barrier(self) -> None:
        if self.is_distributed:
            self.collectives.enter("barrier")
            torch.distributed.barrier()

    def missing_ranks(self, timeout_s: float, *, quiet: bool = True) -> list[int]:
        """Ranks that do not reach a barrier within `timeout_s`, whichever rank stopped answering.

        Gloo's monitored_barrier names the ranks that did not arrive, which turns a
        collective timeout into "rank 3 is stuck" instead of a bare timeout. Its own log
        lines say the same on stderr, so they are silenced unless `quiet` is False (--debug).
        Rank 0 collects the barrier, so only it can name the others; the others wait
        MONITOR_SLACK_S longer for its answer, so a live rank 0 always answers or fails
        first (its failure closes their connections), and a barrier that merely times out
        on them means rank 0 itself stopped answering (frozen, stuck, or its host gone):
        rank 0 is named, where Gloo's raw "Timed out waiting ... for recv" was.
        """
        if not self.is_distributed:
            return []
        wait_s = timeout_s if self.rank == 0 else timeout_s + MONITOR_SLACK_S
        try:
            with stderr_silenced() if quiet else contextlib.nullcontext():
                dist.monitored_barrier(group=self.monitor, timeout=timedelta(seconds=wait_s), wait_all_ranks=True)
        except RuntimeError as exc:
            found = re.search(r"[Rr]anks? ([\d, ]+) failed to pass", str(exc))
            if found:
                return sorted(int(r) for r in found.group(1).replace(" ", "").split(",") if r)
            return [0] if self.rank != 0 and re.search(r"[Tt]imed out", str(exc)) else []
        return []


MONITOR_SLACK_S = 5  # how much longer than rank 0 the other ranks wait for the barrier it collects


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a moment: C++ logs (Gloo, c10) write there, not to sys.stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def rank_device(name: str, local_rank: int = 0, *, shared: bool = False, cuda: bool = False) -> str:
    """The device a rank trains on: `cuda` means cuda:LOCAL_RANK, one GPU per rank, or cuda:0 for every
    rank when the workers share one (--dist.share_device); "auto" is cuda where there is one."""
    if name == "auto":
        name = "cuda" if cuda else "cpu"
    if name == "cuda":
        name = f"cuda:{0 if shared else local_rank}"
    return name


def resolve_device(name: str, local_rank: int = 0, *, shared: bool = False) -> torch.device:
    device = torch.device(rank_device(name, local_rank, shared=shared, cuda=torch.cuda.is_available()))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before any allocation, or every rank touches GPU 0
    return device


def _slurm_rendezvous_env() -> None:
    """srun gives ranks but no master: the first node of the job, at the address Slurm itself reaches it by
    (its NodeAddr: a node's name need not resolve, as on ddplab's test hosts), a port from the job id."""
    if "MASTER_ADDR" not in os.environ:
        import subprocess

        nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        try:
            first = subprocess.run(
                ["scontrol", "show", "hostnames", nodes],
                capture_output=True,
                text=True,
                errors="replace",
                check=True,
                timeout=30,
            ).stdout.split()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            first = nodes.split(",")[0].split("[")[0]
        try:
            shown = subprocess.run(
                ["scontrol", "show", "node", "-o", first],
                capture_output=True,
                text=True,
                errors="replace",
                check=True,
                timeout=30,
            ).stdout
            found = re.search(r"\bNodeAddr=(\S+)", shown)
            if found:
                first = found.group(1)
        except (OSError, subprocess.SubprocessError, AttributeError):
            pass
        os.environ["MASTER_ADDR"] = first
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))


def rendezvous_store(place: ProcessPlace, timeout: timedelta) -> dist.Store:
    """The key-value store the group meets in, with a fresh namespace per elastic attempt.

    After an elastic restart the agent's store still holds the dead group's addresses;
    without a per-attempt prefix a new worker can read a stale peer address and hang in
    Gloo's connect. Under the agent the store is the agent's (every worker is a client);
    under torchrun-without-agent-store or srun, rank 0 hosts it.
    """
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        place.world_size,
        is_master=not agent_store and place.rank == 0,
        timeout=timeout,
        multi_tenant=not agent_store,
    )
    return dist.PrefixStore(f"ddplab/attempt_{group_attempt()}", store)


def route_address(endpoint: str | None) -> str | None:
    """This node's address on the interface that reaches the rendezvous endpoint.

    Other nodes must reach this node's workers at it; the hostname PyTorch would use
    otherwise may resolve to an interface they have no route to. A UDP "connect" only asks
    the kernel for the route: no packet is sent.
    """
    if endpoint is None:
        return None
    host, port = endpoint_parts(endpoint)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return probe.getsockname()[0]
    except OSError:
        return None


def master_route() -> str | None:
    """This node's address on the interface that reaches the master (MASTER_ADDR), if it has one."""
    if "MASTER_ADDR" not in os.environ:
        return None
    return route_address(f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '1')}")


def this_host() -> str:
    """This node's address as the other nodes reach it (the interface towards the master), else its hostname."""
    address = master_route()
    return address if address and not address.startswith("127.") else socket.gethostname()


def interface_for_address(address: str) -> str | None:
    """The name of the network interface that holds `address` (Linux, IPv4), if any."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def maybe_set_gloo_interface() -> None:
    """Point Gloo at the interface that reaches the master, unless the user chose one.

    Gloo otherwise binds to whatever the hostname resolves to, often loopback or an
    interface the other nodes cannot reach.
    """
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    local = master_route()
    name = interface_for_address(local) if local else None
    if name and name != "lo":
        os.environ["GLOO_SOCKET_IFNAME"] = name


def set_cpu_threads(device: torch.device, threads: int | None = None, local_world: int = 1) -> None:
    """Intra-op threads of a CPU process: `threads` (--train.threads), else $OMP_NUM_THREADS, else
    torch's default, except that CPU workers on one node split the cores they may run on.

    Each worker would otherwise start one thread per core: N workers, N x cores threads, and
    the epoch slows down instead of speeding up (torchrun sets 1 thread for the same reason;
    the elastic launcher API behind `--nproc` sets nothing). Cores are counted from this
    process's CPU affinity, which containers and taskset restrict, not from the machine's.
    """
    if device.type != "cpu":
        return
    if threads is not None:
        torch.set_num_threads(threads)
        return
    if local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(usable_cores()) // local_world))


@contextlib.contextmanager
def distributed_context(config: RunConfig, place: ProcessPlace | None) -> Iterator[DistContext]:
    """Join the process group this process was started for (`place`, see topology.py), and always leave it.

    Without a place this is a single process and no group is made. The group is destroyed
    on success and on error alike, so no rank is left waiting in NCCL.
    """
    if place is None:
        if config.dist.strategy == "ddp" and config.world_size() > 1:
            raise ConfigError(
                "dist.strategy=ddp: this process was not started by a launcher; "
                "use `ddplab train --nproc N` or torchrun"
            )
        ctx = DistContext(device=resolve_device(config.train.device))
        set_cpu_threads(ctx.device, config.train.threads)
        yield ctx
        return
    if place.launcher == "srun":
        _slurm_rendezvous_env()
    shared = config.dist.share_device
    device = resolve_device(config.train.device, place.local_rank, shared=shared)
    set_cpu_threads(device, config.train.threads, place.local_world_size)
    backend = resolve_backend(config.dist.backend, on_cuda=device.type == "cuda", shared_device=shared)
    if backend == "gloo" and config.dist.nnodes > 1:
        maybe_set_gloo_interface()
    init_kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    timeout = timedelta(seconds=config.dist.timeout_s)
    # torch's own record of the collectives, for a hang's report; a user's setting kept
    os.environ.setdefault(internals.flight_recorder_variable(), str(FLIGHT_RECORDER_ENTRIES))
    dist.init_process_group(
        backend=backend,
        store=rendezvous_store(place, timeout),
        rank=place.rank,
        world_size=place.world_size,
        timeout=timeout,
        **init_kwargs,
    )
    # A group of its own: after a timed-out collective the main group's connections are closed.
    monitor = dist.new_group(backend="gloo", timeout=timeout)
    hosts: list = []
    if config.dist.nnodes > 1:
        hosts = [None] * place.world_size
        dist.all_gather_object(hosts, this_host(), group=monitor)
    try:
        yield DistContext(
            rank=place.rank,
            world_size=place.world_size,
            local_rank=place.local_rank,
            device=device,
            backend=backend,
            monitor=monitor,
            hosts=tuple(hosts),
        )
    except BaseException as exc:
        release_what_failed(exc)
        raise
    finally:
        dist.destroy_process_group()


def release_what_failed(exc: BaseException) -> None:
    """Free what a failed run's frames hold (the DDP model, whose reducer holds the group) while the group still
    lives, so that destroying the group, not the reducer, ends it.

    Otherwise the traceback keeps the model alive past `destroy_process_group`, and the reducer, freed later with
    the exception, ends the group itself: its destructor joins Gloo's worker thread holding the GIL
    (pytorch/pytorch#56297), while that thread, finishing the collective the failure left in flight, waits for
    the GIL to free its tensors. The failed rank hung there, its peers waiting on it for dist.timeout_s. The
    traceback keeps its text (file, line, function); only the frames' variables go.
    """
    import gc
    import traceback

    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        pending += [e.__cause__, e.__context__]
    gc.collect()  # a module's hooks may hold it in a cycle: collected now, not at some later allocation


def unwrap(model: nn.Module) -> nn.Module:
    """The bare module, for state dicts and FLOP counts (no `module.` or `_orig_mod.` prefixes)."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif (inner := internals.compiled_original(model)) is not model:
            model = inner
        else:
            return model


def ddp_module(model: nn.Module) -> nn.parallel.DistributedDataParallel | None:
    """The DDP wrapper, also when torch.compile wrapped it in turn."""
    model = getattr(model, "_orig_mod", model)
    return model if isinstance(model, nn.parallel.DistributedDataParallel) else None


def no_sync(model: nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps (a no-op unless DDP)."""
    ddp = ddp_module(model)
    if skip_sync and ddp is not None:
        return ddp.no_sync()
    return contextlib.nullcontext()


def dp_device_ids(config: RunConfig) -> list[int]:
    """The GPUs DataParallel drives: --dist.dp_gpus of them, else every visible one (its own default). Everything
    else that needs them (the GPU sampler, per-GPU memory peaks) reads them from here or the wrapped model."""
    return list(range(config.dist.dp_gpus or torch.cuda.device_count()))


def place_model(model: nn.Module, config: RunConfig, device: torch.device) -> nn.Module:
    """The model on `device`, in the memory format its run keeps (model.channels_last): training, `ddplab eval`
    and the sweep's probe place it alike."""
    model = model.to(device)
    if config.channels_last_on(device.type):
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


def wrap_model(
    model: nn.Module, config: RunConfig, ctx: DistContext, on_joined: Callable[[], None] | None = None
) -> nn.Module:
    """Place the model on its device and wrap it for the strategy; compile last. A DDP model's collectives go
    into `ctx.collectives` as they are entered (what a hang reads), and `on_joined` is called as a step's first
    gradient bucket goes to the all-reduce (the rank joins the step's collective: the step clocks); neither under
    a captured step, which runs no Python hook."""
    d = config.dist
    if d.sync_bn and ctx.is_distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = place_model(model, config, ctx.device)
    if d.strategy == "dp":
        model = nn.DataParallel(model, device_ids=dp_device_ids(config))
    elif ctx.is_distributed:
        graphs = config.cuda_graphs_on(ctx.device.type)[0]
        with side_stream(ctx.device) if graphs else contextlib.nullcontext():
            model = nn.parallel.DistributedDataParallel(
                model,
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                bucket_cap_mb=d.bucket_cap_mb,
                static_graph=d.static_graph,
                gradient_as_bucket_view=d.gradient_as_bucket_view,
                **compat.ddp_buffer_sync(),
            )
        if graphs:
            register_comm_hook(model, d.comm_hook)
        else:
            register_comm_hook(model, d.comm_hook, ctx.collectives, on_joined)
            record_buffer_broadcasts(model, ctx.collectives)
    if config.model.compile:
        # After DDP, so DDPOptimizer can split graphs at bucket boundaries.
        model = torch.compile(  # type: ignore[assignment]
            model, mode=None if config.model.compile_mode == "default" else config.model.compile_mode
        )
    return model


@contextlib.contextmanager
def side_stream(device: torch.device):
    """Work on a fresh CUDA stream, ordered after what the current stream queued and before what it
    queues next. A step captured in a CUDA graph needs DDP built off the default stream (PyTorch's
    CUDA graph notes); the waits keep DDP's parameter broadcast after the model's move to the GPU
    and its initialization, which were queued on the default stream. Nothing to do off CUDA."""
    if device.type != "cuda":
        yield
        return
    current, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield
    current.wait_stream(side)


def register_comm_hook(
    model: nn.parallel.DistributedDataParallel,
    name: str,
    collectives: Collectives | None = None,
    on_joined: Callable[[], None] | None = None,
) -> None:
    """The gradient all-reduce: DDP's own, or compressed to fp16/bf16 (halves the bytes on the wire); with
    `collectives` or `on_joined`, the same all-reduce (torch's allreduce_hook does what DDP's built-in one does:
    divide by the world size, then sum), each bucket recorded as it goes and `on_joined` told of the first."""
    if name == "none" and collectives is None and on_joined is None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = {
        "none": default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
    }[name]
    if collectives is not None or on_joined is not None:
        inner = hook

        def hook(state, bucket):
            index = bucket.index()
            if index == 0 and on_joined is not None:
                on_joined()
            if collectives is not None:
                buffer = bucket.buffer()
                collectives.bucket(index, bucket.is_last(), buffer.numel() * buffer.element_size())
            return inner(state, bucket)

    model.register_comm_hook(state=None, hook=hook)


def record_buffer_broadcasts(model: nn.parallel.DistributedDataParallel, collectives: Collectives) -> None:
    """DDP's forward broadcasts rank 0's buffers (BatchNorm's statistics) where it syncs them: a collective of its
    own, recorded as the forward starts."""
    nbytes = sum(b.numel() * b.element_size() for b in model.module.buffers())

    def entered(module: nn.Module, args: Any) -> None:
        if model.will_sync_module_buffers():
            collectives.enter("buffer broadcast", nbytes)

    if nbytes:
        model.register_forward_pre_hook(entered)

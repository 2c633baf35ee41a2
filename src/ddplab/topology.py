"""Is this process one worker of a launcher's group, and where does it sit? Decided once, here.

Launchers tell their workers who they are through environment variables: torchrun and
PyTorch's elastic agent set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; Slurm's srun sets SLURM_PROCID, SLURM_LOCALID and SLURM_STEP_NUM_TASKS for the
tasks of a step. The same variables leak to processes no launcher started for this run: the
batch script of an sbatch job (it has SLURM_PROCID=0 and SLURM_NTASKS of the whole job, but
no step), a shell or notebook opened inside a torchrun job, a stale `export RANK=0`. Joining a
group on such evidence waits `dist.timeout_s` for peers that never come.

So the environment says "worker" only on a launcher's full evidence: torchrun's four
variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or an srun step of more than one
task. Then the strategy must be ddp: a worker asked for `single` or `dp` is refused, as the
run it would record (one process) is not the one that ran. Partial evidence is ignored, and
said so. A malformed value that would be used is one line. Torch-free: the CLI and the sweep
decide before importing torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ddplab.errors import ConfigError

TORCHRUN_FULL = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
ROUND = "DDPLAB_RDZV_ROUND"  # the rendezvous round this worker group formed in (launch.CountedRendezvous)
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHRUN_MARKERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # any of them alone means someone meant a worker


@dataclass(frozen=True)
class ProcessPlace:
    """Where this process sits, as its launcher said."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str  # "torchrun" (torchrun, or the elastic agent behind `ddplab train --nproc`) or "srun"

    @property
    def nnodes(self) -> int:
        return self.world_size // self.local_world_size


@dataclass(frozen=True)
class Placement:
    place: ProcessPlace | None  # None: not a launcher's worker (a single process, or the root that launches)
    ignored: str | None = None  # launcher variables that were present and not used, and why


def _whole(env: Mapping[str, str], name: str, default: int | None = None, *, low: int = 0) -> int:
    raw = env.get(name)
    if raw is None and default is not None:
        return default
    if raw is None:
        raise ConfigError(
            f"environment variable {name} is not set, and the launcher's other variables are: "
            "start this process through the launcher (torchrun, srun), or unset them"
        )
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = None
    if value is None or value < low or len(str(raw).strip()) > 9:
        shown = repr(raw) if len(raw) <= 24 else repr(raw[:20]) + f"... ({len(raw)} characters)"
        raise ConfigError(
            f"environment variable {name}={shown} is not a whole number >= {low}; a launcher "
            "(torchrun, srun) sets it: unset it, or start this process through the launcher"
        )
    return value


def _torchrun_place(env: Mapping[str, str]) -> ProcessPlace:
    world = _whole(env, "WORLD_SIZE", low=1)
    rank = _whole(env, "RANK")
    local_world = _whole(env, "LOCAL_WORLD_SIZE", world, low=1)
    local_rank = _whole(env, "LOCAL_RANK", rank if local_world == world else None)
    return _checked(ProcessPlace(rank, world, local_rank, local_world, "torchrun"), "RANK", "LOCAL_RANK")


def _srun_place(env: Mapping[str, str]) -> ProcessPlace:
    world = _whole(env, "SLURM_STEP_NUM_TASKS", low=1)
    nodes = _whole(env, "SLURM_STEP_NUM_NODES", 1, low=1)
    if world % nodes:
        raise ConfigError(
            f"srun started {world} tasks on {nodes} nodes: ddplab needs the same number of tasks on "
            "every node (srun --ntasks-per-node)"
        )
    return _checked(
        ProcessPlace(_whole(env, "SLURM_PROCID"), world, _whole(env, "SLURM_LOCALID", 0), world // nodes, "srun"),
        "SLURM_PROCID",
        "SLURM_LOCALID",
    )


def _checked(place: ProcessPlace, rank_name: str, local_name: str) -> ProcessPlace:
    if place.rank >= place.world_size:
        raise ConfigError(f"environment: {rank_name}={place.rank} but the group has {place.world_size} processes")
    if place.local_rank >= place.local_world_size or place.world_size % place.local_world_size:
        raise ConfigError(
            f"environment: {local_name}={place.local_rank} with {place.local_world_size} processes "
            f"per node does not fit a group of {place.world_size}"
        )
    return place


def placement(strategy: str, env: Mapping[str, str] | None = None) -> Placement:
    """Whether the environment makes this process a worker, for a run with `strategy`."""
    env = os.environ if env is None else env
    if all(name in env for name in TORCHRUN_FULL):
        place = _torchrun_place(env)
    elif "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        place = _srun_place(env)
    else:
        return Placement(None, _stray(env))
    if place.world_size == 1:
        return Placement(None)  # a group of one is a single process, whatever the launcher
    if strategy != "ddp":
        names = "/".join(TORCHRUN_FULL) if place.launcher == "torchrun" else "SLURM_PROCID/SLURM_STEP_NUM_TASKS"
        raise ConfigError(
            f"this process was started by {place.launcher} as rank {place.rank} of {place.world_size} "
            f"({names} are set), but dist.strategy={strategy} trains one process: pass --strategy ddp "
            "to train as one of its workers, or unset those variables to train alone"
        )
    return Placement(place)


def _stray(env: Mapping[str, str]) -> str | None:
    """What looks like a launcher's variables but is not a launcher's full set (None: nothing)."""
    found = [name for name in TORCHRUN_MARKERS if name in env]
    if found:
        missing = [name for name in TORCHRUN_FULL if name not in env]
        return f"ignored {', '.join(found)}: without {', '.join(missing)} no launcher started this process as a worker"
    tasks = env.get("SLURM_NTASKS", "1").strip()
    if "SLURM_PROCID" in env and tasks != "1":
        return (
            f"ignored SLURM_NTASKS={tasks}: srun did not start this process (an sbatch script runs once; "
            "start the workers with srun, or ddplab's own --nproc)"
        )
    return None


def group_attempt(env: Mapping[str, str] | None = None) -> int:
    """Which start of the worker group this is (0: the first), the same number on every node.

    The elastic agent's TORCHELASTIC_RESTART_COUNT is not: a node whose own workers failed counts a
    restart, while a node restarted because another joined the next round (a membership change) does
    not (2 hosts, a link down past dist.timeout_s: 1 on one, 0 on the other). Read as the attempt, it
    split one group across two store namespaces (the Gloo connect refused at a dead peer's address), and
    left one node training from scratch beside a resumed one. ddplab's launcher counts the rendezvous
    rounds its agent joins, which every node joins alike; under another launcher (torchrun, srun) the
    restart count is all there is.
    """
    env = os.environ if env is None else env
    return int(env.get(ROUND) or env.get(RESTART_COUNT) or 0)


def usable_cores() -> list[int]:
    """The CPU cores this process may run on: its affinity, which containers, taskset and a parallel
    sweep's slots restrict, not the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def devices_brought(workers: int, nodes: int, *, on_cuda: bool) -> int:
    """The hardware `workers` on `nodes` bring, which perfect scaling multiplies speed by: their GPUs on CUDA; on
    a CPU their nodes (one node's processes share its cores). The one definition of the ideal speedup's terms,
    for the report, `ddplab compare` and the planner."""
    return workers if on_cuda else nodes


def resolve_backend(requested: str, *, on_cuda: bool, shared_device: bool = False) -> str:
    """The collective backend a DDP run uses: "auto" is NCCL on CUDA, Gloo on a CPU or where the workers
    share one GPU (NCCL refuses two ranks on one device). The one place "auto" is resolved."""
    if requested == "auto":
        return "nccl" if on_cuda and not shared_device else "gloo"
    return requested


def as_launched(config, place: ProcessPlace):
    """The config as it ran under a launcher: the processes per node and nodes the launcher made,
    so config.toml and the summary describe this run, and `--config` re-runs its shape."""
    dist = config.dist
    if (dist.nproc, dist.nnodes) == (place.local_world_size, place.nnodes):
        return config
    endpoint = dist.rdzv_endpoint
    if place.nnodes > 1 and endpoint is None:
        endpoint = f"{os.environ.get('MASTER_ADDR', 'localhost')}:{os.environ.get('MASTER_PORT', '29500')}"
    return dataclasses.replace(
        config,
        dist=dataclasses.replace(
            dist,
            nproc=place.local_world_size,
            nnodes=place.nnodes,
            node_rank=place.rank // place.local_world_size,
            rdzv_endpoint=endpoint,
        ),
    )

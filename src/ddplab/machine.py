"""A config checked against the machine it is about to run on: CUDA devices, worker processes this node can hold,
MPI in this torch build, MLflow installed, the data folder there. config.py checks what a value may be anywhere;
this checks what this machine can do, before any process is spawned, so a run that cannot start here says so in
one line and leaves no folder behind.
"""

from __future__ import annotations

from pathlib import Path

from ddplab.config import RunConfig, invalid, is_cuda_index
from ddplab.topology import resolve_backend
from ddplab.tracking import check_available


def check_environment(config: RunConfig) -> None:
    """Checks that depend on this machine, run before any process is spawned. With --device cpu nothing here
    imports torch (seconds on a small CPU): a config that cannot run there is answered at once."""
    device = config.train.device
    if device != "cpu":
        import torch
    has_cuda = device != "cpu" and torch.cuda.is_available()
    if device.startswith("cuda") and not has_cuda:
        raise invalid("train.device", device, "CUDA is not available on this machine; use --device cpu")
    if is_cuda_index(device) and int(device[5:]) >= torch.cuda.device_count():
        raise invalid("train.device", device, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    on_cuda = has_cuda  # never with --device cpu
    several = config.dist.strategy == "dp" or config.dist.nproc > 1
    if is_cuda_index(device) and several and not config.dist.share_device:
        raise invalid(
            "train.device", device, "with several devices per node use --device cuda: each rank takes cuda:LOCAL_RANK"
        )
    if (
        on_cuda
        and config.dist.strategy == "ddp"
        and not config.dist.share_device
        and config.dist.nproc > torch.cuda.device_count()
    ):
        raise invalid(
            "dist.nproc",
            config.dist.nproc,
            f"this node has {torch.cuda.device_count()} CUDA device(s), one per process",
        )
    if config.dist.strategy == "ddp" and (not on_cuda or config.dist.share_device):
        if why := too_many_processes(config.dist.nproc):
            raise invalid("dist.nproc", config.dist.nproc, why)
    backend = config.dist.backend
    if backend == "nccl" and not on_cuda:
        raise invalid("dist.backend", "nccl", "NCCL needs CUDA devices; use --backend gloo on CPU")
    if config.dist.strategy == "dp" and not on_cuda:
        raise invalid(
            "dist.strategy", "dp", "DataParallel needs CUDA devices; use --strategy ddp --backend gloo on CPU"
        )
    if config.dist.strategy == "dp" and config.dist.dp_gpus > torch.cuda.device_count():
        raise invalid("dist.dp_gpus", config.dist.dp_gpus, f"this node has {torch.cuda.device_count()} CUDA device(s)")
    resolved = resolve_backend(backend, on_cuda=on_cuda, shared_device=config.dist.share_device)
    if config.dist.comm_hook == "bf16" and resolved != "nccl":
        raise invalid("dist.comm_hook", "bf16", "bf16 gradient compression needs NCCL (CUDA); use fp16 with gloo")
    if config.train.cuda_graphs is True and not on_cuda:
        raise invalid("train.cuda_graphs", True, "CUDA graphs need a CUDA device, and this machine has none")
    if config.dist.sync_bn and not on_cuda:
        raise invalid("dist.sync_bn", True, "SyncBatchNorm runs on CUDA devices only")
    m = config.model
    if on_cuda and m.compile and m.compile_mode == "reduce-overhead" and config.train.accumulate > 1:
        raise invalid(
            "train.accumulate",
            config.train.accumulate,
            "with --model.compile_mode reduce-overhead on CUDA the gradients are outputs of the backward's CUDA "
            "graph, which the next micro-batch overwrites before it accumulates into them; use --train.cuda_graphs "
            "(the whole step, accumulation included) or compile_mode default",
        )
    if backend == "mpi" and not _mpi_available():
        raise invalid("dist.backend", "mpi", "this PyTorch build has no MPI support; use gloo or nccl")
    check_available(config.output.mlflow)
    data = config.data
    if data.data_dir is not None and not Path(data.data_dir).expanduser().is_dir():
        raise invalid("data.data_dir", data.data_dir, "the folder does not exist")
    if data.dataset == "imagefolder" and data.data_dir is None:
        raise invalid("data.data_dir", None, "--dataset imagefolder needs --data-dir pointing at the image folder")


WORKER_MIB = 200  # what a worker process holds once it has imported torch (218 MiB resident, a 2-core EPYC, torch 2.13)


def too_many_processes(nproc: int) -> str:
    """Why this node cannot hold `nproc` worker processes ("" where it can): more than the processes this user
    may start (RLIMIT_NPROC), or than this machine's memory holds at WORKER_MIB each. On a CPU the processes share
    the cores, so any count is allowed that the machine can start at all: a typo's 10^11 is not."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if limit != resource.RLIM_INFINITY and nproc > limit:
        return f"this user may start at most {limit} processes (ulimit -u)"
    try:
        with open("/proc/meminfo") as f:
            available_kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return ""
    if nproc * WORKER_MIB * 1024 > available_kib:
        return (
            f"each worker process holds about {WORKER_MIB} MiB once it has imported torch, and this machine has "
            f"{available_kib / 2**20:.1f} GiB available: at most {available_kib // (WORKER_MIB * 1024)} workers"
        )
    return ""


def _mpi_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_mpi_available()

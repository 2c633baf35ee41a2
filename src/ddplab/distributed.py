"""Who this process is (rank, world size, device) and the few collectives the loop needs.

The loop is written against `DistContext` only: at world size 1 every collective is a
no-op, so the single-process path and the distributed one run the same code (contract 1,
STYLE rule 8). `wrap_model` is the one place where strategies differ in how the model is
held.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from ddplab.config import RunConfig
from ddplab.errors import ConfigError


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None  # None: no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns the tensor for chaining."""
        if self.is_distributed:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """Per-rank lists of floats (for per-rank time and memory tables)."""
        local = torch.tensor(values, dtype=torch.float64, device=self.device)
        if not self.is_distributed:
            return [local.tolist()]
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        torch.distributed.all_gather(gathered, local)
        return [g.tolist() for g in gathered]

    def any_true(self, flag: bool) -> bool:
        """True on every rank if it is true on any rank, so all ranks stop together."""
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        return bool(self.all_reduce_sum(t).item() > 0)

    def barrier(self) -> None:
        if self.is_distributed:
            torch.distributed.barrier()


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before any allocation, or every rank touches GPU 0
    return device


@contextlib.contextmanager
def distributed_context(config: RunConfig) -> Iterator[DistContext]:
    """Set up this process's place in the run and always tear it down.

    Multi-process strategies are added by the distributed issue; until then a run is one
    process, and asking for more is a config error rather than a silent single run.
    """
    if config.world_size() > 1 or "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("dist.strategy=ddp with several processes is not available in this version")
    device = resolve_device(config.train.device)
    yield DistContext(device=device)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare module, for state dicts and FLOP counts (no `module.` or `_orig_mod.` prefixes)."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def no_sync(model: nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps (a no-op unless DDP)."""
    if skip_sync and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def wrap_model(model: nn.Module, config: RunConfig, ctx: DistContext) -> nn.Module:
    """Place the model on its device and wrap it for the strategy; compile last."""
    model = model.to(ctx.device)
    if config.model.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if config.dist.strategy == "dp":
        model = nn.DataParallel(model)
    if config.model.compile:
        model = torch.compile(model)
    return model

"""The machine's side of an epoch: each rank's CPU time and what it competed with, peak memory, GPU samples.

Taken around the epoch's training (CPU) and through its evaluation (GPU samples), gathered from every rank in
the same collectives on each, so an epoch's record says whether its clock measured the run or the machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ddplab.distributed import DistContext
from ddplab.metrics import contention
from ddplab.metrics.gpu import GpuSampler
from ddplab.metrics.gpu import summarize as summarize_gpu
from ddplab.metrics.system import peak_alloc_per_gpu_mib, peak_memory_mib, reset_peak_memory


@dataclass
class Readings:
    load: dict[str, Any]  # the epoch's contention figures (metrics/contention.py)
    memory: dict[str, Any]  # peaks on this rank's device (and on each of DataParallel's GPUs)
    gpu: dict[str, float] = field(default_factory=dict)  # this rank's utilization and memory; NaN: not measured
    gpu_rows: list[dict[str, Any]] = field(default_factory=list)  # every rank's samples (gpu.jsonl)
    cpu_s: list[float | None] = field(default_factory=list)  # each rank's CPU seconds in training


class EpochReadings:
    """`start()` before the epoch's training, `training_ended()` when its clock stops, `finish()` after its
    evaluation."""

    def __init__(self, ctx: DistContext, model: torch.nn.Module, gpu_sampler: GpuSampler | None):
        self.ctx, self.gpu_sampler = ctx, gpu_sampler
        self.dp_gpus = model.device_ids if isinstance(model, torch.nn.DataParallel) else None

    def start(self) -> EpochReadings:
        self.sampler = self.gpu_sampler.start() if self.gpu_sampler is not None else None
        reset_peak_memory(self.ctx.device, self.dp_gpus)
        self.cpu_start = contention.snapshot()
        return self

    def training_ended(self) -> None:
        self.cpu_end = contention.snapshot()

    def finish(self, epoch: int, train_s: float) -> Readings:
        gpu_other = self.gpu_sampler.other_processes() if self.gpu_sampler is not None else None
        load: dict[str, Any] = contention.epoch_contention(
            self.ctx.all_gather_floats(contention.rank_interval(self.cpu_start, self.cpu_end, gpu_other)), train_s
        )
        memory: dict[str, Any] = peak_memory_mib(self.ctx.device)
        if self.dp_gpus is not None:  # one process, many GPUs: one figure per GPU
            memory["gpu_peak_alloc_mib"] = peak_alloc_per_gpu_mib(self.dp_gpus)
        readings = Readings(load=load, memory=memory, cpu_s=load.pop("rank_cpu_s"))
        if self.sampler is not None:  # on every rank or none: the figures are gathered
            rows = self.sampler.stop()
            figures = summarize_gpu(rows)
            gpu = {"gpu_util_pct": figures["mean_util_pct"], "gpu_mem_used_mib": figures["peak_mem_used_mib"]}
            readings.gpu = {k: math.nan if v is None else v for k, v in gpu.items()}  # NaN -> null: not measured
            readings.gpu_rows = [{"epoch": epoch, **row} for rows in self.ctx.gather_objects(rows) for row in rows]
        return readings

"""Where the points of a parallel sweep run (`ddplab sweep --parallel N`): each on its own cores and GPUs.

With N slots, the cores this process may use are split into N groups of at least one core
(sizes differ by one at most), and a point runs held to one group: its threads follow, as
ddplab gives a process the cores it may use and splits them between a node's workers
(`distributed.set_cpu_threads`; $OMP_NUM_THREADS is not passed on, `--set train.threads=K`
still sets them). On CUDA a point also takes the GPUs it needs, named to it through
CUDA_VISIBLE_DEVICES, and never shares one: a DDP point one per worker, DataParallel every
GPU, a single-process point one (a `--dist.share_device` point one for all its workers); a
point that takes k GPUs takes k groups of cores with them (at most all), so an 8-GPU point
under `--parallel auto` on an 8-GPU node has the node's cores. A point that names its GPU
(`cuda:N`) is refused with `--parallel` above 1: its GPU is cuda:0 in its own process.
Points start in the sweep's order, each when a group of cores and its GPUs are free, so a
1-GPU machine runs its CUDA points one at a time whatever N is (and says so). With N = 1
nothing is held or renamed: each point has the whole machine, as a sequential sweep always did.

Points that run at once share the machine's memory bandwidth and caches, and each one's
contention readings see the others: the report marks their timings as measured under load.
A sweep for timings runs one point at a time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddplab.config import RunConfig
from ddplab.errors import ConfigError
from ddplab.io.arguments import AUTO
from ddplab.io.borders import shown
from ddplab.topology import usable_cores


@dataclass(frozen=True)
class Slot:
    cores: tuple[int, ...] = ()  # (): not held, the whole machine
    gpus: tuple[str, ...] = ()  # as CUDA_VISIBLE_DEVICES names them; (): not renamed

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        if self.cores:
            env.pop("OMP_NUM_THREADS", None)  # threads follow the cores held
        return env

    def describe(self) -> str:
        if not self.cores:
            return "the whole machine"
        cores = f"core{'s' * (len(self.cores) > 1)} {','.join(map(str, self.cores))}"
        return cores + (f", GPU{'s' * (len(self.gpus) > 1)} {','.join(self.gpus)}" if self.gpus else "")


def gpus_needed(config: RunConfig, gpus: int) -> int:
    """The GPUs a point takes on a machine with `gpus` of them (0: a CPU point, or no GPU here)."""
    if gpus == 0 or config.train.device == "cpu":
        return 0
    if config.dist.strategy == "dp":
        return config.dist.dp_gpus or gpus
    if config.dist.strategy == "ddp" and not config.dist.share_device:
        return config.dist.nproc
    return 1


def visible_gpus() -> list[str]:
    """This machine's GPUs as this process sees them, by the names a child's CUDA_VISIBLE_DEVICES takes."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    inherited = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    return inherited[:count] if inherited else [str(i) for i in range(count)]


def split_cores(cores: Sequence[int], slots: int) -> list[tuple[int, ...]]:
    """`cores` in `slots` contiguous groups whose sizes differ by one at most."""
    size, extra = divmod(len(cores), slots)
    groups, at = [], 0
    for i in range(slots):
        take = size + (i < extra)
        groups.append(tuple(cores[at : at + take]))
        at += take
    return groups


class SlotPool:
    """The free cores and GPUs of this machine, taken by a point when it starts and given back when it ends."""

    def __init__(self, parallel: int | str, *, cores: Sequence[int] | None = None, gpus: Sequence[str] | None = None):
        cores = list(usable_cores() if cores is None else cores)
        self.gpus = list(visible_gpus() if gpus is None and parallel != 1 else gpus or [])
        self.requested, self.cores = parallel, len(cores)
        # AUTO: one point per GPU on a CUDA machine; one at a time on a CPU (clean timings).
        count = max(1, min(len(self.gpus), len(cores))) if parallel == AUTO else int(parallel)
        if count > len(cores):
            raise ConfigError(
                f"--parallel {count}: this process may use {len(cores)} CPU core(s), and a point "
                "never gets fewer than one; give at most that many"
            )
        self.parallel = count
        self.groups: list[tuple[int, ...]] = split_cores(cores, count) if count > 1 else [()]
        self.free_cores = list(self.groups)
        self.free_gpus = list(self.gpus) if count > 1 else []

    def take(self, config: RunConfig) -> Slot | None:
        """A slot for a point of `config`, or None while what it needs is in use. A point that takes k GPUs
        takes k groups of cores (all of them at most): its k workers need their cores too."""
        need = gpus_needed(config, len(self.gpus)) if self.parallel > 1 else 0
        groups = min(max(1, need), self.parallel)
        if len(self.free_cores) < groups or need > len(self.free_gpus):
            return None
        taken, self.free_cores = self.free_cores[:groups], self.free_cores[groups:]
        gpus, self.free_gpus = self.free_gpus[:need], self.free_gpus[need:]
        return Slot(tuple(core for group in taken for core in group), tuple(gpus))

    def give_back(self, slot: Slot) -> None:
        groups = [g for g in self.groups if set(g) <= set(slot.cores)] if slot.cores else [()]
        self.free_cores = sorted([*self.free_cores, *groups])
        self.free_gpus = sorted([*self.free_gpus, *slot.gpus], key=self.gpus.index)

    def refuse_fixed_devices(self, configs: list[tuple[str, RunConfig]]) -> None:
        """A point that names its GPU (train.device cuda:N) cannot be given one of its own: refused with
        --parallel above 1, before anything runs."""
        if self.parallel == 1:
            return
        for name, config in configs:
            if config.train.device.startswith("cuda:"):
                raise ConfigError(
                    f"sweep run {name} asks for train.device={config.train.device}: with --parallel each "
                    "run is given its own GPUs, seen as cuda:0, cuda:1, ...; use train.device=cuda"
                )

    def fits(self, config: RunConfig) -> bool:
        """Whether a point of `config` could ever start here (when nothing else runs)."""
        return self.parallel == 1 or gpus_needed(config, len(self.gpus)) <= len(self.gpus)

    def describe(self) -> str:
        if self.parallel == 1:
            chosen = (
                f" (--parallel auto: {len(self.gpus)} GPU(s), {self.cores} core(s))" if self.requested == AUTO else ""
            )
            return "one point at a time, each with the whole machine" + chosen
        sizes = sorted({len(g) for g in self.groups})
        cores = "-".join(map(str, sizes))
        text = f"up to {self.parallel} points at once, {cores} CPU core{'s' * (sizes[-1] > 1)} each"
        if self.gpus:
            text += f"; {len(self.gpus)} GPU(s), never shared: a CUDA point waits for the GPUs it needs"
            if len(self.gpus) < self.parallel:
                text += f" (at most {len(self.gpus)} one-GPU point(s) at a time)"
        return text


def points_at_once(value: object, owner: str, *, unset_ok: bool = False) -> None:
    """An executor's `parallel`, as a Python caller gives it: a whole number >= 1 or "auto" (None where the
    executor has its own default); anything else is one ConfigError naming the argument, before a folder is made."""
    whole = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if not (whole or value == AUTO or (value is None and unset_ok)):
        raise ConfigError(
            f"{owner}(parallel={shown(value)}): the points to run at once are a whole number >= 1 or {AUTO!r}"
            + (" (None: as many as fit)" if unset_ok else "")
        )

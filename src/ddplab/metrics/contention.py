"""What a run competed with while it trained, so that a report can tell a setting from the load.

A clock measures the machine as much as the setting: a run that shared its cores with
another job is slower for a reason its config does not hold. So around each epoch's
training every rank takes a `CpuSnapshot` (wall clock, its own CPU time, and from the
kernel the machine's busy and stolen CPU time and its CPU pressure), and the epoch's record
says, per node, what the *other* processes used in that interval:

    other_cpu_share     (machine busy CPU time - this run's processes' CPU time) / (wall x CPUs)
    steal_share         CPU time the hypervisor gave to other guests / (wall x CPUs)
    cpu_pressure_share  share of the wall time in which some runnable task waited for a CPU (PSI)
    load_avg_1m         the kernel's one-minute load average at the end of the epoch

and each rank's own CPU seconds (`rank_cpu_s`: divided by `train_s` it is the cores the rank
kept busy). On CUDA the GPU sampler adds `gpu_other_processes`, the processes on a rank's
GPU besides the run's own. Readings that a machine does not offer (no /proc, no PSI) are
None, never a guess. Torch-free: the report's rules on what counts as contended live in
`ddplab.report.noise`.
"""

from __future__ import annotations

import math
import os
import socket
import time
import zlib
from dataclasses import dataclass

PROC_STAT = "/proc/stat"
PROC_PRESSURE = "/proc/pressure/cpu"
BUSY_FIELDS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq (guest time is inside user)
STEAL_FIELD = 7


@dataclass(frozen=True)
class CpuSnapshot:
    wall_s: float
    own_cpu_s: float  # this process, every thread, user + system
    busy_s: float | None  # the machine: every CPU's non-idle time (None: /proc/stat unreadable)
    steal_s: float | None
    pressure_s: float | None  # PSI "some": time with a runnable task waiting (None: no PSI)
    cpus: int
    node: int  # which machine: a checksum of the host name, so ranks can be grouped by node


def snapshot(stat_path: str = PROC_STAT, pressure_path: str = PROC_PRESSURE) -> CpuSnapshot:
    busy, steal, cpus = read_proc_stat(stat_path)
    return CpuSnapshot(
        wall_s=time.perf_counter(),
        own_cpu_s=time.process_time(),
        busy_s=busy,
        steal_s=steal,
        pressure_s=read_pressure(pressure_path),
        cpus=cpus or os.cpu_count() or 1,
        node=zlib.crc32(socket.gethostname().encode()),
    )


def read_proc_stat(path: str = PROC_STAT) -> tuple[float | None, float | None, int]:
    """(busy s, steal s, CPUs) summed over the machine's CPUs since boot; None where unreadable."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
        ticks = os.sysconf("SC_CLK_TCK")
        total = next(line.split()[1:] for line in lines if line.startswith("cpu "))
        values = [int(v) for v in total]
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        steal = values[STEAL_FIELD] / ticks if len(values) > STEAL_FIELD else None
        return sum(values[i] for i in BUSY_FIELDS) / ticks, steal, cpus
    except (OSError, ValueError, StopIteration, IndexError):
        return None, None, 0


def read_pressure(path: str = PROC_PRESSURE) -> float | None:
    """Seconds, since boot, during which at least one runnable task waited for a CPU (PSI "some")."""
    try:
        with open(path) as f:
            some = next(line for line in f if line.startswith("some "))
        total_us = next(part for part in some.split() if part.startswith("total="))
        return int(total_us.removeprefix("total=")) / 1e6
    except (OSError, ValueError, StopIteration):
        return None


def rank_interval(start: CpuSnapshot, end: CpuSnapshot, gpu_other: int | None = None) -> list[float]:
    """One rank's row for the epoch's gather: own CPU s, machine busy s, steal s, pressure s, CPUs,
    node, other processes on its GPU.

    Unknown readings are NaN, so that every row is the same list of floats.
    """

    def delta(a: float | None, b: float | None) -> float:
        return math.nan if a is None or b is None else max(b - a, 0.0)

    return [
        end.own_cpu_s - start.own_cpu_s,
        delta(start.busy_s, end.busy_s),
        delta(start.steal_s, end.steal_s),
        delta(start.pressure_s, end.pressure_s),
        float(end.cpus),
        float(end.node),
        math.nan if gpu_other is None else float(gpu_other),
    ]


def epoch_contention(rows: list[list[float]], wall_s: float) -> dict[str, float | list[float] | None]:
    """The epoch record's contention fields from every rank's `rank_interval` row.

    Ranks on one node see the same machine counters: the run's CPU time there is the sum of
    its ranks', and everything else busy on that node was another process. The worst node
    is reported.
    """
    nodes: dict[float, list[list[float]]] = {}
    for row in rows:
        nodes.setdefault(row[5], []).append(row)
    other, steal, pressure = [], [], []
    for members in nodes.values():
        own = sum(r[0] for r in members)
        busy, stolen, waited, cpus = members[0][1], members[0][2], members[0][3], members[0][4]
        capacity = wall_s * cpus
        if capacity > 0:
            other.append(max(busy - own, 0.0) / capacity)
            steal.append(stolen / capacity)
        pressure.append(waited / wall_s if wall_s > 0 else math.nan)
    gpu_other = worst([r[6] for r in rows])
    return {
        "rank_cpu_s": [round(r[0], 3) for r in rows],
        "other_cpu_share": worst(other),
        "steal_share": worst(steal),
        "cpu_pressure_share": worst(pressure),
        "load_avg_1m": load_average(),
        "gpu_other_processes": None if gpu_other is None else int(gpu_other),
    }


def worst(values: list[float]) -> float | None:
    known = [v for v in values if math.isfinite(v)]
    return round(max(known), 4) if known else None


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None

"""The epoch record (one line of metrics.jsonl), typed, and the schema version it shares with
summary.json (rundir/summary.py reads that): the one module that reads and writes epoch records.

The trainer writes it, the summary adds it up, the report (which reads run folders anywhere
and never imports torch) turns it into shares, a sweep watches it grow: all through
`EpochRecord`. On disk it is a flat JSON object (a field not measured is left out, per-rank
lists are `rank_<name>`) with the schema version; records written before the version was
written are version 1, the same fields, and read as such. Torch-free.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ddplab.errors import DataError
from ddplab.io.borders import COUNT, SHARE, WHOLE, list_of, number
from ddplab.rundir import runfiles

SCHEMA_VERSION = 2  # of metrics.jsonl's records and summary.json; 1: written before the version was (same fields)

# Where an epoch's training time went, each summed over its steps. `comm_wait_s` is a probe
# of the all-reduce's wait, measured inside `forward_backward_s`, so the shares of training
# time add up only with comm wait counted inside forward+backward ("of which", never beside it).
PHASES = ("data_s", "forward_backward_s", "optimizer_s", "comm_wait_s")
MEMORY = ("peak_rss_mib", "peak_alloc_mib", "peak_reserved_mib")  # a rank's peak: RSS on CPU, the rest on CUDA
RANK_PREFIX = "rank_"  # a per-rank list's key in the file: rank_<name>

# The step clocks given as a distribution over an epoch's steps (metrics/stragglers.distribution), and how each of
# an epoch's per-rank clock figures (metrics/stragglers.clock_figures) combines over the run's epochs: a median, a
# p95 or a spread by the median of the epochs', a max by their max, a share by their mean. The one place that says
# it: summary.json's per-rank figures and its `stragglers` both read it.
DISTRIBUTED = ("step", "data", "waited")
ACROSS_EPOCHS: dict[str, Callable[[list[float]], float]] = {
    **{
        f"{name}_{stat}_s": how
        for name in DISTRIBUTED
        for stat, how in (("median", statistics.median), ("p95", statistics.median), ("max", max))
    },
    "joined_median_s": statistics.median,
    "joined_mad_s": statistics.median,
    "last_share": statistics.fmean,
}


@dataclass(frozen=True)
class EpochRecord:
    """One finished epoch, as every rank agrees on it (losses and accuracies are global)."""

    epoch: int
    step: int  # optimizer steps taken so far
    lr: float  # the rate the epoch's last step used
    train_loss: float  # running, over the augmented batches trained on
    train_acc: float
    test_loss: float  # the evaluation set (test set, or the held-out split)
    test_acc: float
    train_samples: int
    test_samples: int
    epoch_s: float  # train_s + eval_s
    train_s: float
    eval_s: float
    images_per_s: float  # training images per second of train_s
    train_eval_loss: float | None = None  # training images measured as the test set is (train.eval_train_images)
    train_eval_acc: float | None = None
    # PHASES: None when the run did not split its step time
    data_s: float | None = None
    forward_backward_s: float | None = None
    optimizer_s: float | None = None
    comm_wait_s: float | None = None
    # What else used the machine (metrics/contention.py): None where not measured
    other_cpu_share: float | None = None
    steal_share: float | None = None
    cpu_pressure_share: float | None = None
    load_avg_1m: float | None = None
    gpu_other_processes: int | None = None
    # The spread between the ranks' join times (metrics/stragglers.spreads): all ranks', one host's ranks'
    # (in_node) and the hosts' (across_nodes); None where the run cannot show it (one rank, one host)
    join_spread_share: float | None = None
    join_spread_in_node_share: float | None = None
    join_spread_across_nodes_share: float | None = None
    # The workers the epoch's training ended on (a membership that changed may have trained it on others too)
    workers: int | None = None
    # Peak memory: resident set on CPU, allocated and reserved on CUDA, per GPU under DataParallel
    peak_rss_mib: float | None = None
    peak_alloc_mib: float | None = None
    peak_reserved_mib: float | None = None
    gpu_peak_alloc_mib: list[float] | None = None
    # Each rank's own figures, by name (cpu_s, train_s, samples, memory, GPU readings); rank_<name> on disk
    per_rank: dict[str, list[float | None]] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    def metric(self, name: str) -> float:
        """A scalar field by its name (early stopping's metric, a report column)."""
        if name not in SCALARS:
            raise KeyError(f"no scalar field {name!r} in an epoch record")
        return getattr(self, name)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.schema}
        for f in FIELDS:
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        out.update({RANK_PREFIX + name: values for name, values in self.per_rank.items()})
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "an epoch record") -> EpochRecord:
        """A record from its JSON object (a file's line, or a checkpoint's state); a missing field, a value of
        the wrong kind or a newer schema is a DataError naming `where` and the field. NaN in a reading that
        may be missing is read as missing: the file says null there (files.finite)."""
        if not isinstance(data, dict):
            raise DataError(f"{where} is not a JSON object")
        schema = check_schema(data, where)
        values: dict[str, Any] = {}
        for f in FIELDS:
            if f.name not in data or data[f.name] is None:
                if f.name in REQUIRED:
                    raise DataError(
                        f"{where} lacks {f.name}, which ddplab always writes: written by another program, or edited?"
                    )
                continue
            values[f.name] = _checked(
                data[f.name], f.name, where, many=f.name in LISTS, optional=f.name not in REQUIRED
            )
        per_rank = {
            key.removeprefix(RANK_PREFIX): _checked(value, key, where, many=True, optional=True)
            for key, value in data.items()
            if key.startswith(RANK_PREFIX)
        }
        return cls(**values, per_rank=per_rank, schema=schema)


FIELDS = tuple(f for f in fields(EpochRecord) if f.name not in ("per_rank", "schema"))
REQUIRED = frozenset(f.name for f in FIELDS if f.default is not None)
LISTS = frozenset({"gpu_peak_alloc_mib"})
SCALARS = frozenset(f.name for f in FIELDS) - LISTS


# What each field holds (borders.py): counts are whole, accuracies shares, everything else a finite number >= 0.
KINDS = {
    "epoch": COUNT,
    "step": WHOLE,
    "train_samples": COUNT,
    "test_samples": COUNT,
    "gpu_other_processes": WHOLE,
    "train_acc": SHARE,
    "test_acc": SHARE,
    "train_eval_acc": SHARE,
    "gpu_peak_alloc_mib": list_of(number(0) | None),
}
PER_RANK = list_of(number() | None)


def _unmeasured(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _checked(value: Any, name: str, where: str, *, many: bool, optional: bool) -> Any:
    if optional:
        value = (
            [None if _unmeasured(v) else v for v in value]
            if many and isinstance(value, list)
            else None
            if _unmeasured(value)
            else value
        )
        if value is None:
            return None
    return (PER_RANK if many and name not in KINDS else KINDS.get(name, number(0))).check(value, where, name)


def read_epochs(path: Path, run_dir: Path | None = None, *, growing: bool = False) -> list[EpochRecord]:
    """A run folder's metrics.jsonl. `growing`: the file of a run still training, whose last line may be
    half written: the records before it."""
    if growing:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return []
        records = []
        for line_no, line in enumerate(filter(str.strip, lines), 1):
            try:
                records.append(EpochRecord.from_json(runfiles.json_line(line), f"{path} line {line_no}"))
            except (ValueError, DataError):
                break
        return records
    return [
        EpochRecord.from_json(record, f"{path} line {number}")
        for number, record in enumerate(runfiles.read_jsonl(path, run_dir or Path(path).parent), 1)
    ]


def check_schema(data: dict[str, Any], where: str) -> int:
    """The schema version `data` was written with (1 when it says none); one this ddplab cannot read is a DataError."""
    schema = data.get("schema", 1)
    if not isinstance(schema, int) or isinstance(schema, bool) or not 1 <= schema <= SCHEMA_VERSION:
        raise DataError(
            f"{where} has schema {repr(schema)[:20]}; this ddplab reads schema 1 to {SCHEMA_VERSION} "
            "(written by a newer ddplab?)"
        )
    return schema


# Fields that measure the machine (clocks, memory, load), not the math: two runs of one config
# may differ in these and nothing else. A new field measured from the machine must end with a
# suffix below or be listed, or determinism checks would compare it.
MACHINE_SUFFIXES = ("_s", "_per_s", "_mib", "_share", "_pct")
MACHINE_FIELDS = ("load_avg_1m", "gpu_other_processes")


def is_machine_field(name: str) -> bool:
    return name.endswith(MACHINE_SUFFIXES) or name in MACHINE_FIELDS


def reproducible(record: EpochRecord | dict[str, Any], *, per_rank: bool = True) -> dict[str, Any]:
    """A record as written, less what measures the machine: what two runs of one config must agree on
    (`per_rank=False`: each rank's lists and the worker count left out too, to compare runs over different worker
    counts)."""
    data = record.to_json() if isinstance(record, EpochRecord) else record
    return {
        k: v
        for k, v in data.items()
        if not is_machine_field(k) and (per_rank or not (k.startswith(RANK_PREFIX) or k == "workers"))
    }


def gap_train_acc(record: EpochRecord | None) -> tuple[float | None, str]:
    """The train side of the train-test gap in an epoch record, and which field it is: training images
    measured as the test set is when the run checked them (train.eval_train_images), else the running
    accuracy over augmented batches, which is not the same kind of figure."""
    if record is not None and record.train_eval_acc is not None:
        return record.train_eval_acc, "train_eval_acc"
    return (record.train_acc if record is not None else None), "train_acc (running, augmented)"


def timed_epochs(history: list[EpochRecord]) -> list[EpochRecord]:
    """The epochs whose clocks count (the report's, the scaling model's): all but the first, which warms
    caches, unless there is one."""
    return history[1:] or history


def refresh_windows(steps: list[dict[str, Any]], epochs: int) -> list[tuple[float, int]]:
    """(seconds, optimizer steps) between consecutive progress refreshes of one epoch (steps.jsonl), over the
    epochs that are timed (timed_epochs: all but the first of a run of several): the report's timing noise and
    the scaling model's step spread read a run's clock here."""
    by_epoch: dict[Any, list[dict[str, Any]]] = {}
    for r in steps:
        if isinstance(r.get("t_s"), (int, float)) and isinstance(r.get("step"), (int, float)):
            by_epoch.setdefault(r.get("epoch"), []).append(r)
    windows = []
    for epoch, records in by_epoch.items():
        if epochs > 1 and epoch == 1:
            continue
        for a, b in itertools.pairwise(records):
            dt, ds = b["t_s"] - a["t_s"], b["step"] - a["step"]
            if dt > 0 and ds > 0:
                windows.append((dt, int(ds)))
    return windows


def training_rate(history: list[EpochRecord]) -> float | None:
    """Training images a second over the timed epochs (the report's throughput); None when they took no time."""
    steady = timed_epochs(history)
    train_s = sum(r.train_s for r in steady)
    return sum(r.train_samples for r in steady) / train_s if train_s else None


def optimizer_steps(records: list[EpochRecord], global_batch: int) -> int:
    """Optimizer steps the epochs of `records` took at `global_batch` images a step (a ragged last one counts)."""
    return sum(math.ceil(r.train_samples / global_batch) for r in records)


def worst_reading(records: list[EpochRecord], name: str) -> float | None:
    """The highest finite reading of the field `name` over epoch records (None: never measured), as the
    summary and the report judge a run's load."""
    values = [v for r in records if (v := r.metric(name)) is not None and math.isfinite(v)]
    return max(values) if values else None

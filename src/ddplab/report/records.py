"""The report's records: what a run, a point, a pair of points and a section hold, read by every report module.

At the bottom of report/ (it imports none of its modules but runs.py, the point's own record), so that the
modules that fill these records in (figures, noise, predictions, sections) and those that read them (findings,
kinds, headline, tables, plots, html) import types one way, type checks included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict, cast, get_type_hints

from ddplab.planner.band import Band
from ddplab.planner.links import MeasuredLinks
from ddplab.report.runs import Point
from ddplab.rundir.runread import Run

Number = float | None  # a figure, or None where not measured


@dataclass(frozen=True)
class Made:
    """How a point's row is made of its runs' rows (figures.point_rows), in Row's declaration of each field."""

    how: str


SAID = Made("the runs' own word when they all agree, else 'mixed'")
SETTING = Made("the runs' own setting when they all agree, else 'mixed'")
MEASURED_FIGURE = Made("the mean over the point's seeds, with its sample standard deviation as `<name>_std`")

Said = Annotated[str | None, SAID]
Setting = Annotated[int | str | None, SETTING]  # a number, or "mixed" on a point whose runs differ
Measured = Annotated[Number, MEASURED_FIGURE]

CONTENDED_OTHER_CPU = 0.10  # other processes used at least 10% of the machine's CPU time while it trained
CONTENDED_STEAL = 0.05  # the hypervisor took at least 5% of the CPU time


@dataclass(frozen=True)
class Load:
    """The worst contention a run's timed epochs saw; None fields were not measured."""

    other_cpu: float | None
    steal: float | None
    gpu_others: int | None
    shared_device: bool = False  # its workers shared one GPU on purpose (--dist.share_device)

    @property
    def measured(self) -> bool:
        return self.other_cpu is not None or self.gpu_others is not None

    @property
    def contended(self) -> bool:
        return (
            (self.other_cpu or 0.0) >= CONTENDED_OTHER_CPU
            or (self.steal or 0.0) >= CONTENDED_STEAL
            or (self.gpu_others or 0) > 0
            or self.shared_device
        )

    def why(self) -> str:
        parts = []
        if (self.other_cpu or 0.0) >= CONTENDED_OTHER_CPU:
            parts.append(f"other processes used up to {self.other_cpu:.0%} of the CPUs")
        if (self.steal or 0.0) >= CONTENDED_STEAL:
            parts.append(f"the hypervisor took {self.steal:.0%} of the CPU time")
        if self.shared_device:
            parts.append("its workers shared one GPU (--dist.share_device: a correctness check, never a speed figure)")
        elif self.gpu_others:
            parts.append(f"{self.gpu_others} other process(es) shared its GPU")
        return " and ".join(parts)


@dataclass(frozen=True)
class Timing:
    """A point's training throughput with its relative noise and where the noise comes from."""

    images_per_s: float
    noise: float | None  # relative (0.02 = ±2%); None: not measured
    basis: str  # "seeds" (run-to-run) | "within-run" | "none"


@dataclass(frozen=True)
class Verdict:
    word: str  # "beyond noise" | "within noise" | "unreliable" | "single run" (timing) | "single seed" (accuracy)
    why: str = ""  # what the word rests on, said after it

    def text(self) -> str:
        return f"{self.word} ({self.why})" if self.why else self.word


@dataclass(frozen=True)
class Overfit:
    """What a point's mean curve says about overfitting (`overfitting`)."""

    min_epoch: int
    min_test_loss: float
    final_test_loss: float
    rise: float  # the final test loss over its lowest, less 1
    overfits: bool
    train_key: str  # the training loss it read: train_eval_loss where measured, else train_loss
    stop_epoch: int | None  # where early stopping would have stopped (None: not before the end)
    stop_test_acc: float | None
    epochs: int


class Row(TypedDict, total=False):
    """A run's figures (`run_row`) or a point's (`point_rows`), and what the sections add: declared once, here. A
    dict, as tables, CSV columns and plots read it by name; typed, so that a name read wrong is a type error, not a
    silent None. How a point's value is made of its runs' is in each field's type (Said, Setting, Measured), and
    TEXT, SETTINGS and MEASURED below are read from it."""

    # a run's
    run: str
    seed: int
    status: str
    error: str
    dir: str
    link: str | None
    within_noise: Number
    # a point's
    point: str
    axes: dict[str, Any]
    seeds: int
    runs: str
    timing: Timing | None
    images_per_s_noise: Number
    loads: dict[str, Load]
    # both
    load: Load
    other_cpu: Number
    strategy: Said
    device: Said
    device_name: Said
    precision: Said
    backend: Said
    memory_label: Said
    gap_basis: Said
    torch: Said
    straggler: Said
    slowest: Said
    world_size: Setting
    nodes: Setting
    local_batch: Setting
    global_batch: Setting
    accumulate: Setting
    train_images: Setting
    test_images: Setting
    epochs: Measured
    final_test_acc: Measured
    best_test_acc: Measured
    final_train_acc: Measured
    train_eval_acc: Measured
    acc_gap: Measured
    final_test_loss: Measured
    min_test_loss: Measured
    min_test_loss_epoch: Measured
    total_s: Measured
    train_s: Measured
    eval_s: Measured
    epoch_s: Measured
    images_per_s: Measured
    cores_busy: Measured
    peak_mib: Measured
    data_share: Measured
    forward_backward_share: Measured
    optimizer_share: Measured
    comm_wait_share: Measured
    straggler_share: Measured
    allreduce_share: Measured
    probe_comm_ms: Measured
    ddp_exposed_ms: Measured
    ddp_comm_ms: Measured
    straggler_ms: Measured
    epochs_std: Number
    final_test_acc_std: Number
    best_test_acc_std: Number
    final_train_acc_std: Number
    train_eval_acc_std: Number
    acc_gap_std: Number
    final_test_loss_std: Number
    min_test_loss_std: Number
    min_test_loss_epoch_std: Number
    total_s_std: Number
    train_s_std: Number
    eval_s_std: Number
    epoch_s_std: Number
    images_per_s_std: Number
    cores_busy_std: Number
    peak_mib_std: Number
    data_share_std: Number
    forward_backward_share_std: Number
    optimizer_share_std: Number
    comm_wait_share_std: Number
    straggler_share_std: Number
    allreduce_share_std: Number
    probe_comm_ms_std: Number
    ddp_exposed_ms_std: Number
    ddp_comm_ms_std: Number
    straggler_ms_std: Number
    # added by `scale` (against a baseline) and by the sections
    speedup: Number
    ideal: Number
    efficiency: Number
    baseline: str | int | float | None  # the baseline row's value of the column compare names rows by
    is_baseline: bool
    overfit: Overfit | None
    acc_noise: Number
    cut_from: str  # a baseline cut to a point's epochs: the point it was cut from
    section: str  # in the CSV files: the section a run or point is in


def _made(how: Made) -> tuple[str, ...]:
    return tuple(
        k for k, t in get_type_hints(Row, include_extras=True).items() if how in getattr(t, "__metadata__", ())
    )


TEXT, SETTINGS, MEASURED = _made(SAID), _made(SETTING), _made(MEASURED_FIGURE)  # in Row's order: the CSV's columns


def figure(row: Row, name: str) -> Any:
    """A figure by a name held in a variable (a column, a MEASURED name, its _std); None where absent."""
    return cast(dict[str, Any], row).get(name)


def setting(row: Row, name: str) -> int | None:
    """A row's Setting as the number it is: None where absent, or "mixed" over a point's runs."""
    value = figure(row, name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def judged(row: Row) -> Overfit:
    """The overfitting judgement of a row the caller knows was judged (its section's rows with a curve)."""
    found = row.get("overfit")
    if found is None:
        raise ValueError(f"{row.get('point')}: no curve was judged for overfitting")
    return found


@dataclass(frozen=True)
class Gap:
    """Where a scaling point's training epoch loses to the ideal one (`scaling_gap`)."""

    epoch_s: float
    ideal_epoch_s: float
    parts: dict[str, float | None]  # seconds an epoch over the ideal's, by cause; None where not measured
    biggest: str  # the part that loses the most
    why: str  # what that part usually means


@dataclass
class Curve:
    """One line of the model's and the points measured on it (x, y)."""

    label: str
    x: list[float]
    predicted: list[float]
    measured: list[tuple[float, float]] = field(default_factory=list)
    ideal: list[float] | None = None


@dataclass
class Curves:
    source: str  # the point the model planned from
    workers: list[Curve]  # speedup against workers, one per baseline
    batch: list[Curve]  # training epoch time against the local batch, one per worker count


@dataclass(frozen=True)
class PairPrediction:
    speedup: float
    band: Band | None  # how far the model has been off on checked cases of this kind (multi-worker targets)
    link_ms: float | None  # the all-reduce of the gradients over the link, a step


@dataclass(frozen=True)
class Comparison:
    """Point `at` against point `base_at`, its baseline (`row`, `base`: their figures; `base` may be the baseline
    cut to the point's epochs): the speed ratio and the accuracy difference, each with its verdict, and for a
    scaling pair its ideal, the model's prediction and where it falls short of the ideal."""

    point: str
    baseline: str
    row: Row
    base: Row
    at: int
    base_at: int
    equal_epochs: bool  # `base` is the baseline cut to the point's epochs
    changed: str | None  # the axis that differs, for pairs along an axis
    scaling: bool
    speedup: float | None  # training throughput over the baseline's; None: not timed
    ideal: float | None  # what perfect scaling would give (scaling pairs)
    predicted: PairPrediction | None  # the scaling model's, over the sweep's measured link
    gap: Gap | None  # where the epoch loses to the ideal (scaling pairs short of it)
    efficiency: float | None  # speedup over ideal
    timing_verdict: Verdict
    acc_diff: float | None
    acc_verdict: Verdict
    superlinear: bool


@dataclass
class Section:
    title: str
    kind: str  # run | scaling | overfitting | regularization | compare | all
    source: str  # the sweep folder, or "runs given on their own"
    runs: list[Run]
    question: str = ""
    note: str = ""
    baseline_runs: set[str] = field(default_factory=set)
    not_measured: list[tuple[str, str]] = field(default_factory=list)  # (point, why)
    adapted: list[str] = field(
        default_factory=list
    )  # what the sweep changed for this machine, and why (spec.Adaptation)
    adapted_points: list[str] = field(default_factory=list)  # the points it changed
    points: list[Point] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    curves: list[list[dict[str, Any]]] = field(default_factory=list)
    pairs: list[Comparison] = field(default_factory=list)
    problems: list[Row] = field(default_factory=list)  # run rows of runs that did not finish
    link: MeasuredLinks | None = (
        None  # the sweep's measured links (links.json): scaling pairs get the model's prediction
    )
    model_curves: Curves | None = None  # the model's curves beside the measured scaling points
    missing_baseline: list[str] = field(default_factory=list)  # the baseline's runs, where none finished
    skipped: list[str] = field(
        default_factory=list
    )  # files of its sweep the report could not use, said in its findings

    def cpus(self) -> int | None:
        """The CPUs of the machine its runs trained on (env.json), when they all say the same."""
        found = {r.env.get("cpus") for p in self.points for r in p.runs}
        return found.pop() if len(found) == 1 and None not in found else None

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")[:40] or "section"

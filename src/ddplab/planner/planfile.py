"""plan.json, declared once: what `ddplab plan RUN` predicted, as planner/command.py writes it and `read_plan` reads
it back checked.

The TypedDicts below are both the writer's static types and the reader's schema (io/borders.declared), as
summary.json's are: a field added to the file is added here, with its kind, or mypy refuses the writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypedDict, cast

from ddplab.io.borders import COUNT, LIST, SCALAR, SECONDS, TABLE, TEXT, WHOLE, Each, declared, list_of, number, one_of
from ddplab.rundir import runfiles

RATE = number(0)  # images/s, a speedup, an efficiency


class MeasuredStep(TypedDict):
    """The run a plan was made from: what its step's costs were derived from."""

    world_size: Annotated[int, COUNT]
    per_node: Annotated[int, COUNT]  # a node of several (on CUDA): its rows across nodes of as many are planned from it
    nodes: Annotated[int, COUNT]
    local_batch: Annotated[int, COUNT]
    device: Annotated[str, TEXT]
    epochs_timed: Annotated[int, COUNT]
    steps: Annotated[int, COUNT]
    step_s: Annotated[float, SECONDS]
    comm_wait_s_per_step: Annotated[float, SECONDS]
    spread_from: Annotated[dict[str, str], TABLE, Each(TEXT)]  # STRAGGLER's spreads: "gpu", "node" -> where from


class PlanRow(TypedDict):
    """One shape and batch predicted (model.Prediction), why it beats its ideal where it does, and its band."""

    per_node: Annotated[int, COUNT]
    nodes: Annotated[int, COUNT]
    local_batch: Annotated[int, COUNT]
    link: Annotated[str, TEXT]
    step_s: Annotated[float, SECONDS]
    compute_s: Annotated[float, SECONDS]
    exposed_comm_s: Annotated[float, SECONDS]
    comm_s: Annotated[float, SECONDS]
    epoch_train_s: Annotated[float, SECONDS]
    images_per_s: Annotated[float, RATE]
    speedup: Annotated[float, RATE]
    ideal: Annotated[float, RATE]
    efficiency: Annotated[float, RATE]
    workers: Annotated[int, COUNT]
    above_ideal: Annotated[str | None, TEXT | None]
    images_per_s_band: Annotated[list[float] | None, LIST | None]  # [low, high]; null: the run itself, or no band
    band: Annotated[str | None, TEXT | None]  # its band's name in `bands`; null: the run itself (one worker)


class PaysFromRow(TypedDict):
    """For one shape, the smallest local batch reaching each efficiency bar: `batch_for_<bar>pct`, null for never."""

    per_node: Annotated[int, COUNT]
    nodes: Annotated[int, COUNT]


class BandPart(TypedDict):
    """A band (planner/band.Band): the central 90% of measured / predicted throughput over a cell's checked cases."""

    lo: Annotated[float, RATE]
    hi: Annotated[float, RATE]
    cases: Annotated[int, WHOLE]  # 0: no case covers the cell (no band; lo and hi 1)
    source: Annotated[str, TEXT]
    held: Annotated[int, WHOLE]  # validation: cases inside the band drawn without their own source
    held_of: Annotated[int, WHOLE]
    sources: Annotated[int, WHOLE]
    marks: Annotated[list[str], list_of(one_of("few", "wide"))]  # how a weak band is marked (planner/band.py)


class Overlapped(TypedDict):
    """A CPU row across nodes as it would run where hosts share no cores (the wire's wait under backward)."""

    per_node: Annotated[int, COUNT]
    nodes: Annotated[int, COUNT]
    local_batch: Annotated[int, COUNT]
    images_per_s: Annotated[float, RATE]


class _Plan(TypedDict):
    run: Annotated[str, TEXT]  # the run folder planned from
    measured: MeasuredStep
    costs: Annotated[dict[str, Any], TABLE, Each(SCALAR | None)]  # model.StepCosts, less `measured`
    link: Annotated[dict[str, Any], TABLE]  # the link within a node (planner/links: published, or measured here)
    inter_node: Annotated[dict[str, Any] | None, TABLE | None]  # between nodes; null: one node
    rows: Annotated[list[PlanRow], LIST, Each(PlanRow)]
    pays_from: Annotated[list[PaysFromRow], LIST, Each(PaysFromRow)]
    bands: Annotated[dict[str, BandPart], TABLE, Each(BandPart)]  # the rows' bands by name (a, b, ...)


class PlanFile(_Plan, total=False):
    """plan.json."""

    images_per_s_if_the_wire_overlaps: Annotated[list[Overlapped], LIST, Each(Overlapped)]  # CPU rows across nodes


PLAN_FILE = declared(PlanFile)


def read_plan(path: Path) -> PlanFile:
    """A plan.json read back, every field of its kind (a DataError naming the file and the field otherwise)."""
    return cast(PlanFile, PLAN_FILE.check(runfiles.read_json(path, path.parent), str(path)))

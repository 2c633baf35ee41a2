"""What `ddplab plan`'s model says about a section's scaling points, beside what they measured.

The model (planner/model.py) plans from one measured run: each scaling pair is predicted
from the first finished run of its baseline point, over the sweep's measured link
(links.json, which a local sweep with multi-worker points measures before its report).
Without a link, or from a baseline the model cannot plan from (no time breakdown,
DataParallel), nothing is predicted and the report claims nothing. Torch-free.
"""

from __future__ import annotations

from typing import Any

from ddplab.errors import DataError
from ddplab.planner import model
from ddplab.planner.band import band_for
from ddplab.report.figures import train_epoch_s
from ddplab.report.records import Curve, Curves, PairPrediction, Row, setting
from ddplab.report.runs import Point, groups_without
from ddplab.topology import devices_brought

CURVE_FIELDS = ("dist.nproc", "dist.nnodes", "dist.strategy", "train.batch_size")  # what a curve's points may differ in
CURVE_WORKERS = (1, 2, 4, 8)  # the model's speedup curve reaches at least this far, and twice the most measured


def plan_costs(point: Point) -> model.StepCosts | None:
    """The model's step costs from a point's first finished run, or None where it cannot plan from it."""
    runs = [r for r in point.runs if r.finished]
    if not runs:
        return None
    summary = runs[0].summary
    assert summary is not None  # a finished run's
    try:
        return model.step_costs(summary, runs[0].history, runs[0].config, runs[0].steps)
    except (DataError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def layout_of(row: Row) -> tuple[int, int] | None:
    """(workers per node, nodes) of a row, or None when it is not one shape."""
    workers, nodes = setting(row, "world_size"), setting(row, "nodes") or 1
    if workers is None or setting(row, "local_batch") is None:
        return None
    return workers // nodes, nodes


def predict_pair(section: Any, i: int, j: int) -> PairPrediction | None:
    """Point i predicted from point j, or None where the model cannot plan it."""
    row, costs = section.rows[i], plan_costs(section.points[j])
    where = layout_of(row)
    if section.link is None or costs is None or where is None:
        return None
    base_shape, base = layout_of(section.rows[j]), section.rows[j]
    if base_shape is None:
        return None
    p = model.predict_one(costs.for_config(section.points[i].config), *where, row["local_batch"], section.link)
    # the baseline as the model has it (its own measured run: predicted back as it ran), at its own local batch
    speedup = p.images_per_s / model.predict_one(costs, *base_shape, base["local_batch"], section.link).images_per_s
    if p.workers <= 1:
        return PairPrediction(speedup, None, None)
    other_batch = row["local_batch"] != costs.measured_batch
    band = band_for(costs.on_cuda, where[1], other_batch and costs.on_cuda, per_node=where[0])
    return PairPrediction(speedup, band, 1000 * p.comm_s)


def model_curves(section: Any) -> Curves | None:
    """The model's curves beside the section's scaling points, each baseline's speedup against workers and,
    where the points span local batches, the training epoch against the local batch, planned from the
    first baseline (the one with the smallest local batch) and drawn through the points of its recipe (the
    same config but for the workers and the batch size)."""
    pairs = [c for c in section.pairs if c.scaling and c.predicted is not None]
    if not pairs:
        return None
    bases = sorted({c.base_at for c in pairs}, key=lambda j: section.rows[j]["local_batch"])
    workers = []
    for j in bases:
        costs, base = plan_costs(section.points[j]), section.rows[j]
        mine = [c for c in pairs if c.base_at == j]
        first = layout_of(mine[0].row)
        assert costs is not None and first is not None  # predict_pair predicted these pairs from them
        nodes = first[1]
        most = max(c.row["world_size"] for c in mine)
        xs = sorted(
            {w for w in (*CURVE_WORKERS, 2 * most) if w % nodes == 0} | {c.row["world_size"] for c in mine} | {1}
        )
        target = costs.for_config(section.points[mine[0].at].config)
        predicted = [
            model.predict_one(
                target, w // nodes if w > 1 else 1, nodes if w > 1 else 1, base["local_batch"], section.link
            ).speedup
            for w in xs
        ]
        ideal = [float(devices_brought(w, nodes if w > 1 else 1, on_cuda=costs.on_cuda)) for w in xs]
        workers.append(
            Curve(
                f"from {base['point']}",
                xs,
                predicted,
                [(c.row["world_size"], c.speedup) for c in mine if c.speedup is not None],
                ideal,
            )
        )
    batch = []
    recipe = next(g for g in groups_without(section.points, CURVE_FIELDS) if bases[0] in g)
    epochs = {k: e for k in recipe if layout_of(section.rows[k]) is not None and (e := train_epoch_s(section.rows[k]))}
    members = list(epochs)
    batches = sorted({section.rows[k]["local_batch"] for k in members})
    if len(batches) > 1:
        costs = plan_costs(section.points[bases[0]])
        assert costs is not None  # the first baseline's pairs were predicted from it
        xs = sorted({*batches, *(b for b in (2**k for k in range(14)) if batches[0] <= b <= batches[-1])})
        shapes = {s for k in members if (s := layout_of(section.rows[k])) is not None}
        for where in sorted(shapes):
            mine = [k for k in members if layout_of(section.rows[k]) == where]
            target = costs.for_config(section.points[mine[0]].config)
            batch.append(
                Curve(
                    f"{where[0] * where[1]} worker{'s' * (where[0] * where[1] > 1)}"
                    + (f" on {where[1]} nodes" if where[1] > 1 else ""),
                    xs,
                    [model.predict_one(target, *where, b, section.link).epoch_train_s for b in xs],
                    [(section.rows[k]["local_batch"], epochs[k]) for k in mine],
                )
            )
    return Curves(section.rows[bases[0]]["point"], workers, batch)

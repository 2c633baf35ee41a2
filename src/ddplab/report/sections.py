"""A report is sections: one per question a sweep asks ([[sections]]), one per sweep that asks none,
one for the runs given on their own. Nothing is compared across sections.

Each section holds its points (runs grouped over seeds, labelled by what varies inside it),
their rows, mean curves and overfitting analysis, and its comparisons: which point is set
against which, with the speed and accuracy verdicts of `report.noise`. A section with a
declared baseline compares every point with the baseline point closest to it (fewest axes
apart); one without (a plain sweep, loose runs) compares multi-worker points with the
1-worker point of the same config, and points one axis apart with that axis's first value.
"""

from __future__ import annotations

import re
from typing import Any

from ddplab.config import SCHEDULES_OVER_THE_RUN
from ddplab.planner.links import read_links
from ddplab.report import figures, noise, predictions
from ddplab.report.kinds import kind_of
from ddplab.report.records import Comparison, Row, Section, Verdict, setting
from ddplab.report.runs import (
    Point,
    axis_text,
    experiment_config,
    first_epochs,
    group_points,
    groups_without,
)
from ddplab.rundir.runread import Run, displayable
from ddplab.sweepdir.folder import SweepFolder
from ddplab.sweepdir.spec import point_text

SCALING_FIELDS = ("dist.nproc", "dist.nnodes", "dist.strategy")  # what a scaling comparison varies
GAP_BELOW = 0.9  # a scaling point below this efficiency gets its epoch taken apart against the ideal


def build_sections(runs: list[Run], run_rows: dict[str, Row]) -> list[Section]:
    """Sections in the order their runs were given, each analysed."""
    sections: list[Section] = []
    sweeps = list(dict.fromkeys(r.sweep.dir for r in runs if r.sweep is not None))
    for sweep_dir in sweeps:
        members = [r for r in runs if r.sweep is not None and r.sweep.dir == sweep_dir]
        sections += sweep_sections(members)
    loose = [r for r in runs if r.sweep is None]
    if loose:
        sections.append(Section(title="Runs", kind="all", source="runs given on their own", runs=loose))
    for section in sections:
        analyse(section, run_rows)
    return sections


def missing_baseline(section: Section, pairs: str) -> list[str]:
    """The declared baseline's runs, where none of them finished: nothing can be compared against it, and
    the answer must say so rather than give the other points' figures as if they were the comparison."""
    if not section.baseline_runs or pairs != "baseline":
        return []
    finished = {r.name for r in section.runs if r.finished}
    return [] if section.baseline_runs & finished else sorted(section.baseline_runs)


def sweep_sections(runs: list[Run]) -> list[Section]:
    sweep = runs[0].sweep
    assert sweep is not None  # build_sections passes the runs of one sweep
    by_name = {r.name.rsplit("/", 1)[-1]: r for r in runs}  # report names may carry the parent folder
    specs = sweep.sections or [{"title": sweep.description or sweep.name, "kind": "all", "runs": list(by_name)}]
    out = []
    skipped: list[str] = []
    link = read_links(SweepFolder(sweep.dir).links, skipped)
    for spec in specs:
        members = [by_name[n] for n in spec.get("runs", []) if n in by_name]
        not_measured = [(str(m.get("point")), str(m.get("reason"))) for m in spec.get("not_measured", [])]
        for run in members:
            if run.status == "skipped":
                not_measured.append((point_label(run), run.error or "not run"))
        out.append(
            Section(
                title=str(spec.get("title") or sweep.name),
                kind=str(spec.get("kind") or "all"),
                source=displayable(str(sweep.dir)),
                runs=[r for r in members if r.status != "skipped"],
                question=str(spec.get("question") or ""),
                note=str(spec.get("note") or ""),
                baseline_runs={by_name[n].name for n in spec.get("baseline_runs", []) if n in by_name},
                not_measured=list(dict.fromkeys(not_measured)),
                link=link,
                adapted=[str(a) for a in spec.get("adapted") or []],
                adapted_points=[str(a) for a in spec.get("adapted_points") or []],
                skipped=skipped,
            )
        )
    return out


def point_label(run: Run) -> str:
    return ", ".join(axis_text(a, a.rsplit(".", 1)[-1], v) for a, v in run.point.items()) or run.name


def analyse(section: Section, run_rows: dict[str, Row]) -> None:
    section.points = group_points(section.runs)
    section.rows = figures.point_rows(section.points, run_rows)
    section.curves = [figures.mean_curve([r.history for r in p.runs]) for p in section.points]
    for row, curve in zip(section.rows, section.curves, strict=True):
        row["overfit"] = figures.overfitting(curve)
        row["acc_noise"] = noise.accuracy_noise(row)[0]
    section.problems = [run_rows[r.name] for r in section.runs if not r.finished]
    kind = kind_of(section)
    section.missing_baseline = missing_baseline(section, kind.pairs)
    if kind.pairs == "own":
        section.pairs = []  # these answer from each point's own figures
    elif section.baseline_runs and kind.pairs == "baseline":
        section.pairs = declared_pairs(section)
    else:
        section.pairs = scaling_pairs(section) + axis_pairs(section)
    section.model_curves = predictions.model_curves(section)


# ---- who is compared with whom ---------------------------------------------------------------
def declared_pairs(section: Section) -> list[Comparison]:
    """Every point against the baseline point nearest to it (the fewest config fields apart, then axes)."""
    base_idx = [i for i, p in enumerate(section.points) if any(r.name in section.baseline_runs for r in p.runs)]
    for i in base_idx:
        section.rows[i]["is_baseline"] = True
    out = []
    for i, point in enumerate(section.points):
        if i in base_idx or not base_idx:
            continue
        j = min(
            base_idx,
            key=lambda b: (
                len(differing(experiment_config(section.points[b].config), experiment_config(point.config))),
                sum(section.points[b].axes.get(a) != v for a, v in point.axes.items()),
            ),
        )
        out.append(pair(section, i, j, scaling=kind_of(section).speedups, base_row=equal_epochs(section, i, j)))
    return out


def equal_epochs(section: Section, i: int, j: int) -> Row | None:
    """Baseline point j cut to point i's epochs, when i was sized down for this machine (spec.Adaptation: a point
    that asks for fewer epochs on its own compares them as they are) and j's first epochs are what a run of i's
    length would have trained: the same seeds, and a schedule not planned over the run. None: compare the
    points as they are."""
    point, base = section.points[i], section.points[j]
    epochs = section.rows[i].get("epochs")
    names = {point_text(v) for r in point.runs for v in r.point.values()}  # as the sweep names its points
    if (
        not names & set(section.adapted_points)
        or not isinstance(epochs, (int, float))
        or not epochs
        or epochs != int(epochs)
        or not all(r.finished for r in point.runs + base.runs)
        or not all(
            r.summary is not None and r.summary["run"].get("epochs_planned") == len(r.history) for r in point.runs
        )  # not stopped early
        or min(len(r.history) for r in base.runs) <= epochs
        or {r.seed for r in point.runs} != {r.seed for r in base.runs}
        or base.config.get("optim.schedule", SCHEDULES_OVER_THE_RUN[0]) in SCHEDULES_OVER_THE_RUN
    ):
        return None
    cut = [first_epochs(r, int(epochs)) for r in base.runs]
    label = f"{base.label}, its first {int(epochs)} epochs"
    row = figures.point_rows(
        [Point(label, cut, base.config, base.axes)], {r.name: figures.run_row(r, label) for r in cut}
    )[0]
    row["acc_noise"] = noise.accuracy_noise(row)[0]
    row["cut_from"] = base.label
    return row


def scaling_pairs(section: Section) -> list[Comparison]:
    """Multi-worker points against the 1-worker point of the same config (dist.* aside)."""
    out = []
    for members in groups_without(section.points, ("dist.",)):
        base = figures.fewest_workers([section.rows[i] for i in members])
        if base is None or base["world_size"] != 1:
            continue
        j = next(i for i in members if section.rows[i] is base)
        base["is_baseline"] = True
        out += [
            pair(section, i, j, scaling=True)
            for i in members
            if i != j and (setting(section.rows[i], "world_size") or 0) > 1
        ]
    return out


def axis_pairs(section: Section) -> list[Comparison]:
    """Points one axis (or one config field) apart, at the same world size, each against the first
    value of that axis; a difference in the number of workers is left to the scaling pairs."""
    out, done = [], set()
    configs = [p.config for p in section.points]
    for i, base in enumerate(section.points):
        for j in range(i + 1, len(section.points)):
            fields = differing(configs[i], configs[j]) if configs[i] and configs[j] else []
            axes = differing(base.axes, section.points[j].axes)
            if section.rows[i].get("world_size") != section.rows[j].get("world_size"):
                continue
            changed = fields[0] if len(fields) == 1 else axes[0] if len(axes) == 1 else None
            if changed is None or changed in SCALING_FIELDS or j in done:
                continue
            done.add(j)
            out.append(pair(section, j, i, scaling=False, changed=changed))
    return out


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]


def pair(
    section: Section, i: int, j: int, scaling: bool, changed: str | None = None, base_row: Row | None = None
) -> Comparison:
    """Point i against point j (or `base_row`, j at i's epochs): speed ratio (training throughput) and
    accuracy difference, each with its verdict."""
    row, base = section.rows[i], base_row or section.rows[j]
    ratio = figures.speedup(row, base)
    ideal = figures.ideal_speedup(row, base) if scaling else None
    loads = {**row["loads"], **base["loads"]}
    acc_diff = figures.difference(row.get("final_test_acc"), base.get("final_test_acc"))
    timing = (
        noise.timing_verdict(ratio, row["timing"], base["timing"], loads) if ratio is not None else Verdict("not timed")
    )
    predicted = predictions.predict_pair(section, i, j) if scaling else None
    return Comparison(
        point=row["point"],
        baseline=base["point"],
        row=row,
        base=base,
        at=i,
        base_at=j,
        equal_epochs=base_row is not None,
        changed=changed,
        scaling=scaling,
        speedup=ratio,
        ideal=ideal,
        predicted=predicted,
        gap=(
            figures.scaling_gap(row, base, ideal)
            if scaling and ratio is not None and ideal and ratio / ideal < GAP_BELOW
            else None
        ),
        efficiency=ratio / ideal if ratio is not None and ideal else None,
        timing_verdict=timing,
        acc_diff=acc_diff,
        acc_verdict=noise.accuracy_verdict(acc_diff, row, base) if acc_diff is not None else Verdict("-"),
        superlinear=bool(
            scaling
            and ratio is not None
            and ideal
            and ratio / ideal > 1
            and timing.word in ("beyond noise", "single run")
        ),
    )


# ---- what a section's runs share ------------------------------------------------------------------
def setup_text(section: Section) -> str:
    """One line of what every point of the section shares: model, data, recipe, machine, software."""
    runs = [r for p in section.points for r in p.runs]
    if not runs:
        return ""

    def same(get) -> Any:
        values = {repr(get(r)): get(r) for r in runs}
        return next(iter(values.values())) if len(values) == 1 else None

    s = lambda r: r.summary  # noqa: E731
    parts = []
    model, params, flops = (
        same(lambda r: s(r)["run"].get("model")),
        same(lambda r: s(r)["model"]["params"]),
        same(lambda r: s(r)["model"]["flops_per_image"]),
    )
    if model:
        parts.append(
            f"{model}" + (f" ({params:,} parameters, {flops / 1e6:,.1f} MFLOP/image)" if params and flops else "")
        )
    data = same(lambda r: (s(r)["run"].get("dataset"), s(r)["data"]["train_images"], s(r)["data"]["eval_images"]))
    if data and data[0]:
        parts.append(f"{data[0]}: {data[1]:,} training / {data[2]:,} test images")
    epochs = same(lambda r: s(r)["run"].get("epochs_planned"))
    if epochs:
        parts.append(f"{epochs} epoch{'s' * (epochs != 1)}")
    optim = same(lambda r: (s(r)["run"].get("optimizer"), s(r)["run"].get("lr"), s(r)["run"].get("schedule")))
    if optim and optim[0]:
        parts.append(f"{optim[0]} lr {point_text(optim[1])} (schedule {optim[2]})")
    machine = same(
        lambda r: (
            re.sub(r" \(\d+ threads?\)$", "", r.env.get("device_name") or s(r)["run"].get("device")),
            r.env.get("cpus") if not s(r)["run"].get("device", "").startswith("cuda") else None,
            r.env.get("torch"),
        )
    )
    if machine and machine[0]:
        parts.append(
            f"on {machine[0]}"
            + (f" ({machine[1]} CPUs)" if machine[1] else "")
            + (f", torch {machine[2]}" if machine[2] else "")
        )
    if graphs := graphs_text(section):
        parts.append(graphs)
    parts += [f"adapted to this machine: {a}" for a in section.adapted]
    return "; ".join(parts)


def graphs_text(section: Section) -> str:
    """Which points replayed their step as one CUDA graph (train.cuda_graphs, as each run decided it), where any
    did: points that differ in it differ in more than the setting they were swept over."""
    engine = {p.label: [(r.summary.get("engine") or {}) for r in p.runs if r.summary] for p in section.points}
    captured = [label for label, runs in engine.items() if runs and all(e.get("cuda_graphs") for e in runs)]
    if not captured:
        return ""
    if len(captured) == len(engine):
        return "every step replayed as one CUDA graph"
    eager = {label: next((e.get("cuda_graphs_said") for e in runs if not e.get("cuda_graphs")), None)
             for label, runs in engine.items() if label not in captured}  # fmt: skip
    why = "; ".join(f"{label}: {said or 'off'}" for label, said in eager.items())
    return (
        f"the step replayed as one CUDA graph in {', '.join(captured)} only ({why}): part of a difference in "
        "time between them is the capture"
    )


def architecture(section: Section) -> str | None:
    layers = {r.summary["model"].get("layers") for p in section.points for r in p.runs if r.summary}
    return layers.pop() if len(layers) == 1 and None not in layers else None
